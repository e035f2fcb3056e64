"""Guessing a token is slow: failed checks are throttled per source address across connections.

Throttled at the queue protocol's handshake, the metrics endpoint and the dashboard (login, session
cookie, Bearer header), without slowing a client that knows the token; and the throttle's own rules
(backoff, forgetting, a bounded memory, what counts as one source).
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading
import time
import tracemalloc
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from conveyor.client.pool import QueuePool
from conveyor.client.queue_client import QueueClient
from conveyor.constants import AUTH_CLIENT_LABEL, THROTTLE_BURST, THROTTLE_MAX_SOURCES, THROTTLE_PACE_S
from conveyor.dashboard import Dashboard
from conveyor.dashboard.web import SESSION_COOKIE, session_of
from conveyor.protocol import throttle as throttle_module
from conveyor.protocol.auth import proof
from conveyor.protocol.throttle import Rule, Throttle, source_of

from ..support.servers import RawConnection, frame, thread_server, wait_for

pytestmark = pytest.mark.timeout(180)
TOKEN = "s3cret"
GUESSERS = 32  # connections guessing at once, each waiting for its answer
WINDOW_S = 4.0  # how long their guesses are counted
CEILING_PER_S = 1 / THROTTLE_PACE_S  # 10 a second, after a burst
ENTER_S = 2.0  # a client with the right token gets in within this (at once but for a busy machine)


class Sockets:
    """The guessers' open sockets, shut down when the guessing ends.

    No guesser waits out its answer (late by design) or starts another.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: set[socket.socket] = set()
        self.ended = False

    def add(self, sock: socket.socket) -> None:
        with self.lock:
            if self.ended:
                raise ConnectionAbortedError("the guessing ended")
            self.open.add(sock)

    def discard(self, sock: socket.socket) -> None:
        with self.lock:
            self.open.discard(sock)

    def end(self) -> None:
        with self.lock:
            self.ended = True
            for sock in self.open:
                sock.shutdown(socket.SHUT_RDWR)


@dataclass
class Ways:
    """The ways a token is checked in one process, taken in turn.

    `guesses[k](token)` tries a token on a connection of its own (True: let in); `enters[k]()` is a
    client with the right token.
    """

    guesses: list[Callable[[str], bool]]
    enters: list[Callable[[], bool]]


def send_auth(raw: RawConnection, token: str) -> None:
    """The queue protocol's auth request, proving `token`."""
    mine = b"n" * 32
    proved = proof(token.encode(), AUTH_CLIENT_LABEL, raw.hello["nonce"], mine)
    raw.send(frame({"op": "auth", "id": 1, "nonce": mine, "proof": proved}))


def protocol_guess(address: str, token: str, sockets: Sockets) -> bool:
    """The queue protocol's handshake with this token, on a connection of its own."""
    raw = RawConnection(address, timeout=60)
    try:
        sockets.add(raw.sock)
        send_auth(raw, token)
        return "error" not in raw.read()
    finally:
        sockets.discard(raw.sock)
        raw.close()


def protocol_enter(address: str) -> bool:
    with QueueClient(address, token=TOKEN, connect_timeout=30, timeout=30) as c:
        return bool(c.ping()["pong"])


