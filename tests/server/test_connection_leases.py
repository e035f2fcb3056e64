"""Leases taken with `tie` end when the peer closes the connection.

A killed consumer's work comes back at once, not after its lease. Real servers, real child processes
killed with SIGKILL.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client import transport
from conveyor.client.queue_client import QueueClient
from conveyor.constants import FRAME_PREFIX
from conveyor.message import Message
from conveyor.protocol import framing as protocol
from conveyor.server import connection_leases

from ..support.servers import ThreadServer, thread_server, wait_for

LONG = 600.0  # a lease no test waits out

_HOLDER = """
import json, sys
from conveyor.client.queue_client import QueueClient
c = QueueClient(sys.argv[1], timeout=10)
got = c.get("q", int(sys.argv[2]), lease_s=float(sys.argv[3]), tie=sys.argv[4] == "1")
acked, released = int(sys.argv[5]), int(sys.argv[6])
other = QueueClient(sys.argv[1], timeout=10)  # as a consumer's settler: connections of its own
assert other.ack("q", [m.id for m in got[:acked]]) == [True] * acked
assert other.release("q", [m.id for m in got[acked : acked + released]]) == [True] * released
print(json.dumps([[m.id, m.attempts] for m in got]), flush=True)
sys.stdin.read()  # holds its leases until killed
"""


class Holder:
    """A child process that takes n messages (tied or not), acks some, gives some back, and holds the rest.

    It acks the first `acked` and gives back the next `released` over another connection, and holds
    the rest until it is killed.
    """

    def __init__(self, address: str, n: int, tie: bool, acked: int = 0, released: int = 0) -> None:
        args = [address, str(n), str(LONG), "1" if tie else "0", str(acked), str(released)]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.got = json.loads(self.proc.stdout.readline())  # the pytest timeout bounds this read

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadServer]:
    with thread_server(data_dir=tmp_path / "data", sweep_interval_s=0.05) as s:
        yield s


@pytest.fixture
def client(server: ThreadServer) -> Iterator[QueueClient]:
    c = QueueClient(server.address, timeout=10)
    yield c
    c.close()


def _put(c: QueueClient, n: int, **kw: object) -> list[int]:
    return c.put("q", [Message(payload=b"m%d" % i, **kw) for i in range(n)])  # type: ignore[arg-type]


def test_a_killed_holders_tied_leases_end_at_once_and_untied_ones_keep_their_time(
    server: ThreadServer, client: QueueClient
) -> None:
    _put(client, 5)
    untied = Holder(server.address, 2, tie=False)
    holder = Holder(server.address, 3, tie=True)
    try:
        assert client.stats("q")["q"].delivered == 5
        holder.kill()
        untied.kill()
        wait_for(lambda: client.stats("q")["q"].ready == 3, 5, "the tied deliveries back")
        assert client.stats("q")["q"].delivered == 2  # untied: they wait out their lease
        again = client.get("q", 5, lease_s=LONG)
        assert sorted((m.id, m.attempts) for m in again) == sorted((i, 2) for i, _ in holder.got)  # the attempt counted
    finally:
        holder.close()
        untied.close()


def test_a_tied_delivery_settled_or_given_back_is_left_alone_when_its_holder_dies(
    client: QueueClient, server: ThreadServer
) -> None:
    a, b, c = _put(client, 3)
    first = Holder(server.address, 3, tie=True, acked=1, released=1)
    try:
        assert [i for i, _ in first.got] == [a, b, c]
        second = QueueClient(server.address, timeout=10)
        [again] = second.get("q", 1, lease_s=LONG, tie=True)
        assert (again.id, again.attempts) == (b, 1)  # the same (id, attempt) the first one took
        first.kill()
        wait_for(lambda: client.stats("q")["q"].ready == 1, 5, "c back")
        st = client.stats("q")["q"]
        assert (st.acked, st.delivered, st.ready) == (1, 1, 1)  # a stays acked, b stays the second's
        second._drop()  # as a dying process would: no word
        wait_for(lambda: client.stats("q")["q"].ready == 2, 5, "b back")
    finally:
        first.close()


def _closed_by_server(c: QueueClient) -> bool:
    sock = c._sock
    assert sock is not None
    sock.settimeout(0.01)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except TimeoutError:
        return False


def test_a_client_that_closes_on_purpose_or_times_out_keeps_its_leases() -> None:
    with thread_server(sweep_interval_s=0.05) as server:
        c = QueueClient(server.address, timeout=10)
        _put(c, 4)
        live = lambda: server.call(lambda: len(server.server._conns))  # noqa: E731
        closer = QueueClient(server.address, timeout=10)
        closer.get("q", 2, lease_s=LONG, tie=True)
        closer.close()  # says bye first
        wait_for(lambda: live() == 1, 5, "the closed connection gone")
        slow = QueueClient(server.address, timeout=0.5)
        slow.get("q", 2, lease_s=LONG, tie=True)
        stall = threading.Thread(target=server.call, args=(lambda: time.sleep(1.0),))  # the server's loop busy 1 s
        stall.start()
        with pytest.raises(TimeoutError):
            slow.ping()  # no reply within 0.5 s: the client closes the connection, saying bye
        stall.join()
        wait_for(lambda: live() == 1, 5, "the timed-out connection gone")
        st = c.stats("q")["q"]
        assert (st.delivered, st.ready) == (4, 0)  # all four keep their leases: their holders live
        c.close()


def test_a_connection_holding_tied_leases_is_not_closed_for_silence_until_they_are_settled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport, "STALE_CHECK_S", 0.0)  # the client looks before every request, not after 1 s idle
    with thread_server(sweep_interval_s=0.05, idle_timeout_s=0.5) as server:
        c = QueueClient(server.address, timeout=10)
        ids = _put(c, 2)
        holder = QueueClient(server.address, timeout=10)
        holder.get("q", 2, lease_s=LONG, tie=True)  # its tasks run long: it sends nothing for a while
        witness = QueueClient(server.address, timeout=10).connect()  # as idle, nothing tied
        wait_for(lambda: _closed_by_server(witness), 10, "the untied idle connection closed")
        assert not _closed_by_server(holder)  # as idle, but its deliveries stand
        assert c.ack("q", ids) == [True, True]  # settled by its settler: nothing of its own stands
        wait_for(lambda: _closed_by_server(holder), 10, "the tied connection closed once idle with nothing held")
        assert holder.ping()["pong"]  # the client sees it closed and connects anew
        witness.close()
        holder.close()
        c.close()


def test_a_message_taken_again_by_the_same_connection_comes_back_when_it_dies(server: ThreadServer, client: QueueClient) -> None:
    [mid] = _put(client, 1)
    holder = QueueClient(server.address, timeout=10)
    assert [m.id for m in holder.get("q", 1, lease_s=LONG, tie=True)] == [mid]
    assert client.nack("q", [mid]) == [True]  # by another connection, as a settler does
    assert [(m.id, m.attempts) for m in holder.get("q", 1, lease_s=LONG, tie=True)] == [(mid, 2)]
    holder._drop()  # as a dying process would: no word
    wait_for(lambda: client.stats("q")["q"].ready == 1, 5, "its second delivery back")


def test_a_connection_the_server_closes_keeps_its_leases() -> None:
    with thread_server(sweep_interval_s=0.05, request_timeout_s=0.3) as server:
        c = QueueClient(server.address, timeout=10)
        _put(c, 2)
        holder = QueueClient(server.address, timeout=10)
        holder.get("q", 2, lease_s=LONG, tie=True)
        sock = holder._sock
        assert sock is not None
        sock.sendall(FRAME_PREFIX.pack(64, 0))  # the start of a request, never the rest
        sock.settimeout(10)
        assert sock.recv(1) == b""  # the server closed it: the request not finished within its timeout
        st = c.stats("q")["q"]
        assert (st.delivered, st.ready) == (2, 0)  # its peer may be alive: the leases keep their time
        holder._drop()
        c.close()


def test_a_tied_message_whose_every_holder_dies_ends_as_a_dead_letter_saying_so(
    server: ThreadServer, client: QueueClient
) -> None:
    [mid] = _put(client, 1, max_attempts=2)
    for attempt in (1, 2):
        h = Holder(server.address, 1, tie=True)
        assert h.got == [[mid, attempt]]
        h.close()
        wait_for(lambda: client.stats("q")["q"].delivered == 0, 5, "the delivery ended")
    [dead] = client.dead_letters("q")
    assert dead.message.id == mid and "its consumer's connection closed on its last attempt (2 of 2)" in dead.error


def test_a_long_lived_connection_forgets_the_deliveries_it_settled(
    server: ThreadServer, client: QueueClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_leases, "PRUNE_AT", 8)
    _put(client, 100)
    worker = QueueClient(server.address, timeout=10)
    for _ in range(25):
        got = worker.get("q", 4, lease_s=LONG, tie=True)
        assert worker.ack("q", [m.id for m in got[:3]]) == [True] * 3  # one of four stays delivered
    held = server.call(lambda: [c.leases._size for c in server.server._conns])
    assert max(held) <= 2 * 25  # pruned: what it still holds and at most as much again, not all 100
    worker._drop()  # as a dying process would: no word
    wait_for(lambda: client.stats("q")["q"].ready == 25, 5, "the 25 it held back")


class _CutSocket:
    """A socket whose next large send goes out but for its last `short` bytes, then times out.

    As a send into a stalled server can.
    """

    def __init__(self, sock: socket.socket, short: int) -> None:
        self._sock, self._short = sock, short

    def sendall(self, data: bytes) -> None:
        if len(data) > 1000 and self._short:
            self._sock.sendall(data[: -self._short])
            self._short = 0
            raise TimeoutError("timed out")
        self._sock.sendall(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


def test_a_request_cut_mid_frame_by_a_timeout_is_dropped_and_the_ties_kept() -> None:
    """A put cut part way by a send timeout: the server drops the broken frame and keeps the ties.

    A put whose send timed out part way: the client closes without a bye (whose bytes would complete
    the frame: a message would be stored with them); the server drops the broken frame, stores
    nothing, and keeps the ties.
    """
    with thread_server(sweep_interval_s=0.05) as server:
        c = QueueClient(server.address, timeout=10)
        _put(c, 1)
        cut = QueueClient(server.address, timeout=10)
        cut.get("q", 1, lease_s=LONG, tie=True)
        bye = len(b"".join(protocol.encode({"op": "bye", "id": 3}, ())))  # its next request id
        cut._sock = _CutSocket(cut._sock, bye)  # type: ignore[assignment,arg-type]
        with pytest.raises(TimeoutError):
            cut.put("q", [Message(payload=b"x" * 10_000)])
        wait_for(lambda: server.call(lambda: len(server.server._conns)) == 1, 10, "the cut connection gone")
        st = c.stats("q")["q"]
        assert (st.ready, st.delivered) == (0, 1)  # nothing stored; the delivery keeps its lease
        c.close()


def test_closing_a_tied_connection_to_a_server_that_does_not_answer_ends_within_its_bound() -> None:
    """The bye's wait for the server to close its side is bounded (BYE_TIMEOUT_S).

    The server, once it reads again, hears the bye ahead of the close and keeps the leases.
    """
    with thread_server(sweep_interval_s=0.05) as server:
        c = QueueClient(server.address, timeout=10)
        _put(c, 2)
        holder = QueueClient(server.address, timeout=10)
        holder.get("q", 2, lease_s=LONG, tie=True)
        stall = threading.Thread(target=server.call, args=(lambda: time.sleep(transport.BYE_TIMEOUT_S + 2),))
        stall.start()
        t0 = time.monotonic()
        holder.close()
        took = time.monotonic() - t0
        stall.join()
        assert transport.BYE_TIMEOUT_S - 0.1 <= took <= transport.BYE_TIMEOUT_S + 1.0
        wait_for(lambda: server.call(lambda: len(server.server._conns)) == 1, 10, "the closed connection gone")
        st = c.stats("q")["q"]
        assert (st.delivered, st.ready) == (2, 0)
        c.close()
