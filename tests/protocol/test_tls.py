"""TLS between clients and servers: certificates, pinning, CAs, client certificates, token files.

Also a relay on the path that alters a byte (detected with TLS; stored unnoticed without it).
"""

from __future__ import annotations

import logging
import pickle
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool
from conveyor.client.queue_client import QueueClient
from conveyor.errors import AuthError, ConnectionLostError, ConveyorError
from conveyor.message import Message
from conveyor.protocol.auth import load_token
from conveyor.protocol.tls import ClientTLS, cert_fingerprint, normal_fingerprint, self_signed, server_context
from conveyor.server.queue_server import QueueServer

from ..support.relay import relay
from ..support.servers import thread_server

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, str]]:
    """A server certificate for 127.0.0.1, another one (a stranger's), and a client's."""
    base = tmp_path_factory.mktemp("certs")
    return {
        name: self_signed(base / name, hosts)
        for name, hosts in (("server", ["127.0.0.1", "localhost"]), ("other", ["127.0.0.1"]), ("client", ["worker-1"]))
    }


def test_a_self_signed_certificate_its_key_and_fingerprint(certs: dict[str, tuple[Path, Path, str]]) -> None:
    cert, key, fp = certs["server"]
    assert cert.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600  # the key is for this user only
    assert fp == cert_fingerprint(cert) and len(fp) == 64
    assert fp != certs["other"][2]
    colons = ":".join(fp[i : i + 2] for i in range(0, 64, 2)).upper()  # as `openssl x509 -fingerprint` prints it
    assert normal_fingerprint(colons) == fp
    with pytest.raises(ValueError, match="64 hex digits"):
        normal_fingerprint("abc")
    with pytest.raises(ConveyorError, match="cannot load the TLS certificate"):
        server_context(cert, cert)  # a certificate is no key
    with pytest.raises(ValueError, match="needs both cert= and key="):
        ClientTLS.make(cert=cert)
    with pytest.raises(ValueError, match="tls=False with the TLS address"):
        QueueClient("tls://127.0.0.1:7070", tls=False)
    secret = ClientTLS.make(fingerprint=fp, cert=cert, key=key)
    assert secret is not None and b"PRIVATE" in (secret.key or b"") and "PRIVATE" not in repr(secret)


def test_a_pinned_server_serves_over_tls(certs: dict[str, tuple[Path, Path, str]]) -> None:
    cert, key, fp = certs["server"]
    with thread_server(tls=server_context(cert, key), token="s3cret") as s:
        assert s.address.startswith("tls://127.0.0.1:")
        pool = QueuePool.connect([s.address], "s3cret", fingerprint=fp)
        with pool:
            [mid] = pool.put("q", [Message(payload=b"pay 100 EUR to alice")])
            [m] = pool.queues.get("q", 1)
            assert m.id == mid and m.payload == b"pay 100 EUR to alice"
            pool.queues.ack("q", [mid])
        # a client crosses to a Spark executor pickled: it keeps what it trusts, and connects there
        again = pickle.loads(pickle.dumps(pool))
        with again:
            assert again.stats("q")["q"].acked == 1


def test_a_wrong_fingerprint_is_refused_at_once(certs: dict[str, tuple[Path, Path, str]]) -> None:
    cert, key, _ = certs["server"]
    with thread_server(tls=server_context(cert, key)) as s:
        started = time.monotonic()
        with pytest.raises(AuthError, match="is not the one pinned"):
            QueueClient(s.address, tls=ClientTLS.make(fingerprint=certs["other"][2]), connect_timeout=20).ping()
        assert time.monotonic() - started < 5, "a refused certificate is not retried until the connect timeout"


