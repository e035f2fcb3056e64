"""Tokens: mutual HMAC authentication, and refusing to listen openly on a non-loopback address."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conveyor.client.queue_client import QueueClient
from conveyor.errors import AuthError, ConveyorError
from conveyor.protocol.auth import is_loopback
from conveyor.server.queue_server import QueueServer

from .servers import RawConnection, frame, thread_server


def test_right_token_is_accepted_as_text_or_bytes() -> None:
    with thread_server(token="s3cret") as s:
        with QueueClient(s.address, token="s3cret") as c:
            assert c.ping()["pong"]
        with QueueClient(s.address, token=b"s3cret") as c:
            assert c.ping()["pong"]


def test_wrong_token_is_refused() -> None:
    with thread_server(token="s3cret") as s:
        with pytest.raises(AuthError, match="wrong token"):
            QueueClient(s.address, token="guess").ping()
        with pytest.raises(AuthError, match="wrong token"):
            QueueClient(s.address, token=b"guess").connect()


def test_no_token_is_refused_even_on_loopback() -> None:
    with thread_server(host="127.0.0.1", token="s3cret") as s:
        with pytest.raises(AuthError, match="requires a token"):
            QueueClient(s.address).ping()
        # a raw peer skipping authentication gets an error and the door
        raw = RawConnection(s.address)
        assert raw.hello["auth"] is True and len(raw.hello["nonce"]) == 32
        raw.send(frame({"op": "stats", "id": 1}))
        reply = raw.read()
        assert reply["error"] == "auth" and "authenticate before anything else" in reply["message"]
        assert raw.closed_by_server()
        raw.close()


def test_a_forged_proof_is_refused() -> None:
    with thread_server(token="s3cret") as s:
        raw = RawConnection(s.address)
        raw.send(frame({"op": "auth", "id": 1, "nonce": b"n" * 32, "proof": b"p" * 32}))
        assert raw.read()["error"] == "auth"
        assert raw.closed_by_server()
        raw.close()


def test_a_token_against_an_open_server_is_refused_by_the_client() -> None:
    """The server could not prove it knows the token: the client will not trust it."""
    with thread_server() as s, pytest.raises(AuthError, match="does not require a token"):
        QueueClient(s.address, token="s3cret").ping()


def test_refuses_a_non_loopback_bind_without_a_token() -> None:
    with pytest.raises(ConveyorError, match=r"refusing to listen on 0\.0\.0\.0 without a token"):
        QueueServer("0.0.0.0", 0)
    QueueServer("0.0.0.0", 0, token="t")  # with a token: allowed
    QueueServer("0.0.0.0", 0, insecure=True)  # explicitly insecure: allowed
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")


def test_serve_command_refuses_a_non_loopback_bind_without_a_token() -> None:
    r = subprocess.run([sys.executable, "-m", "conveyor", "serve", "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert r.returncode != 0 and "refusing to listen on 0.0.0.0 without a token" in r.stderr


def test_insecure_non_loopback_server_serves() -> None:
    with thread_server(host="0.0.0.0", insecure=True) as s:
        port = s.server.port
        with QueueClient(f"tcp://127.0.0.1:{port}") as c:
            assert c.ping()["pong"]
