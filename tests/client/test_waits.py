"""Waits that say why, against real queue servers and real consumers.

`result()`, `gather` and `join` on a queue no live consumer serves warn, and consumers that cannot
start fail the wait at once with their own error (not its timeout).

The consumer pools a wait looks after are those attached to its pool (`conveyor.client.attached`).
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections.abc import Iterator

import pytest

from conveyor.client import progress
from conveyor.client.pool import QueuePool
from conveyor.client.progress import Stall
from conveyor.constants import COUNT_SERVES
from conveyor.errors import ConveyorError
from conveyor.worker import Consumer, ConsumerPool

from ..support import worker_tasks as wt
from ..support.servers import wait_for

pytestmark = pytest.mark.timeout(120)
MODULES = ["tests.support.worker_tasks"]
FIRST_S = 0.5  # the first warning, shortened for the tests (STALL_FIRST_S)
# a consumer pool's start failure, seen by a wait: its consumers exit (START_FAILURES_MAX times, each
# from a fork server) and the wait looks after them at each poll; generous for a busy machine
START_FAILED_WITHIN_S = 20.0


@pytest.fixture
def pool() -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=2, durable=False) as p:
        yield p


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no live consumer serves" in r.getMessage()]


def test_a_stall_is_judged_by_who_serves_the_queue_waited_on(pool: QueuePool, caplog: pytest.LogCaptureFixture) -> None:
    """A consumer reporting on another queue is no help: the wait warns, naming the queue, once, then at the slow interval.

    A consumer on the queue, or one whose report names no queue (an older consumer), silences it.
    """
    caplog.set_level(logging.WARNING, "conveyor.client")
    Stall("join", pool.queues.workers, first=0.0).check({"jobs": 3, "drained": 0})
    assert [w.split(": start")[0] for w in warnings(caplog)] == [
        "join: 3 pending on queue 'jobs', which no live consumer serves (no consumer reports)"
    ]
    assert "or pass a timeout" in warnings(caplog)[0]  # the wait has none: it would wait for ever
    caplog.clear()
    stall = Stall("gather", pool.queues.workers, first=0.0, every=60.0)
    pool.queues.report("other-consumer", {"processed": 0, COUNT_SERVES + "other": 1})
    stall.check({"jobs": 3, "other": 2})
    said = warnings(caplog)
    assert len(said) == 1, said
    assert "3 pending on queue 'jobs'" in said[0] and "1 consumer(s) report, on 'other'" in said[0]
    assert "'other'," not in said[0].split("(")[0]  # the served queue is not named as unserved
    deadline = time.monotonic() + 3.0  # looks at most every STALL_LOOK_S: one more look at least
    while time.monotonic() < deadline:
        stall.check({"jobs": 3})
        time.sleep(0.1)
    assert len(warnings(caplog)) == 1, "warned again before the slow interval"

    for counts in ({COUNT_SERVES + "jobs": 1}, {"processed": 0}):  # serves it; names no queue
        pool.queues.report("jobs-consumer", counts)
        quiet = Stall("gather", pool.queues.workers, first=0.0, every=0.0)
        caplog.clear()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            quiet.check({"jobs": 3})
            time.sleep(0.1)
        assert warnings(caplog) == [], counts
        pool.queues.report("jobs-consumer", {COUNT_SERVES + "elsewhere": 1})  # the next report says otherwise


@pytest.mark.parametrize("wait", ["result", "join"])
def test_a_wait_on_a_queue_nobody_serves_warns_though_a_consumer_on_another_reports(
    pool: QueuePool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, wait: str
) -> None:
    """The case seen: `result()` on a queue no consumer serves, while a consumer on another queue reports, said nothing for 75 s.

    Now the wait warns once consumers have had time to report.
    """
    monkeypatch.setattr(progress, "STALL_FIRST_S", FIRST_S)
    consumer = Consumer(pool.queues, ["other"], concurrency=1, task_modules=MODULES)
    runner = threading.Thread(target=consumer.run, name="test-consumer")
    runner.start()
    try:
        wait_for(lambda: pool.queues.workers(), 10, "the consumer's first report")
        h = wt.add.publish(1, 2, _pool=pool)  # on 'jobs'
        caplog.set_level(logging.WARNING, "conveyor.client")
        with pytest.raises(TimeoutError):
            h.result(timeout=FIRST_S + 5.0) if wait == "result" else pool.join("jobs", timeout=FIRST_S + 5.0)
    finally:
        consumer.stop()
        runner.join(30)
    said = warnings(caplog)
    assert len(said) == 1, said
    assert "queue 'jobs'" in said[0] and "on 'other'" in said[0] and "--queues jobs" in said[0]
    assert "pass a timeout" not in said[0]  # it has one


@pytest.mark.parametrize(
    ("module", "cause"),
    [
        ("tests.no_such_task_module", "cannot import task module 'tests.no_such_task_module'"),
        ("tests.support.tasks_missing_dependency", "imports 'conveyor_test_no_such_dependency', which is not found: install"),
    ],
    ids=["module-missing", "dependency-missing"],
)
def test_consumers_that_cannot_start_fail_the_next_wait_with_their_error(pool: QueuePool, module: str, cause: str) -> None:
    """Consumers whose task module does not import fail the next wait, and all after, with their error.

    Consumers whose task module does not import: `result()` raises the pool's error, naming the
    cause, as soon as the pool gives up on them (not a TimeoutError with a hint to start consumers);
    and so does every wait after it, at once.
    """
    consumers = ConsumerPool(pool, 2, queues=["jobs"], task_modules=[module]).start()
    try:
        h = wt.add.publish(1, 2, _pool=pool)
        t0 = time.monotonic()
        with pytest.raises(ConveyorError, match="failed to start") as e:
            h.result(timeout=60)
        took = time.monotonic() - t0
        assert cause in str(e.value)
        assert took < START_FAILED_WITHIN_S, f"the start failure took {took:.1f} s to be said"
        for again in (lambda: pool.gather([h], timeout=60), lambda: pool.join("jobs", timeout=60), consumers.check):
            t0 = time.monotonic()
            with pytest.raises(ConveyorError, match="failed to start"):
                again()
            assert time.monotonic() - t0 < 5.0
    finally:
        consumers.cancel()


def test_a_wait_looks_after_only_the_consumer_pools_on_its_queues(pool: QueuePool) -> None:
    """A consumer pool that cannot start fails only waits on its own queues, and only in its `with` block.

    A consumer pool that cannot start, on 'jobs', fails the waits on 'jobs' but not a wait on a
    queue it does not serve (its error would point that wait the wrong way); and once its `with`
    block is left, no wait at all.
    """
    consumer = Consumer(pool.queues, ["other"], concurrency=1)
    runner = threading.Thread(target=consumer.run, name="test-consumer")
    runner.start()

    def gave_up(consumers: ConsumerPool) -> bool:
        try:
            consumers.check()
        except ConveyorError:
            return True
        return False

    try:
        with ConsumerPool(pool, 1, queues=["jobs"], task_modules=["tests.no_such_task_module"]) as failing:
            wait_for(lambda: gave_up(failing), START_FAILED_WITHIN_S, "the pool giving up on its consumers")
            assert pool.submit(operator.add, 1, 2, _queue="other").result(timeout=60) == 3
            with pytest.raises(ConveyorError, match="failed to start"):
                wt.add.publish(1, 2, _pool=pool).result(timeout=60)
        with pytest.raises(TimeoutError):  # nobody serves 'jobs' now: its own timeout, not the stopped pool's error
            wt.add.publish(1, 2, _pool=pool).result(timeout=1.0)
    finally:
        consumer.stop()
        runner.join(30)