def test_a_server_is_checked_against_a_ca(certs: dict[str, tuple[Path, Path, str]]) -> None:
    cert, key, _ = certs["server"]
    with thread_server(tls=server_context(cert, key)) as s:
        with QueueClient(s.address, tls=ClientTLS.make(ca=cert)) as c:  # its own certificate is its CA
            assert c.ping()["pong"]
        started = time.monotonic()
        with pytest.raises(AuthError, match=r"certificate was refused \(self-signed certificate\)"):
            QueueClient(s.address, tls=ClientTLS.make(ca=certs["other"][0]), connect_timeout=20).ping()
        assert time.monotonic() - started < 5
        # a plain-TCP client gets a clear error, not a hang
        with pytest.raises(ConveyorError, match="TLS"):
            QueueClient(s.address.replace("tls://", "tcp://"), connect_timeout=2, timeout=5).ping()


def test_a_server_with_a_ca_requires_a_client_certificate(certs: dict[str, tuple[Path, Path, str]]) -> None:
    cert, key, fp = certs["server"]
    client_cert, client_key, _ = certs["client"]
    with thread_server(tls=server_context(cert, key, ca=client_cert)) as s:
        with QueueClient(s.address, fingerprint=fp, cert=client_cert, key=client_key) as c:
            assert c.ping()["pong"]
        with pytest.raises(ConveyorError, match=r"client certificate|refused this client"):
            QueueClient(s.address, fingerprint=fp, connect_timeout=2, timeout=5).ping()
        stranger = certs["other"]
        with pytest.raises(ConveyorError, match=r"client certificate|refused this client"):
            QueueClient(s.address, fingerprint=fp, cert=stranger[0], key=stranger[1], connect_timeout=2, timeout=5).ping()


PAYLOAD = b"pay 100 EUR to alice" * 3000  # 60 kB: the flipped byte falls inside it


def test_a_relay_that_alters_a_byte_is_detected_with_tls(certs: dict[str, tuple[Path, Path, str]]) -> None:
    cert, key, fp = certs["server"]
    with thread_server(tls=server_context(cert, key), token="s3cret") as s, relay(s.address, 30_000) as r:
        client = QueueClient(f"tls://127.0.0.1:{r.port}", "s3cret", tls=ClientTLS.make(fingerprint=fp), timeout=10)
        with pytest.raises(ConnectionLostError, match=r"altered|integrity check"):
            client.put("q", [Message(payload=PAYLOAD)])
        assert r.flipped
        with QueueClient(s.address, "s3cret", tls=ClientTLS.make(fingerprint=fp)) as direct:
            stored = {q.name: q for q in direct.queues()}
            assert "q" not in stored or direct.stats("q")["q"].ready == 0, "nothing altered is stored"


def test_without_tls_the_same_relay_alters_what_is_stored() -> None:
    """Why TLS is needed off loopback: the token's handshake alone does not protect what follows."""
    with thread_server(token="s3cret") as s, relay(s.address, 30_000) as r:
        with QueueClient(f"tcp://127.0.0.1:{r.port}", "s3cret") as c:
            c.put("q", [Message(payload=PAYLOAD)])
        assert r.flipped
        with QueueClient(s.address, "s3cret") as direct:
            [m] = direct.get("q", 1)
            assert m.payload != PAYLOAD and len(m.payload) == len(PAYLOAD)


def test_a_non_loopback_bind_without_tls_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="conveyor.server"):
        QueueServer("0.0.0.0", 0, token="t")
    assert "can be read and altered" in caplog.text and "--tls-cert" in caplog.text


