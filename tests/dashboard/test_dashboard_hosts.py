"""The dashboard answers only the Host names it was told (no DNS rebinding).

Loopback names, the address it serves on and --allow-host ones, compared as written, nothing
resolved; other spellings of a loopback address and names that would resolve to it get 421.

The rule is `conveyor.dashboard.hosts`, checked through the running dashboard.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from conveyor.client.pool import QueuePool
from conveyor.dashboard import Dashboard
from conveyor.errors import ConveyorError

from ..support.servers import thread_server

pytestmark = pytest.mark.timeout(120)
TOKEN = "s3cret"
# names a resolver may take to 127.0.0.1, and other spellings of it: none was told, so none is answered
REBOUND = [
    "localhost.localdomain",
    "127.1",
    "0x7f000001",
    "2130706433",
    "127.0.0.01",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "evil.example",
    "localhost.",
    "127.0.0.1.nip.io",
]
REBOUND.append(socket.gethostname().lower())  # this machine's name: often resolved to 127.0.1.1 (/etc/hosts)
LOOPBACK = ["127.0.0.1", "localhost", "[::1]", "LocalHost"]


@contextmanager
def pool_of_one(token: str | None = None) -> Iterator[QueuePool]:
    with thread_server(token=token) as s, QueuePool.connect([s.address], token=token) as pool:
        yield pool


def status(port: int, host: str | None, headers: dict[str, str] | None = None, target: str = "/api/overview") -> tuple[int, str]:
    """GET `target` from the dashboard on 127.0.0.1:port with this Host header (None: none)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("GET", target, skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    finally:
        conn.close()


def test_only_the_names_it_was_told_are_answered() -> None:
    with pool_of_one() as pool, Dashboard(pool, port=0, allow_hosts=["board.test", "localhost:9000"]) as board:
        port = board.port
        for name in REBOUND:
            for host in (name, f"{name}:{port}"):
                code, text = status(port, host)
                assert code == 421 and "--allow-host" in text, host
        for name in [*LOOPBACK, "board.test"]:
            for host in (name, f"{name}:{port}"):
                assert status(port, host)[0] == 200, host
        assert status(port, "localhost:9000")[0] == 200  # NAME:PORT: that pair (a tunnel's port, say)
        for host in ("localhost:1", "board.test:9000", "localhost:9000:1", ""):
            assert status(port, host)[0] == 421, host
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:  # HTTP/1.0 may send no Host: not told
            raw.sendall(b"GET /api/overview HTTP/1.0\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.0 421 ")
        assert status(port, "evil.example", {"X-Forwarded-Host": "localhost", "Forwarded": "host=localhost"})[0] == 421
        # a target in absolute form names a host too: each name must be one told
        assert status(port, "localhost", target=f"http://evil.example:{port}/api/overview")[0] == 421
        assert status(port, "localhost", target=f"http://localhost:{port}/api/overview")[0] == 200


def test_a_browser_sent_to_a_rebound_name_gets_nothing() -> None:
    """Real DNS rebinding, as Chromium sees it: names its resolver maps to 127.0.0.1."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no chromium on this machine: .ci/run installs it (apt-get install chromium)")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    mine = socket.gethostname().lower()
    rules = f"MAP evil.test 127.0.0.1, MAP board.test 127.0.0.1, MAP {mine} 127.0.0.1"  # a rebinding attacker's DNS
    with pool_of_one() as pool, Dashboard(pool, port=0, allow_hosts=["board.test"]) as board, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", f"--host-resolver-rules={rules}"])
        try:
            page = browser.new_page()
            for name in ("evil.test", mine):
                reply = page.goto(f"http://{name}:{board.port}/api/overview")
                assert reply is not None and reply.status == 421, name
            reply = page.goto(f"http://board.test:{board.port}/")
            assert reply is not None and reply.status == 200 and page.title()
        finally:
            browser.close()


def test_the_host_check_resolves_no_name(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[Any] = []
    resolve = socket.getaddrinfo

    def watched(host: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(host)
        return resolve(host, *args, **kwargs)

    with pool_of_one() as pool, Dashboard(pool, port=0) as board:
        monkeypatch.setattr(socket, "getaddrinfo", watched)
        for name in ("localhost.localdomain", "127.1", "evil.example"):
            assert status(board.port, name)[0] == 421
        monkeypatch.undo()
    assert not {"localhost.localdomain", "127.1", "evil.example"} & set(asked), asked


def test_with_a_token_the_host_is_checked_too() -> None:
    """A page of another site cannot know the token, but could still guess it through a rebound name."""
    with pool_of_one(TOKEN) as pool, Dashboard(pool, "0.0.0.0", 0, token=TOKEN, insecure=True) as board:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert status(board.port, f"evil.example:{board.port}", bearer)[0] == 421
        assert status(board.port, f"127.0.0.1:{board.port}", bearer)[0] == 200
        assert status(board.port, f"0.0.0.0:{board.port}", bearer)[0] == 200  # the address it serves on: its own url
        assert status(board.port, "board.test", bearer)[0] == 421


def test_an_allow_host_that_is_not_a_name_is_refused_with_what_to_give() -> None:
    with pool_of_one() as pool:
        for bad in ("http://board.test", "board.test/", "a b", "board.test:99999", "[not-v6]", ""):
            with pytest.raises(ConveyorError, match="give a name as the browser's address bar shows it"):
                Dashboard(pool, port=0, allow_hosts=[bad])
        board = Dashboard(pool, port=0, allow_hosts=["Board.Test", "::1", "[0:0::1]:9000"])  # written as browsers write it
        assert {"board.test", "[::1]"} <= board.hosts.names and board.hosts.pairs == {"[::1]:9000"}
        assert Dashboard(pool, port=0, allow_hosts="board.test").hosts.names >= {"board.test"}  # one name, not its letters


def test_conveyor_dashboard_allow_host() -> None:
    with thread_server() as s:
        command = [sys.executable, "-m", "conveyor", "dashboard", "--connect", s.address, "--port", "0"]
        bad = subprocess.run([*command, "--allow-host", "http://board.test"], capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "give a name as the browser's address bar shows it" in bad.stderr
        proc = subprocess.Popen(
            [*command, "--allow-host", "board.test", "--allow-host", "other.test"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline().split()[2].rstrip("/").rsplit(":", 1)[1])  # "dashboard on URL"
            assert status(port, f"board.test:{port}")[0] == 200
            assert status(port, "other.test")[0] == 200
            assert status(port, f"127.1:{port}")[0] == 421
        finally:
            proc.terminate()
            proc.wait(30)
            assert proc.stdout is not None
            proc.stdout.close()
