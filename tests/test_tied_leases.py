"""Leases taken with `tie` end when the peer closes the connection: a killed consumer's work comes
back at once, not after its lease. Real servers, real child processes killed with SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client.queue_client import QueueClient
from conveyor.message import Message
from conveyor.server import tied

from .servers import ThreadServer, thread_server, wait_for

LONG = 600.0  # a lease no test waits out

_HOLDER = """
import json, sys
from conveyor.client.queue_client import QueueClient
c = QueueClient(sys.argv[1], timeout=10)
got = c.get("q", int(sys.argv[2]), lease_s=float(sys.argv[3]), tie=sys.argv[4] == "1")
acked, released = int(sys.argv[5]), int(sys.argv[6])
assert c.ack("q", [m.id for m in got[:acked]]) == [True] * acked
assert c.release("q", [m.id for m in got[acked : acked + released]]) == [True] * released
print(json.dumps([[m.id, m.attempts] for m in got]), flush=True)
sys.stdin.read()  # holds its leases until killed
"""


class Holder:
    """A child process that takes n messages (tied or not), acks the first `acked`, gives back the
    next `released`, and holds the rest until it is killed."""

    def __init__(self, address: str, n: int, tie: bool, acked: int = 0, released: int = 0) -> None:
        args = [address, str(n), str(LONG), "1" if tie else "0", str(acked), str(released)]
        self.proc = subprocess.Popen([sys.executable, "-c", _HOLDER, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)  # fmt: skip
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


def test_a_killed_holders_tied_leases_end_at_once_and_untied_ones_keep_their_time(server: ThreadServer,
                                                                                 client: QueueClient) -> None:  # fmt: skip
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


def test_a_tied_delivery_settled_or_given_back_is_left_alone_when_its_holder_dies(client: QueueClient,
                                                                                   server: ThreadServer) -> None:  # fmt: skip
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


def test_a_client_that_closes_on_purpose_or_recycles_an_idle_connection_keeps_its_leases() -> None:
    with thread_server(sweep_interval_s=0.05, idle_timeout_s=1.0) as server:
        c = QueueClient(server.address, timeout=10)
        _put(c, 4)
        live = lambda: server.call(lambda: len(server.server._conns))  # noqa: E731
        closer = QueueClient(server.address, timeout=10)
        closer.get("q", 2, lease_s=LONG, tie=True)
        closer.close()  # says bye first
        wait_for(lambda: live() == 1, 5, "the closed connection gone")
        recycler = QueueClient(server.address, timeout=10)
        recycler.get("q", 2, lease_s=LONG, tie=True)
        wait_for(recycler._idle_too_long, 5, "the connection idle for half the server's timeout")
        recycler.ping()  # on a new connection, the old one closed with a bye
        wait_for(lambda: live() == 2, 5, "the recycled connection gone")
        st = c.stats("q")["q"]
        assert (st.delivered, st.ready) == (4, 0)  # all four keep their leases: their holders live
        recycler.close()
        c.close()


def test_a_connection_the_server_closes_keeps_its_leases(tmp_path: Path) -> None:
    with thread_server(sweep_interval_s=0.05, idle_timeout_s=0.3) as server:
        c = QueueClient(server.address, timeout=10)
        _put(c, 2)
        holder = QueueClient(server.address, timeout=10)
        holder.get("q", 2, lease_s=LONG, tie=True)
        sock = holder._sock
        assert sock is not None
        sock.settimeout(10)
        assert sock.recv(1) == b""  # the server closed it: idle past its timeout
        st = c.stats("q")["q"]
        assert (st.delivered, st.ready) == (2, 0)  # its peer may be alive: the leases keep their time
        holder.close()
        c.close()


def test_a_tied_message_whose_every_holder_dies_ends_as_a_dead_letter_saying_so(server: ThreadServer,
                                                                               client: QueueClient) -> None:  # fmt: skip
    [mid] = _put(client, 1, max_attempts=2)
    for attempt in (1, 2):
        h = Holder(server.address, 1, tie=True)
        assert h.got == [[mid, attempt]]
        h.close()
        wait_for(lambda: client.stats("q")["q"].delivered == 0, 5, "the delivery ended")
    [dead] = client.dead_letters("q")
    assert dead.message.id == mid and "its consumer's connection closed on its last attempt (2 of 2)" in dead.error


def test_a_long_lived_connection_forgets_the_deliveries_it_settled(server: ThreadServer, client: QueueClient,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(tied, "PRUNE_AT", 8)
    _put(client, 100)
    worker = QueueClient(server.address, timeout=10)
    for _ in range(25):
        got = worker.get("q", 4, lease_s=LONG, tie=True)
        assert worker.ack("q", [m.id for m in got[:3]]) == [True] * 3  # one of four stays delivered
    held = server.call(lambda: [c.tied._size for c in server.server._conns])
    assert max(held) <= 2 * 25  # pruned: what it still holds and at most as much again, not all 100
    worker._drop()  # as a dying process would: no word
    wait_for(lambda: client.stats("q")["q"].ready == 25, 5, "the 25 it held back")