def http_request(
    port: int, method: str, path: str, headers: dict[str, str], body: str | None = None, sockets: Sockets | None = None
) -> tuple[int, str]:
    """(status, Location) of one request to 127.0.0.1:port, on a connection of its own."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.connect()
        assert conn.sock is not None
        if sockets is not None:
            sockets.add(conn.sock)
        conn.request(method, path, body=body, headers=headers)
        reply = conn.getresponse()
        reply.read()
        return reply.status, reply.getheader("Location") or ""
    finally:
        if sockets is not None and conn.sock is not None:
            sockets.discard(conn.sock)
        conn.close()


def login(port: int, token: str, sockets: Sockets | None = None) -> bool:
    body = urllib.parse.urlencode({"token": token})
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    code, location = http_request(port, "POST", "/login", form, body, sockets)
    return code == 303 and location == "/"


def bearer(port: int, path: str, token: str, sockets: Sockets | None = None) -> bool:
    return http_request(port, "GET", path, {"Authorization": f"Bearer {token}"}, None, sockets)[0] == 200


def cookie(port: int, token: str, sockets: Sockets | None = None) -> bool:
    headers = {"Cookie": f"{SESSION_COOKIE}={session_of(token)}"}
    return http_request(port, "GET", "/api/overview", headers, None, sockets)[0] == 200


@contextmanager
def ways_in(name: str, sockets: Sockets) -> Iterator[Ways]:
    """Every way a token is checked in one process.

    Guessers taking them in turn show any way not throttled, or throttled apart from the others, in
    their count.
    """
    with thread_server(token=TOKEN, metrics_port=0) as s:
        address, metrics = s.address, urllib.parse.urlsplit(s.server.metrics_address)
        scrape_port, scrape = metrics.port, metrics.path
        assert scrape_port is not None
        if name == "queue server":  # the protocol's handshake and the metrics endpoint
            yield Ways(
                [lambda t: protocol_guess(address, t, sockets), lambda t: bearer(scrape_port, scrape, t, sockets)],
                [lambda: protocol_enter(address), lambda: bearer(scrape_port, scrape, TOKEN)],
            )
            return
        with QueuePool.connect([address], token=TOKEN) as pool, Dashboard(pool, port=0, token=TOKEN) as board:
            port, api = board.port, "/api/overview"
            yield Ways(
                [lambda t: login(port, t, sockets), lambda t: bearer(port, api, t, sockets), lambda t: cookie(port, t, sockets)],
                [lambda: login(port, TOKEN), lambda: bearer(port, api, TOKEN), lambda: cookie(port, TOKEN)],
            )


@pytest.mark.parametrize("name", ["queue server", "dashboard"])
def test_guessing_from_32_connections_is_slow_and_the_right_token_still_gets_in(name: str) -> None:
    answered: list[float] = []  # when each wrong guess was answered
    errors: list[BaseException] = []
    stop, sockets = threading.Event(), Sockets()
    with ways_in(name, sockets) as ways:

        def guesser(n: int) -> None:
            for i in range(10**6):
                try:
                    let_in = ways.guesses[n % len(ways.guesses)](f"guess-{n}-{i}")
                except Exception as e:  # once stopped, what waits is shut
                    errors.extend([] if stop.is_set() else [e])
                    return
                if stop.is_set():
                    return
                answered.append(time.monotonic())
                assert not let_in

        threads = [threading.Thread(target=guesser, args=(n,), daemon=True) for n in range(GUESSERS)]
        started = time.monotonic()
        for t in threads:
            t.start()
        stop.wait(WINDOW_S)  # the guessing measured: WINDOW_S of it
        guessed = sum(1 for a in list(answered) if a - started <= WINDOW_S)
        took = []
        for i in range(3):  # the right token, from the same address, while the guessing goes on
            t0 = time.monotonic()
            assert ways.enters[i % len(ways.enters)]()
            took.append(time.monotonic() - t0)
        stop.set()
        sockets.end()
        for t in threads:
            t.join(60)  # each guesser's socket is shut: it ends at once
    assert not errors, errors
    rate, ms = guessed / WINDOW_S, [round(t * 1000) for t in took]
    print(f"{name}: {rate:.1f} guesses/s from {GUESSERS} connections; right token in {ms} ms")
    assert 0 < guessed <= THROTTLE_BURST + CEILING_PER_S * WINDOW_S, f"{guessed} guesses answered in {WINDOW_S} s"
    assert max(took) < ENTER_S, f"the right token took {took} s to get in"


def test_a_guesser_that_does_not_wait_for_answers_learns_no_faster() -> None:
    """Checks themselves are rationed, so a guesser that does not wait for answers learns no faster.

    Without waiting for its answers, a guesser might take a missing prompt success for a failure: so
    checks themselves are rationed. Its 21st try, the right token, is checked in its turn, after the
    10 beyond the burst, at one per pace.
    """
    with thread_server(token=TOKEN) as s:
        started = time.monotonic()
        waiting = []
        for i in range(20):
            raw = RawConnection(s.address, timeout=60)
            send_auth(raw, f"guess-{i}")
            waiting.append(raw)  # its answer not read: it may come late
        assert protocol_enter(s.address)
        took = time.monotonic() - started
        for raw in waiting:
            raw.close()
    assert took >= 0.8 * (20 - THROTTLE_BURST) * THROTTLE_PACE_S, f"the 21st try was checked {took:.2f} s after the first"


def test_a_guess_whose_client_leaves_holds_nothing_on_the_server_and_still_counts() -> None:
    """A guess whose client leaves holds nothing on the server, and still counts.

    Answers held back would otherwise hold the connections of a guesser that closes each at once:
    the last of 50 is due 50 failures x 2 paces = 10 s after the first.
    """
    with thread_server(token=TOKEN) as s:
        for i in range(50):
            raw = RawConnection(s.address, timeout=60)
            send_auth(raw, f"guess-{i}")
            raw.close()  # before its answer
        wait_for(lambda: not s.call(lambda: len(s.server._conns)), timeout=5, what="the guessers' connections closed")
        assert s.call(lambda: len(s.server._throttle)) == 1  # their address's failures counted


def test_the_pace_backs_off_and_a_quiet_source_is_forgotten() -> None:
    rule = Rule(pace_s=0.01, max_pace_s=0.04, burst=2, backoff_every=3, forget_s=0.3)

    async def run() -> tuple[list[float], int, int]:
        throttle = Throttle(rule)
        waited = []
        for _ in range(12):  # one after the other, each waiting for its answer
            t0 = time.monotonic()
            assert not await throttle.check("10.0.0.1", lambda: False)
            waited.append(time.monotonic() - t0)
        remembered = len(throttle)
        await asyncio.sleep(rule.forget_s)  # the forgetting measured: nothing failed for forget_s
        assert not await throttle.check("10.0.0.2", lambda: False)
        return waited, remembered, len(throttle)

    waited, remembered, after = asyncio.run(run())
    paces = [0.01] * 3 + [0.02] * 3 + [0.04] * 6  # doubling every 3 failures, up to max_pace_s
    assert all(w >= 2 * p * 0.9 for w, p in zip(waited, paces, strict=True)), waited  # each answer two paces late
    assert remembered == 1 and after == 1  # 10.0.0.1 forgotten, 10.0.0.2 remembered


def test_a_right_token_drains_nothing_and_waits_only_its_turn() -> None:
    rule = Rule(pace_s=0.05, max_pace_s=0.05, burst=2, forget_s=1.0)

    async def run() -> tuple[float, float]:
        throttle = Throttle(rule)
        t0 = time.monotonic()
        assert all([await throttle.check("10.0.0.1", lambda: True) for _ in range(100)])
        many_rights = time.monotonic() - t0
        guesses = [asyncio.ensure_future(throttle.check("10.0.0.1", lambda: False)) for _ in range(6)]
        await asyncio.sleep(0)  # the guesses are checked, or queued, first
        t0 = time.monotonic()
        assert await throttle.check("10.0.0.1", lambda: True)
        behind = time.monotonic() - t0
        assert not any(await asyncio.gather(*guesses))
        return many_rights, behind

    many_rights, behind = asyncio.run(run())
    assert many_rights < 0.5  # 100 rights, no budget spent
    assert behind >= 0.9 * 4 * rule.pace_s  # behind the 4 guesses beyond the burst, one per pace


def test_the_throttle_remembers_a_bounded_number_of_sources() -> None:
    rule = Rule(max_sources=1000)  # THROTTLE_MAX_SOURCES's rule at a tenth of the size: as bounded, ten times quicker

    async def run() -> tuple[int, int]:
        throttle = Throttle(rule)
        tracemalloc.start()
        n = rule.max_sources + 200
        await asyncio.gather(*(throttle.check(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}", lambda: False) for i in range(n)))
        allocated_there = tracemalloc.Filter(True, throttle_module.__file__)  # what the throttle holds, not the test
        held = sum(t.size for t in tracemalloc.take_snapshot().filter_traces([allocated_there]).traces)
        tracemalloc.stop()
        return len(throttle), held

    remembered, held = asyncio.run(run())
    each = held / remembered
    print(f"{remembered} sources remembered, {each:.0f} bytes each: {THROTTLE_MAX_SOURCES * each / 1e6:.1f} MB at the most")
    assert remembered == rule.max_sources
    assert held / remembered < 500  # a few hundred bytes a source


def test_one_source_is_an_ipv4_address_or_an_ipv6_64() -> None:
    assert source_of("10.1.2.3") == "10.1.2.3"
    assert source_of("::ffff:10.1.2.3") == "10.1.2.3"
    assert source_of("2001:db8:1:2::5") == source_of("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert source_of("2001:db8:1:3::5") != source_of("2001:db8:1:2::5")
    assert source_of("fe80::1%eth0") == "fe80::/64"
    assert source_of(None) == "?"
    with pytest.raises(ValueError, match="must not forget a source before its budget is full"):
        Rule(forget_s=1.0)
