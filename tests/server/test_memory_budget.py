"""A server's memory budget under abuse.

A server's memory budget under abuse: clients that send most of a big request and stall, and
clients that ask for replies and never read them. Real `conveyor serve` processes, their memory read
from /proc; another client pings throughout. Figures and the margin: docs/server.md ("Memory").

The budget is `conveyor.server.budget`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack
import pytest

from conveyor.client.queue_client import QueueClient
from conveyor.constants import (
    CONNECTION_FREE_BYTES,
    DEFAULT_MEMORY_BUDGET_BYTES,
    ERR_BAD_ARGUMENT,
    ERR_PROTOCOL,
    FRAME_LENGTH,
    FRAME_PREFIX,
)
from conveyor.message import Message
from conveyor.protocol.framing import Limits, SocketReader
from conveyor.protocol.tls import ClientTLS, self_signed, server_context
from conveyor.server.processes import spawn_server, stop_server

from ..support.servers import RawConnection, frame, thread_server, wait_for

MiB = 1 << 20
# what a server holds beyond its budget under these attacks (docs/server.md): the stream buffer of each
# of its 5-6 connections (2 MiB and a read), their free allowances (1 MiB), a page copied on its way
# to a socket, and the allocator's slack; measured: 13 MiB (stalled requests), 33 MiB (unread replies)
MARGIN = 48 * MiB
# of its own allocations (RssAnon) above its baseline once its attackers are gone; measured: 0-5 MiB
# (13 MiB with a budget of 32 MiB: glibc keeps it in its heap, for the next requests; docs/server.md)
RETURNED = 24 * MiB
# the slowest ping another client may see throughout: a server stalled by its attackers would take seconds
# (until --request-timeout), while 2 cores shared with other work delay a quick answer by a few hundred ms
PING_S = 1.0
TCP_CLOSED = (7, 8)  # tcpi_state of a socket reset or half-closed by its peer: TCP_CLOSE, TCP_CLOSE_WAIT


def _report(what: str, baseline: int, own: int, watch: _Watch, pid: int) -> None:
    """The figures docs/server.md quotes (shown with `pytest -s`)."""
    print(
        f"\n{what}: RSS {baseline / MiB:.0f} MiB before, {watch.peak / MiB:.0f} MiB at most; its own (RssAnon) "
        f"{own / MiB:.0f} MiB before, {_rss(pid, 'RssAnon') / MiB:.0f} MiB after; slowest of {watch.pings} pings "
        f"{watch.slowest * 1000:.0f} ms"
    )


def _rss(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory, all of it or its own allocations.

    A process's resident memory: all of it (VmRSS), or its own allocations (RssAnon: without the
    pages of the files it maps, a durable store's segments, which are the system's cache).
    """
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(f"{field}:"))


@contextmanager
def _server(tmp_path: Path, *args: str, durable: bool = False) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    with open(tmp_path / "server.log", "wb") as log:
        proc, address = spawn_server(tmp_path / "data" if durable else None, args=args, stderr=log)
    try:
        yield proc, address
    finally:
        stop_server(proc)


class _Watch:
    """While open: another client's pings, one every 20 ms, and the server's peak memory."""

    def __init__(self, address: str, pid: int) -> None:
        self.address, self.pid = address, pid
        self.slowest = self.peak = 0.0
        self.pings = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._ping), threading.Thread(target=self._sample)]

    def _ping(self) -> None:
        with QueueClient(self.address, timeout=30) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                c.ping()
                self.slowest = max(self.slowest, time.perf_counter() - t0)
                self.pings += 1
                self._stop.wait(0.02)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss(self.pid))
            self._stop.wait(0.02)

    def __enter__(self) -> _Watch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


_OPENED: list[socket.socket] = []  # the attackers' sockets, closed after each test whatever its outcome


@pytest.fixture(autouse=True)
def _close_attackers() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def _connect(address: str) -> socket.socket:
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=30)
    _OPENED.append(s)
    return s


