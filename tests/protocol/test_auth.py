"""Tokens: mutual HMAC authentication, and refusing to listen openly on a non-loopback address."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.client.queue_client import QueueClient
from conveyor.errors import AuthError, ConveyorError
from conveyor.protocol.auth import is_loopback
from conveyor.server.processes import start_server, stop_server
from conveyor.server.queue_server import QueueServer
from conveyor.server.runtime import reachable_addresses

from ..support.servers import RawConnection, frame, thread_server


def test_right_token_is_accepted_as_text_or_bytes() -> None:
    with thread_server(token="s3cret") as s:
        with QueueClient(s.address, token="s3cret") as c:
            assert c.ping()["pong"]
        with QueueClient(s.address, token=b"s3cret") as c:
            assert c.ping()["pong"]


def test_wrong_token_is_refused_naming_the_server_and_what_to_check() -> None:
    with thread_server(token="s3cret") as s:
        with pytest.raises(AuthError, match="wrong token") as e:
            QueueClient(s.address, token="guess").ping()
        assert s.address in str(e.value) and "--token-file" in str(e.value), e.value
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
    r = subprocess.run(
        [sys.executable, "-m", "conveyor", "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert r.returncode != 0 and "refusing to listen on 0.0.0.0 without a token" in r.stderr


def test_insecure_non_loopback_server_serves() -> None:
    with thread_server(host="0.0.0.0", insecure=True) as s:
        port = s.server.port
        with QueueClient(f"tcp://127.0.0.1:{port}") as c:
            assert c.ping()["pong"]


def test_every_address_a_server_on_all_ipv6_interfaces_lists_answers() -> None:
    """`--host ::` binds IPv6 only (asyncio sets IPV6_V6ONLY): the addresses it prints are IPv6 ones, each reachable."""
    if not socket.has_ipv6 or not Path("/proc/net/if_inet6").exists():
        pytest.fail("this test needs IPv6 (Linux's /proc/net/if_inet6)")
    proc = start_server(None, host="::", args=["--insecure"], stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the server did not say where it listens within 30 s"
        said = os.read(proc.stdout.fileno(), 65536).decode()  # one write: every line at once
        addresses = [
            a.strip()
            for line in said.splitlines()
            for prefix in ("listening on ", "also reachable at ")
            if line.startswith(prefix)
            for a in line[len(prefix) :].split(",")
        ]
        assert addresses and all(a.startswith("tcp://[") for a in addresses), said
        assert addresses[-1].startswith("tcp://[::1]:")  # loopback last
        for a in addresses:
            with QueueClient(a, connect_timeout=5) as c:
                assert c.ping()["pong"]
    finally:
        stop_server(proc)
        proc.stdout.close()


def test_only_global_and_loopback_ipv6_addresses_are_listed(tmp_path: Path) -> None:
    table = tmp_path / "if_inet6"
    table.write_text(
        "fe8000000000000000fc00fffe000001 04 40 20 80     eth0\n"  # link-local: needs an interface named
        "00000000000000000000000000000001 01 80 10 80       lo\n"
        "20010db8000000000000000000000005 05 40 00 00     eth1\n"
        "fd000000000000000000000000000002 04 40 00 82     eth0\n"
    )
    assert reachable_addresses("tcp://[::]:7070", "::", 7070, str(table)) == [
        "tcp://[2001:db8::5]:7070",
        "tcp://[fd00::2]:7070",
        "tcp://[::1]:7070",
    ]
    assert reachable_addresses("tcp://[::]:7070", "::", 7070, str(tmp_path / "none")) == ["tcp://[::]:7070"]
    assert reachable_addresses("tcp://10.0.0.1:7070", "10.0.0.1", 7070) == ["tcp://10.0.0.1:7070"]
