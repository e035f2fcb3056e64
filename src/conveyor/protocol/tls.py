"""TLS for the wire protocol: the frames after a TLS handshake are encrypted and integrity-protected.

The token's challenge (`conveyor.protocol.auth`) proves who is at each end when the connection is
made; TLS keeps anyone on the path from reading or changing what follows (a relay that flips a
byte makes the receiving end fail the connection: nothing altered is stored or run).

A server loads a certificate and key (`server_context`), and with a CA file requires clients to
present a certificate it signed. A client (`ClientTLS`) trusts a server's certificate by one of:
- a pinned fingerprint (SHA-256 of the certificate, as `conveyor serve` prints it): for
  self-signed certificates, such as those of the servers started beside a Spark driver;
- CA certificates (PEM data, carried with the client so that Spark executors need no file);
- the system's CAs (`tls=True`, or a `tls://` address).
`self_signed` makes a certificate and key with the `cryptography` library.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
import os
import socket
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from conveyor.errors import AuthError, ConnectionLostError, ConveyorError, ProtocolError

TLS_SCHEME, TCP_SCHEME = "tls://", "tcp://"
CERT_DAYS = 3650  # a self-signed certificate's validity: pinned by fingerprint, it is replaced, not renewed


def netloc(host: str, port: int) -> str:
    """host:port as an address writes it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def fingerprint(cert: bytes) -> str:
    """The SHA-256 fingerprint of a certificate (DER bytes, or PEM text as bytes), lowercase hex."""
    der = ssl.PEM_cert_to_DER_cert(cert.decode()) if cert.lstrip().startswith(b"-----BEGIN") else cert
    return hashlib.sha256(der).hexdigest()


def normal_fingerprint(fp: str) -> str:
    """A fingerprint as lowercase hex without separators (`AB:CD:...` as openssl prints it, is accepted)."""
    if not isinstance(fp, str):
        raise TypeError(f"a certificate fingerprint is a string of hex digits, not {type(fp).__name__}")
    out = fp.replace(":", "").strip().lower()
    if len(out) != 64 or any(c not in "0123456789abcdef" for c in out):
        raise ValueError(f"a certificate fingerprint is 64 hex digits (SHA-256), got {fp!r}")
    return out


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConveyorError(f"cannot read the {what} {path}: {e.strerror or e}") from None


@dataclass(frozen=True, slots=True)
class ClientTLS:
    """How a client checks the server's certificate (and, for servers that ask, proves itself).

    fingerprints: accepted SHA-256 fingerprints of the server's certificate; when given, they alone
        decide (no CA, no host name check): the certificate is pinned.
    cadata: PEM text of the CA certificates to trust; None: the system's.
    cert, key: PEM text of this client's certificate (chain) and key, for a server started with a CA.
    Plain data, so a client pickled to a Spark executor takes it along.
    """

    fingerprints: tuple[str, ...] = ()
    cadata: str | None = field(default=None, repr=False)
    cert: bytes | None = field(default=None, repr=False)
    key: bytes | None = field(default=None, repr=False)  # never in a repr (a log line, a traceback)

    @classmethod
    def make(
        cls,
        tls: bool | ClientTLS | None = None,
        *,
        ca: str | Path | None = None,
        fingerprint: str | Sequence[str] | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
    ) -> ClientTLS | None:
        """From the options of `QueuePool.connect`: None (plain TCP) unless one of them asks for TLS."""
        if isinstance(tls, ClientTLS):
            return tls
        if tls not in (None, True, False):
            raise TypeError(f"tls must be True, False, None or a ClientTLS, not {type(tls).__name__}")
        if tls is False and (ca or fingerprint or cert or key):
            raise ValueError("tls=False with a CA, fingerprint or client certificate: leave tls out to use them")
        if not (tls or ca or fingerprint or cert or key):
            return None
        if (cert is None) != (key is None):
            raise ValueError("a client certificate needs both cert= and key=")
        fps = () if fingerprint is None else (fingerprint,) if isinstance(fingerprint, str) else tuple(fingerprint)
        return cls(
            fingerprints=tuple(normal_fingerprint(f) for f in fps),
            cadata=None if ca is None else _read(ca, "CA file").decode(),
            cert=None if cert is None else _read(cert, "client certificate"),
            key=None if key is None else _read(key, "client key"),
        )

    def context(self) -> ssl.SSLContext:
        """The client's SSL context (made once per ClientTLS and process: it loads CAs and keys)."""
        return _context(self)

    def _make_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.fingerprints:  # pinned: the fingerprint is checked after the handshake (`check`)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.cadata is not None:
            ctx.load_verify_locations(cadata=self.cadata)
        else:
            ctx.load_default_certs()
        if self.cert is not None and self.key is not None:
            _load_chain(ctx, self.cert, self.key)
        return ctx

    def wrap(self, sock: socket.socket, host: str, address: str) -> ssl.SSLSocket:
        """The TLS handshake on a new connection to `address`.

        A refused certificate (AuthError) or a peer that does not speak TLS (ProtocolError) is not
        retried: trying again would not change it.
        """
        try:
            tls = self.context().wrap_socket(sock, server_hostname=host)
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError):  # the peer went away mid-handshake (restarting?): retried
            sock.close()
            raise
        except ssl.SSLCertVerificationError as e:
            sock.close()
            raise AuthError(
                f"{address}: its TLS certificate was refused ({e.verify_message or e}): trust the CA that "
                "signed it (ca=, --tls-ca) or pin it (fingerprint=, --tls-fingerprint)"
            ) from None
        except ssl.SSLError as e:
            sock.close()
            raise ProtocolError(
                f"{address}: the TLS handshake failed ({e.reason or e}): is it a TLS server "
                "(conveyor serve --tls-cert ...), and does it accept this client?"
            ) from None
        der = tls.getpeercert(binary_form=True)
        got = "" if der is None else fingerprint(der)
        if self.fingerprints and not any(hmac.compare_digest(got, f) for f in self.fingerprints):
            tls.close()
            raise AuthError(
                f"{address}: its TLS certificate (sha256 {got or 'none'}) is not the one pinned "
                f"({', '.join(self.fingerprints)}): not the server you meant, or one on the path"
            )
        return tls