def _sockets(pid: int) -> int:
    """How many sockets a process has open (its listening one, and one per connection)."""
    fds = Path(f"/proc/{pid}/fd")
    return sum(1 for fd in fds.iterdir() if _link(fd).startswith("socket:"))


def _link(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except FileNotFoundError:  # closed meanwhile
        return ""


def _closed(sock: socket.socket) -> bool:
    """Whether the peer has closed the connection, told without reading what it sent first."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] in TCP_CLOSED


def _stall(sock: socket.socket, size: int, frames: int) -> bool:
    """Send all but the last MiB of a put; False if the server stopped reading it.

    Send all but the last MiB of a put of `size` bytes in `frames` frames; False if the server
    stopped reading it (a send blocked for 3 s).
    """
    header = msgpack.packb({"op": "put", "id": 1, "queue": "q", "n": frames})
    lens = struct.pack(FRAME_LENGTH.format(frames), *[size // frames] * frames)
    chunk = memoryview(b"x" * MiB)
    sock.settimeout(3)
    try:
        sock.sendall(FRAME_PREFIX.pack(len(header), frames) + lens + header)
        for _ in range(size // MiB - 1):
            sock.sendall(chunk)
    except TimeoutError:
        return False
    return True


@pytest.mark.timeout(180)
def test_requests_past_the_budget_are_not_read_and_their_memory_returns_when_they_are_closed(tmp_path: Path) -> None:
    """Puts that stall past the budget are not read, and their memory comes back once closed.

    Four connections each send 199 of the 200 MiB of a put and stall: the server reads one (the
    default budget holds one such request), not the others; its memory stays within the budget,
    pings stay quick, and once it closes them (--request-timeout) its memory is back.
    """
    with _server(tmp_path, "--request-timeout", "8") as (proc, address):
        with QueueClient(address) as c:
            c.ping()
        baseline, own = _rss(proc.pid), _rss(proc.pid, "RssAnon")
        attackers = [_connect(address) for _ in range(4)]
        with _Watch(address, proc.pid) as watch:
            sent: list[bool] = []
            feeders = [threading.Thread(target=lambda s=s: sent.append(_stall(s, 200 * MiB, 4))) for s in attackers]
            for t in feeders:
                t.start()
            for t in feeders:
                t.join(120)
            wait_for(lambda: all(_closed(s) for s in attackers), timeout=60, what="the stalled connections closed")
        assert sorted(sent) == [False, False, False, True], "the server read more than its budget holds"
        assert watch.peak <= baseline + DEFAULT_MEMORY_BUDGET_BYTES + MARGIN, (watch.peak / MiB, baseline / MiB)
        assert watch.slowest < PING_S, f"a ping took {watch.slowest * 1000:.0f} ms ({watch.pings} pings)"
        wait_for(lambda: _rss(proc.pid, "RssAnon") <= own + RETURNED, timeout=10, what="the memory back")
        _report("4 stalled puts of 200 MiB", baseline, own, watch, proc.pid)
        for s in attackers:
            s.close()
        with QueueClient(address) as c:
            assert c.put("q", [Message(payload=b"after")]) == [1] and [m.payload for m in c.get("q", 10)] == [b"after"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("budget_mib", [None, 32])
def test_clients_that_do_not_read_their_replies_get_no_more_of_them(tmp_path: Path, budget_mib: int | None) -> None:
    """Clients that do not read their replies get no more of them, and their memory comes back.

    Four connections each ask for 16 pages of 16 MiB of results (1 MiB each, on disk) and read
    none: the server makes each of them one page (fewer, past the budget), not 16; pings stay quick,
    --request-timeout closes them, and the memory is back.
    """
    budget = [] if budget_mib is None else ["--memory-budget-mib", str(budget_mib)]
    with _server(tmp_path, "--request-timeout", "3", *budget, durable=True) as (proc, address):
        with QueueClient(address, timeout=60) as c:
            ids = c.put("r", [Message(payload=b"m") for _ in range(64)])
            assert len(c.get("r", 100)) == 64
            assert c.ack("r", ids, [bytes([i]) * MiB for i in range(64)]) == [True] * 64
        baseline, own = _rss(proc.pid), _rss(proc.pid, "RssAnon")
        asking = frame({"op": "results", "id": 1, "queue": "r", "after": 0, "limit": 1000})
        with _Watch(address, proc.pid) as watch:
            wait_for(lambda: watch.pings, what="the pinging client connected")
            connected = _sockets(proc.pid)
            attackers = [_connect(address) for _ in range(4)]
            for s in attackers:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.sendall(asking * 16)
            wait_for(lambda: _sockets(proc.pid) == connected + 4, what="the connections not reading accepted")
            # their close cannot be seen from here without reading: the server's kernel holds its FIN
            # behind the unread replies
            wait_for(lambda: _sockets(proc.pid) == connected, timeout=60, what="the connections not reading closed")
        limit = DEFAULT_MEMORY_BUDGET_BYTES if budget_mib is None else budget_mib * MiB
        assert watch.peak <= baseline + limit + MARGIN, (watch.peak / MiB, baseline / MiB)
        assert watch.slowest < PING_S, f"a ping took {watch.slowest * 1000:.0f} ms ({watch.pings} pings)"
        for s in attackers:
            s.close()
        wait_for(lambda: _rss(proc.pid, "RssAnon") <= own + RETURNED, timeout=10, what="the memory back")
        _report(f"4 clients not reading 16 pages each, budget {budget_mib or 'default'}", baseline, own, watch, proc.pid)
        with QueueClient(address) as c:
            assert [r for _, r in c.iter_results("r")] == [bytes([i]) * MiB for i in range(64)]


def test_a_small_budget_lowers_the_limits_clients_split_to_and_requests_wait_their_turn() -> None:
    """A small budget lowers the limits clients split to, and requests wait their turn.

    With 8 MiB, the server takes requests of 6 MiB at most (a bigger one is refused in words, as
    over any limit); clients split their puts to fit, and two at once both get through.
    """
    with thread_server(memory_budget=8 * MiB) as s:
        raw = RawConnection(s.address)
        assert raw.hello["limits"][3] == 6 * MiB  # max_message_bytes: the budget less a header's room
        raw.send(frame({"op": "put", "id": 7, "queue": "q", "n": 2}, [b"x" * (7 * MiB // 2)] * 2))
        reply = raw.read()
        assert (reply["id"], reply["error"]) == (7, ERR_PROTOCOL)
        assert "7,340,032 bytes in all exceed the limit of 6,291,456" in reply["message"]
        raw.close()
        payloads = [[bytes([k, i]) * (MiB // 2) for i in range(12)] for k in range(2)]  # 12 MiB each: 2+ requests
        got: dict[int, list[int]] = {}

        def put(k: int) -> None:
            with QueueClient(s.address) as c:
                got[k] = c.put(f"q{k}", [Message(payload=p) for p in payloads[k]])

        putters = [threading.Thread(target=put, args=(k,)) for k in range(2)]
        for t in putters:
            t.start()
        for t in putters:
            t.join(60)
        with QueueClient(s.address) as c:
            for k in range(2):
                assert len(got[k]) == 12 and [m.payload for m in c.get(f"q{k}", 100)] == payloads[k]


@pytest.mark.timeout(60)
def test_a_request_that_needs_room_for_its_reply_holds_none_while_it_waits() -> None:
    """A request that needs room for its reply holds none while it waits.

    Requests for results that each hold more than a connection's free MiB (a long list of ids)
    and need a page of room for their replies: each gives its own room back while it waits for
    that, so they are all answered, one after another (holding theirs, they waited for each other,
    and for themselves, for ever).
    """
    with thread_server(memory_budget=8 * MiB) as s:  # a page of reply: the whole budget
        with QueueClient(s.address) as c:
            c.declare("q")
        ids = list(range(1 << 20, (1 << 20) + 300_000))  # 1.5 MB of ids, 5 bytes each
        asking = [RawConnection(s.address, timeout=30) for _ in range(3)]
        for k, raw in enumerate(asking):
            raw.send(frame({"op": "result", "id": k + 1, "queue": "q", "ids": ids}))
        for k, raw in enumerate(asking):
            reply = raw.read()
            assert (reply["id"], reply.get("error")) == (k + 1, None) and reply["found"]  # as many as fit: a page
            raw.close()
        wait_for(lambda: s.call(lambda: s.server.budget.used) == 0, what="the budget all given back")


@pytest.mark.timeout(90)
def test_the_budget_is_all_back_once_requests_end_however_they_end(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The budget is all back once requests end, however they end.

    Requests of 3 MiB sent whole and closed behind at once (over TLS the close can come with
    their last bytes, and their tasks are cancelled before they start), cut short, stalled until
    --request-timeout, refused by their handler, or waiting for room: once their connections are
    gone, the server holds nothing of its budget, and says when a request waited for room.
    """
    cert, key, fingerprint = self_signed(tmp_path / "tls", ["127.0.0.1"])
    with thread_server(tls=server_context(cert, key), memory_budget=8 * MiB, request_timeout_s=2, sweep_interval_s=0.1) as s:
        with QueueClient(s.address, tls=ClientTLS.make(fingerprint=fingerprint)) as c:
            c.declare("q")
        host, port = s.address.removeprefix("tls://").rsplit(":", 1)
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE

        def connect() -> ssl.SSLSocket:
            return context.wrap_socket(socket.create_connection((host, int(port)), timeout=30))

        def state() -> tuple[int, int]:
            """What the server holds of its budget, and how many connections it has."""
            return s.call(lambda: (s.server.budget.used, len(s.server._conns)))

        put = frame({"op": "put", "id": 1, "queue": "q", "n": 3}, [b"x" * MiB] * 3)
        for _ in range(10):  # whole, the close right behind (close_notify)
            sock = connect()
            sock.sendall(put)
            with contextlib.suppress(OSError):
                sock.unwrap()
            sock.close()
        for _ in range(3):  # cut short
            sock = connect()
            sock.sendall(put[: 2 * MiB])
            sock.close()
        refused = connect()  # its handler refuses it: 3 payloads for n=2
        refused.sendall(frame({"op": "put", "id": 2, "queue": "q", "n": 2}, [b"x" * MiB] * 3))
        replies = SocketReader(refused, Limits())
        replies.read()  # the hello
        reply, _ = replies.read()
        assert (reply["id"], reply["error"]) == (2, ERR_BAD_ARGUMENT), reply
        # the server reads these behind the sends above, a few at once: all of them end first, so that
        # the room held next is the stalled put's alone (any three of them in flight hold 6 MiB too)
        wait_for(lambda: state() == (0, 1), timeout=30, what="the budget back from the puts before the stalled one")
        stalled = connect()  # holds 6 MiB of the 8 until --request-timeout
        header = {"op": "put", "id": 3, "queue": "q", "n": 6}
        stalled.sendall(frame(header, [b"x" * MiB] * 6)[: 2 * MiB])
        held = len(msgpack.packb(header)) + 6 * MiB  # what the server lets in for it: its header and frames
        wait_for(lambda: state() == (held - CONNECTION_FREE_BYTES, 2), what="the stalled put let in")
        with QueueClient(s.address, tls=ClientTLS.make(fingerprint=fingerprint), timeout=30) as c:
            assert len(c.put("q", [Message(payload=b"y" * (4 * MiB))])) == 1  # waits for the stalled one to go
        wait_for(lambda: state() == (0, 1), timeout=30, what="the budget all back, only the refused put's connection left")
        refused.close()
        stalled.close()
    assert "waits for room (memory budget: " in caplog.text
