"""The settler against a real server: how long it gathers settlements, and that hurrying cuts it short."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool
from conveyor.message import Message
from conveyor.protocol.report import ConsumerReport
from conveyor.worker.settler import BUSY_COALESCE_S, CLOSE_SAY_S, COALESCE_S, Ack, Settler

from ..support.servers import ThreadServer, thread_server, wait_for


@pytest.fixture
def pool() -> Iterator[QueuePool]:
    with thread_server() as s, QueuePool.connect([s.address]) as p:
        yield p


def leased(pool: QueuePool, n: int) -> list[int]:
    pool.put("q", [Message(b"x") for _ in range(n)])
    got = pool.queues.get("q", n, lease_s=30)
    assert len(got) == n
    return [m.id for m in got]


def acked(pool: QueuePool) -> int:
    return pool.stats("q")["q"].acked


def test_a_busy_settler_gathers_acks_longer_and_a_hurry_sends_them_together(pool: QueuePool) -> None:
    assert BUSY_COALESCE_S >= 4 * COALESCE_S
    a, b = leased(pool, 2)
    settler = Settler(pool.queues)
    try:
        settler.busy = True
        settler.put([Ack("q", a, b"ra")])
        # twice the quiet window: a settler that is not busy would have sent this ack by now
        until = time.monotonic() + 2 * COALESCE_S
        while time.monotonic() < until:
            assert acked(pool) == 0, "a busy settler sent an ack within the quiet window"
        settler.put([Ack("q", b, b"rb")])
        settler.hurry()  # the consumer went idle: send now, without waiting out the window
        n = wait_for(lambda: acked(pool), what="the acks")
        assert n == 2, "acks gathered together should go in one request"
        assert settler.flush(10)
        assert dict(pool.queues.results("q")) == {a: b"ra", b: b"rb"}
    finally:
        settler.close(10)


def test_a_flush_sends_a_busy_settlers_acks_and_waits_for_them(pool: QueuePool) -> None:
    ids = leased(pool, 3)
    settler = Settler(pool.queues)
    try:
        settler.busy = True
        settler.put([Ack("q", i, None) for i in ids])
        assert settler.flush(10)
        assert acked(pool) == 3  # sent and answered when flush returns
    finally:
        settler.close(10)


def test_a_report_waits_little_on_a_server_out_of_reach() -> None:
    """A report waits on a server out of reach for one refused attempt to connect, not its whole patience.

    A report goes to every server: one out of reach costs the settler (the acks behind it, a
    consumer's stop) one refused attempt to connect, not the connection's whole patience.
    """
    with socket.socket() as probe:  # a port nobody listens on: each connect is refused at once
        probe.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    with thread_server() as s, QueuePool.connect([s.address, dead], connect_timeout=10.0) as pool:
        settler = Settler(pool.queues, report=lambda: ConsumerReport("w", processed=1), report_every_s=0.2)
        with QueuePool.connect([s.address]) as live:
            wait_for(lambda: "w" in live.queues.workers(), timeout=5, what="the report on the live server")
        t0 = time.monotonic()
        settler.close()
        took = time.monotonic() - t0
    assert took < 4.0, f"close took {took:.1f} s"  # a periodic report and the last one; 10 s each at first


def test_settlements_for_a_server_out_of_reach_wait_and_the_others_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server restarting holds up only its own settlements.

    They are tried again until it is back (then they go through), while the other server's go
    through at once, however long it takes.
    """
    with thread_server() as live:
        down = ThreadServer(data_dir=tmp_path / "b")
        port = int(down.address.rsplit(":", 1)[1])
        with QueuePool.connect([live.address, down.address], connect_timeout=10.0) as pool:
            for _ in range(2):  # a batch to each server in turn
                pool.put("q", [Message(b"x") for _ in range(2)])
            held = pool.queues.get("q", 2, lease_s=60, shards=[0]) + pool.queues.get("q", 2, lease_s=60, shards=[1])
            on_down = [m.id for m in held if pool.queues.split_id(m.id)[0] == 1]
            on_live = [m.id for m in held if pool.queues.split_id(m.id)[0] == 0]
            assert len(on_down) == len(on_live) == 2
            down.stop()
            settler = Settler(pool.queues)
            try:
                settler.put([Ack("q", i, b"r") for i in on_down])  # its server is gone: they wait
                assert not settler.flush(1.0)
                settler.put([Ack("q", i, b"r") for i in on_live])
                t0 = time.monotonic()
                # the live server's acks go at once (before: behind the retries, for as long as its server was out)
                wait_for(lambda: pool.queues.clients[0].stats()["q"].acked == 2, timeout=5, what="the live server's acks")
                assert time.monotonic() - t0 < 3.0
                assert f"settlements for {down.address} wait" in caplog.text  # said, naming the server
                back = ThreadServer(data_dir=tmp_path / "b", port=port)  # started again on its data
                try:
                    assert settler.flush(30), "the waiting acks did not go through once the server was back"
                    assert pool.queues.clients[1].stats()["q"].acked == 2
                finally:
                    back.stop()
            finally:
                settler.close(5)
    assert settler.unsettled == 0


def test_a_close_that_waits_for_a_server_out_of_reach_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A stop waits for its last settlements, and says so when that takes longer than CLOSE_SAY_S.

    A stop waits for its last settlements (a server restarting may be back within it) and says so
    when that takes longer than CLOSE_SAY_S; what is left when the time is up counts as unsettled.
    """
    with thread_server() as live:
        down = ThreadServer()
        with QueuePool.connect([live.address, down.address]) as pool:
            for _ in range(2):  # a batch to each server in turn
                pool.put("q", [Message(b"x") for _ in range(2)])
            ids = [m.id for m in pool.queues.get("q", 2, lease_s=60, shards=[1])]
            down.stop()
            settler = Settler(pool.queues)
            settler.put([Ack("q", i, None) for i in ids])
            settler.close(CLOSE_SAY_S + 1.0)
    assert settler.unsettled == 2
    said = r"2 settlement\(s\) not sent yet \(a server out of reach, or slow\): trying for up to \d s more"
    assert re.search(said, caplog.text), caplog.text
