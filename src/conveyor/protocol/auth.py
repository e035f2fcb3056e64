"""Mutual authentication by a shared token: an HMAC challenge in both directions.

The server greets every connection with a hello carrying a fresh nonce when it has a token. The
client answers with its own nonce and an HMAC of both nonces; the server checks it and answers with
an HMAC of its own, so the client knows the server has the token too before it trusts what the
server sends (task payloads may be pickles). The token itself never crosses the wire. A server
listens without a token only on loopback (`is_loopback`) unless told it may.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import socket
from pathlib import Path
from typing import Any

from conveyor.constants import AUTH_CLIENT_LABEL, AUTH_NONCE_BYTES, AUTH_SERVER_LABEL, ERR_BUSY, PROTOCOL_VERSION
from conveyor.errors import AuthError, ConveyorError, ProtocolError, ServerBusyError


def as_key(token: str | bytes | None) -> bytes | None:
    """The token as HMAC key bytes; an empty token counts as none."""
    if token is None or token in ("", b""):
        return None
    if isinstance(token, str):
        return token.encode()
    if isinstance(token, bytes):
        return token
    raise TypeError(f"token must be str or bytes, not {type(token).__name__}")


def load_token(path: str | Path) -> str:
    """A token from a file (a mounted secret, say): its first non-blank line, stripped.

    An error names the file, never its content.
    """
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # -sig: a byte-order mark is not part of the token
    except OSError as e:
        raise ConveyorError(f"cannot read the token file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:  # its message would quote a byte of the secret
        raise ConveyorError(f"cannot read the token file {path}: it is not UTF-8 text") from None
    token = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not token:
        raise ConveyorError(f"the token file {path} is empty")
    return token


def new_nonce() -> bytes:
    return secrets.token_bytes(AUTH_NONCE_BYTES)


def proof(key: bytes, label: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(key, label + server_nonce + client_nonce, hashlib.sha256).digest()


def hello(key: bytes | None, nonce: bytes, limits: list[int], idle_s: float) -> dict[str, Any]:
    """The server's greeting (request id 0): what it accepts in a request, and its idle timeout.

    The server's greeting (request id 0): what it accepts in a request (`Limits.as_list`), and after
    how long it closes a connection that sends nothing.
    """
    return {
        "op": "hello",
        "id": 0,
        "version": PROTOCOL_VERSION,
        "auth": key is not None,
        "nonce": nonce,
        "limits": limits,
        "idle_s": idle_s,
    }


def refusal(message: str) -> dict[str, Any]:
    """The greeting of a server that takes no more connections: the client may try again later."""
    return {"op": "hello", "id": 0, "version": PROTOCOL_VERSION, "error": ERR_BUSY, "message": message}


def auth_request(greeting: dict[str, Any], key: bytes | None, address: str, rid: int) -> tuple[dict[str, Any], bytes] | None:
    """Check a server's hello; returns the auth request to send and the client nonce, or None when none is due."""
    if greeting.get("op") != "hello" or greeting.get("version") != PROTOCOL_VERSION:
        raise ProtocolError(
            f"{address} did not greet as a Conveyor server of protocol version {PROTOCOL_VERSION} (got {greeting!r:.120})"
        )
    if greeting.get("error") == ERR_BUSY:
        raise ServerBusyError(f"{address} refused the connection: {greeting.get('message', '')}")
    if not greeting.get("auth"):
        if key is not None:
            raise AuthError(
                f"{address} does not require a token, so it cannot prove it knows yours; "
                "connect without a token, or give the server the token"
            )
        return None
    if key is None:
        raise AuthError(f"{address} requires a token: pass token=... (or --token / CONVEYOR_TOKEN)")
    nonce = greeting.get("nonce")
    if type(nonce) is not bytes or len(nonce) != AUTH_NONCE_BYTES:
        raise ProtocolError(f"{address} sent a malformed auth challenge")
    mine = new_nonce()
    return {"op": "auth", "id": rid, "nonce": mine, "proof": proof(key, AUTH_CLIENT_LABEL, nonce, mine)}, mine


def client_proved(key: bytes, server_nonce: bytes, request: dict[str, Any]) -> bool:
    """Whether a client's auth request proves it knows the token (compared in constant time)."""
    theirs, got = request.get("nonce"), request.get("proof")
    if type(theirs) is not bytes or len(theirs) != AUTH_NONCE_BYTES or type(got) is not bytes:
        return False
    return hmac.compare_digest(got, proof(key, AUTH_CLIENT_LABEL, server_nonce, theirs))


def check_server_proof(reply: dict[str, Any], key: bytes, server_nonce: bytes, client_nonce: bytes, address: str) -> None:
    """Verify the server's answer to our auth request: it took the token, and proves it holds it too."""
    if "error" in reply:
        said = str(reply.get("message"))[:200]
        raise AuthError(
            f"{address} refused the token ({said}): check that the token given (token=..., --token, "
            "--token-file or CONVEYOR_TOKEN) is this server's"
        )
    got = reply.get("proof")
    want = proof(key, AUTH_SERVER_LABEL, server_nonce, client_nonce)
    if type(got) is not bytes or not hmac.compare_digest(got, want):
        raise AuthError(f"{address} accepted the token but could not prove it knows it: not the server you meant")


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback address: for an address this process binds or connects to.

    It resolves names, so never for a name a peer sent (a Host header, say).
    """
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