def refused_after_handshake(e: ssl.SSLError, address: str) -> ConveyorError:
    """The ConveyorError for an SSL error while reading a server's greeting.

    An SSL error while reading a server's greeting: its alert refusing this client's certificate
    (TLS 1.3 says so only after the handshake), or a broken connection.
    """
    if "ALERT" in str(e.reason):
        return AuthError(
            f"{address}: the server refused this client's TLS certificate ({e.reason}): give cert= and "
            "key= of one a CA it trusts (its --tls-ca) signed"
        )
    return ConnectionLostError(f"{address}: TLS error ({e.reason or e})")


def connect_hint(error: BaseException | None, tls: bool) -> str:
    """What a failure to connect may mean, where TLS is the likely cause."""
    if isinstance(error, TimeoutError) and not tls:
        return " (no greeting came: if the server uses TLS, connect with a tls:// address or tls=...)"
    if isinstance(error, ConnectionLostError) and tls:  # closed after the TLS handshake
        return " (a server started with --tls-ca closes connections without a client certificate it accepts)"
    return ""


@lru_cache(maxsize=64)
def _context(tls: ClientTLS) -> ssl.SSLContext:
    return tls._make_context()


def _load_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """`load_cert_chain` from PEM data: it takes only files, so through a private temporary directory."""
    with tempfile.TemporaryDirectory(prefix="conveyor-tls-") as d:
        paths = [Path(d) / "cert.pem", Path(d) / "key.pem"]
        for p, data in zip(paths, (cert, key), strict=True):
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(paths[0], paths[1])


def server_context(cert: str | Path, key: str | Path, ca: str | Path | None = None) -> ssl.SSLContext:
    """A server's TLS context: its certificate and key; with `ca`, clients must show a certificate it signed."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if ca is not None:
            ctx.load_verify_locations(cafile=str(ca))
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as e:
        raise ConveyorError(
            f"cannot load the TLS certificate {cert} and key {key}{'' if ca is None else f' (or the CA file {ca})'}: {e}"
        ) from None
    return ctx


def cert_fingerprint(cert: str | Path) -> str:
    """The fingerprint of the (first) certificate in a PEM file: what clients pin."""
    return fingerprint(_read(cert, "TLS certificate"))


def self_signed(directory: str | Path, hosts: Sequence[str], days: int = CERT_DAYS) -> tuple[Path, Path, str]:
    """Write a new self-signed certificate for `hosts` and its key into `directory`.

    Write a new self-signed certificate for `hosts` (names or addresses) and its key (mode 0600)
    into `directory`; returns (cert path, key path, fingerprint).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (list(hosts) or ["conveyor"])[0][:64])])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = d / "conveyor-cert.pem", d / "conveyor-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: make it private
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path, fingerprint(cert.public_bytes(serialization.Encoding.DER))
