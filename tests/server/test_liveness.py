"""Whether a consumer is alive is judged on the monotonic clock, by the server and by the dashboard.

The server (`workers()`, the metrics) and the dashboard (late, gone) judge it so: a step of the wall
clock of an hour, back or forward, neither keeps a dead consumer listed for an hour nor drops a live
one. Real servers (in this process, whose wall clock the tests step) and real reports.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import conveyor.client.in_process as in_process
import conveyor.dashboard.state as dashboard_state
import conveyor.server.queues as server_queues
from conveyor.client.in_process import InProcessQueues
from conveyor.client.pool import QueuePool
from conveyor.dashboard.state import PoolWatch

from ..support.servers import ThreadServer, thread_server, wait_for

pytestmark = pytest.mark.timeout(60)
HOUR_S = 3600.0
GONE_S = 2.0  # the server's WORKER_GONE_S, shortened


class SteppedClock:
    """The wall clock (`time.time`) of this process, stepped by `step(seconds)`.

    Stepped as an operator or NTP would step the machine's; the monotonic clock runs on untouched.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset = 0.0
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + self.offset)

    def step(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadServer]:
    monkeypatch.setattr(server_queues, "WORKER_GONE_S", GONE_S)
    with thread_server() as s:
        yield s


@pytest.mark.parametrize("step", [-HOUR_S, HOUR_S], ids=["back", "forward"])
def test_the_server_judges_a_consumers_reports_on_the_monotonic_clock(
    server: ThreadServer, monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    """A consumer stays listed across a wall clock step of an hour, and goes once silent for WORKER_GONE_S.

    A consumer that reported, then the wall clock steps an hour: it is still listed at once (not
    dropped as an hour silent), with a sane age, and gone once silent for WORKER_GONE_S (not an hour
    later).
    """
    clock = SteppedClock(monkeypatch)
    with QueuePool.connect([server.address]) as pool:
        pool.queues.report("w", {"processed": 1, "running": 0})
        clock.step(step)
        listed = pool.queues.workers()
        assert "w" in listed and 0 <= float(listed["w"]["seen"]) < GONE_S, listed
        t0 = time.monotonic()
        wait_for(lambda: "w" not in pool.queues.workers(), GONE_S + 10, "the silent consumer gone")
        assert time.monotonic() - t0 < GONE_S + 10


@pytest.mark.parametrize("step", [-HOUR_S, HOUR_S], ids=["back", "forward"])
def test_in_process_queues_judge_a_consumers_reports_on_the_monotonic_clock(monkeypatch: pytest.MonkeyPatch, step: float) -> None:
    """The same for `InProcessQueues` (workers and tests without servers)."""
    monkeypatch.setattr(in_process, "WORKER_GONE_S", GONE_S)
    clock = SteppedClock(monkeypatch)
    queues = InProcessQueues()
    queues.report("w", {"processed": 1, "running": 0})
    clock.step(step)
    listed = queues.workers()
    assert "w" in listed and 0 <= float(listed["w"]["seen"]) < GONE_S, listed
    wait_for(lambda: "w" not in queues.workers(), GONE_S + 10, "the silent consumer gone")


def test_the_dashboard_marks_a_silent_consumer_late_then_lost_after_the_wall_clock_steps_back(
    server: ThreadServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case seen: the wall clock stepped back an hour kept a dead consumer listed for an hour.

    Now it is late after LATE_S, lost once the server drops it, and off the list after GONE_KEPT_S.
    """
    monkeypatch.setattr(dashboard_state, "LATE_S", 1.0)
    monkeypatch.setattr(dashboard_state, "GONE_KEPT_S", GONE_S + 3.0)
    clock = SteppedClock(monkeypatch)
    with QueuePool.connect([server.address]) as pool:
        watch = PoolWatch(pool)
        try:

            def consumer() -> dict[str, Any] | None:
                found = [c for c in watch.overview()["consumers"] if c["name"] == "w"]
                assert not found or found[0]["seen"] >= 0, found
                return found[0] if found else None

            def reported() -> bool:
                pool.queues.report("w", {"processed": 1, "running": 0, "pid": 1, "host": "h"})  # as a live consumer does
                return (c := consumer()) is not None and c["status"] == "ok"

            wait_for(reported, 10, "the consumer seen")
            clock.step(-HOUR_S)  # and it never reports again
            wait_for(lambda: (c := consumer()) is not None and c["status"] == "late", 10, "the consumer marked late")
            wait_for(lambda: (c := consumer()) is not None and c["status"] == "lost", GONE_S + 10, "then lost")
            wait_for(lambda: consumer() is None, GONE_S + 15, "then off the list")
        finally:
            watch.close()
