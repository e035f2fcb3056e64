"""A consumer's ack modes (`conveyor.worker.ack_modes`): settle after running, or ack on delivery.

Each mode against InProcessQueues (real stores, no sockets): what a fetch hands to the slots, which
leases are extended, what a finished task sends, what a stop gives back and what the pool is told it
holds. The consumers running them are in test_worker.py, test_worker_stops.py and
test_compat_daskqueue.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from conveyor.client.in_process import InProcessQueues
from conveyor.constants import H_TASK
from conveyor.errors import ConnectionLostError, TaskError
from conveyor.message import Message
from conveyor.worker.ack_modes import (
    STOPPED,
    AckOnDelivery,
    Delivered,
    Failed,
    SettleAfterRunning,
    Stopped,
    Unstarted,
    ack_mode,
    ack_on_delivery,
)
from conveyor.worker.executors import Completion
from conveyor.worker.held import Held
from conveyor.worker.middleware import Decision, Middleware, default_middleware
from conveyor.worker.settler import Ack, Extend, Nack


@pytest.fixture
def queues() -> Iterator[InProcessQueues]:
    with InProcessQueues() as q:
        yield q


def fetched(queues: InProcessQueues, n: int) -> list[Message]:
    queues.put("jobs", [Message(b"x", headers={H_TASK: "t"}, max_attempts=3) for _ in range(n)])
    return queues.get("jobs", n, lease_s=30.0)


def test_the_options_choose_the_mode() -> None:
    assert isinstance(ack_mode(False, [], None), SettleAfterRunning) and SettleAfterRunning.reads_ahead
    assert isinstance(ack_mode(True, [], None), AckOnDelivery) and not AckOnDelivery.reads_ahead


def test_settled_after_running_a_fetch_stays_leased_until_its_task_ends(queues: InProcessQueues) -> None:
    mode = SettleAfterRunning(default_middleware())
    got = fetched(queues, 3)
    assert mode.delivered(queues, got, 0) == Delivered(got, None)
    assert queues.stats("jobs")["jobs"].delivered == 3  # leased, not acked
    assert mode.succeeded(got[0], b"r") == Ack("jobs", got[0].id, b"r")
    assert mode.result_room(queues) == queues.clients[0].server_limits.max_item_bytes


def test_settled_after_running_a_failure_is_the_middlewares_call(queues: InProcessQueues) -> None:
    class Later(Middleware):
        def on_failure(self, message: Message, error: TaskError) -> Decision | None:
            return Decision(False, 7.0)

    middleware: list[Middleware] = []
    mode = SettleAfterRunning(middleware)
    [m] = fetched(queues, 1)
    middleware.append(Later())  # the consumer's own list: one added after the mode was chosen is asked too
    failed = mode.failed(m, TaskError("t", "ValueError: no", True))
    assert failed == Failed(Decision(False, 7.0), Nack("jobs", m.id, "ValueError: no", 7.0, False))


def test_settled_after_running_long_tasks_have_their_leases_extended(queues: InProcessQueues) -> None:
    mode = SettleAfterRunning(default_middleware())
    got = fetched(queues, 2)
    held = [Held(m, None, heartbeat_at=10.0) for m in got]
    assert mode.extensions(held, 5.0) == []  # not due yet
    assert sorted(e.msg_id for e in mode.extensions(held, 10.0)) == sorted(m.id for m in got)
    assert all(isinstance(e, Extend) and e.queue == "jobs" for e in mode.extensions(held, 1e9))


def test_settled_after_running_a_stop_gives_back_what_did_not_finish(queues: InProcessQueues) -> None:
    mode = SettleAfterRunning(default_middleware())
    got = fetched(queues, 3)
    assert mode.unstarted(got[:1]) == Unstarted(got[:1], [])
    assert mode.stopped(got[1:]) == Stopped(got[1:], [])


def test_acked_on_delivery_a_fetch_is_acked_before_it_runs_and_the_pool_told_first(queues: InProcessQueues) -> None:
    told: list[tuple[int, int]] = []  # (held, acked on the server) as the pool is told
    mode = AckOnDelivery(lambda n: told.append((n, queues.stats("jobs")["jobs"].acked)))
    got = fetched(queues, 3)
    assert mode.delivered(queues, got, 2) == Delivered(got, None)
    assert told == [(5, 0)]  # 2 held before, 3 more: said before the acks
    assert queues.stats("jobs")["jobs"].acked == 3
    mode.holding(1)
    assert told[-1] == (1, 3)


def test_acked_on_delivery_nothing_is_sent_after_the_task(queues: InProcessQueues) -> None:
    mode = AckOnDelivery(None)
    [m] = fetched(queues, 1)
    assert mode.succeeded(m, b"r") is None  # no result is stored: none is too big either
    assert mode.result_room(queues) == math.inf
    assert mode.failed(m, TaskError("t", "ValueError: no", True)) == Failed(Decision(True), None)  # no retry can follow
    assert mode.extensions([Held(m, None, heartbeat_at=0.0)], 1e9) == []  # no lease left to extend


def test_acked_on_delivery_a_stop_gives_nothing_back(queues: InProcessQueues) -> None:
    mode = AckOnDelivery(None)
    got = fetched(queues, 3)
    assert mode.unstarted(got[:1]) == Unstarted([], got[:1])  # acked: they run here
    stopped = mode.stopped(got[1:])
    assert stopped.give_back == [] and [c.message for c in stopped.failed] == got[1:]
    assert all(isinstance(c, Completion) and c.error is not None and c.error.error == STOPPED for c in stopped.failed)


class _AcksFailOnQueueB:
    """A pool whose acks take on queue "a" and fail on queue "b" (its server gone, say)."""

    def __init__(self) -> None:
        self.acked: list[tuple[str, list[int]]] = []

    @staticmethod
    def split_id(msg_id: int) -> tuple[int, int]:
        return msg_id % 2, msg_id // 2

    def ack(self, queue: str, ids: list[int]) -> list[bool]:
        if queue == "b":
            raise ConnectionLostError("server gone")
        self.acked.append((queue, ids))
        return [i != 5 for i in ids]  # 5: its lease had ended, another consumer has it


@pytest.mark.timeout(10)
def test_acks_on_delivery_that_partly_fail_still_run_what_was_acked() -> None:
    pool = _AcksFailOnQueueB()
    got = [Message(id=i, queue=q) for i, q in [(1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, "a"), (7, "b")]]
    delivered = ack_on_delivery(pool, got)  # type: ignore[arg-type]
    # one request per queue and server: a (server 1), a (server 0), then b fails
    assert pool.acked == [("a", [1, 3, 5]), ("a", [2])]
    assert [m.id for m in delivered.run] == [1, 3, 2] and isinstance(delivered.error, ConnectionLostError)