def test_a_token_file(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("s3cret\n")
    f.chmod(0o600)
    assert load_token(f) == "s3cret"  # a trailing newline (echo ... > file) is not part of it
    f.write_text("\n")
    with pytest.raises(ConveyorError, match="is empty"):
        load_token(f)
    with pytest.raises(ConveyorError, match="cannot read the token file"):
        load_token(tmp_path / "missing")
    f.write_bytes(b"\xef\xbb\xbf\n  s3cret  \nignored\n")  # a byte-order mark, a blank line first
    assert load_token(f) == "s3cret"
    f.write_bytes(b"s3cr\xffet\n")
    with pytest.raises(ConveyorError, match="not UTF-8 text") as e:
        load_token(f)
    assert "s3cr" not in str(e.value)


def test_serve_with_a_token_file_and_tls_never_prints_the_token(tmp_path: Path, certs: dict[str, tuple[Path, Path, str]]) -> None:
    cert, key, fp = certs["server"]
    token = tmp_path / "token"
    token.write_text("t0ps3cret-token\n")
    token.chmod(0o600)
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        cmd = [
            sys.executable,
            "-m",
            "conveyor",
            "serve",
            "--port",
            "0",
            "--token-file",
            str(token),
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
        ]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "listening on" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        text = log.read_text()
        address = text.split("listening on ")[1].split()[0]
        assert address.startswith("tls://127.0.0.1:") and fp in text  # the fingerprint to pin is printed
        with QueueClient(address, "t0ps3cret-token", tls=ClientTLS.make(fingerprint=fp)) as c:
            assert c.ping()["pong"]
        with pytest.raises(AuthError) as e:
            QueueClient(address, "wrong-token", tls=ClientTLS.make(fingerprint=fp)).ping()
        assert "t0ps3cret" not in str(e.value) and "wrong-token" not in str(e.value)
    finally:
        proc.terminate()
        proc.wait(30)
    assert "t0ps3cret" not in log.read_text()


def test_local_servers_off_loopback_get_a_token_and_tls_by_default() -> None:
    """Bound to every interface, `QueuePool.local` secures itself: a generated token and a pinned certificate."""
    with QueuePool.local(n_servers=2, host="0.0.0.0") as pool:
        assert all(a.startswith("tls://") and "0.0.0.0" not in a for a in pool.addresses)
        assert all(c.tls is not None and len(c.tls.fingerprints) == 1 for c in pool.queues.clients)
        pool.put("q", [Message(payload=b"x")])
        copy = pickle.loads(pickle.dumps(pool))  # what a Spark executor gets: token and fingerprint included
        with copy:
            assert copy.stats("q")["q"].ready == 1
        for a in pool.addresses:  # without the token: refused
            with pytest.raises(AuthError, match="requires a token"):
                QueueClient(a, tls=pool.queues.clients[0].tls).ping()
    with QueuePool.local(n_servers=1, tls=True) as pool:  # loopback: TLS only when asked
        assert pool.addresses[0].startswith("tls://127.0.0.1:") and pool.queues.clients[0]._key is None
        assert pool.stats() == {}


def test_local_servers_keep_no_key_on_disk_and_ignore_a_token_file_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stray = tmp_path / "someone-elses-token"
    stray.write_text("not the pool's\n")
    monkeypatch.setenv("CONVEYOR_TOKEN_FILE", str(stray))  # e.g. a pod's, for servers of its own
    with QueuePool.local(n_servers=1, host="0.0.0.0", temp_dir=tmp_path) as pool:
        assert pool.stats() == {}  # the pool's generated token, not the file's
        assert not list(tmp_path.glob("conveyor-tls-*")), "the certificate's key is removed once the servers listen"
    with QueuePool.local(n_servers=1) as pool:  # loopback, no token: none from the environment either
        assert pool.stats() == {}


def test_the_commands_connect_over_tls_with_a_token_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("cli-s3cret\n")
    with QueuePool.local(n_servers=1, tls=True, token="cli-s3cret") as pool:
        pool.put("pages", [Message(payload=b"x")])
        fp = pool.queues.clients[0].tls.fingerprints[0] if pool.queues.clients[0].tls else ""
        base = [sys.executable, "-m", "conveyor", "stats", "--connect", pool.addresses[0], "--token-file", str(token)]
        ok = subprocess.run([*base, "--tls-fingerprint", fp], capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0 and "pages" in ok.stdout and "UP" in ok.stdout, ok.stdout + ok.stderr
        wrong = subprocess.run([*base, "--tls-fingerprint", "0" * 64], capture_output=True, text=True, timeout=60)
        assert wrong.returncode != 0 and "is not the one pinned" in wrong.stdout + wrong.stderr
        assert "cli-s3cret" not in ok.stdout + ok.stderr + wrong.stdout + wrong.stderr
