"""A thread consumer whose concurrency is left out adds threads while its tasks wait (`conveyor.worker.thread_scaling`).

Real consumers on real servers: tasks that sleep get many more threads than the default 8, tasks
that compute keep 8; a concurrency given is kept whatever the tasks do.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from conveyor.client.pool import QueuePool
from conveyor.constants import DEFAULT_CONCURRENCY, IO_LOOK_S, IO_MAX_GROWTH, IO_MAX_THREADS
from conveyor.worker import Consumer
from conveyor.worker.thread_scaling import ThreadScaling

from ..support import scaling_tasks as st

pytestmark = pytest.mark.timeout(180)
MODULES = ["tests.support.scaling_tasks"]


@pytest.fixture
def pool() -> Iterator[QueuePool]:
    st.IN_FLIGHT.reset()
    with QueuePool.local(n_servers=1) as p:
        yield p


def consume(pool: QueuePool, **kw: object) -> Consumer:
    """A thread consumer of "scaling", run in this thread until the queue is drained."""
    c = Consumer(pool.queues, ["scaling"], until_empty=True, task_modules=MODULES, **kw)  # type: ignore[arg-type]
    c.run()
    return c


def test_the_threads_grow_after_a_look_with_all_busy_and_the_cpu_idle() -> None:
    s = ThreadScaling(8)
    start = time.monotonic()
    assert s.sweep(start + IO_LOOK_S / 2, running=8) is None  # the look is not over
    # all busy, this process next to idle: they wait, and grow by the most a look allows
    assert s.sweep(start + IO_LOOK_S * 1.1, running=8) == 8 * IO_MAX_GROWTH
    assert s.sweep(start + IO_LOOK_S * 1.5, running=3) is None  # threads free in this look: it says nothing
    assert s.sweep(start + IO_LOOK_S * 2.2, running=32) is None
    assert s.sweep(start + IO_LOOK_S * 3.3, running=32) == min(IO_MAX_THREADS, 32 * IO_MAX_GROWTH)


def test_a_busy_cpu_grows_no_threads() -> None:
    s = ThreadScaling(8)
    end = time.process_time() + IO_LOOK_S * 0.6  # this process computes for most of the look
    while time.process_time() < end:
        pass
    assert s.sweep(max(time.monotonic(), s._since + IO_LOOK_S), running=8) is None


def test_the_threads_stop_at_the_most() -> None:
    s = ThreadScaling(IO_MAX_THREADS // 2)
    start = time.monotonic()
    assert s.sweep(start + IO_LOOK_S * 1.1, running=IO_MAX_THREADS) == IO_MAX_THREADS
    assert s.sweep(start + IO_LOOK_S * 2.2, running=IO_MAX_THREADS) is None


def test_a_consumer_of_waiting_tasks_runs_many_more_than_eight_at_once(pool: QueuePool) -> None:
    """1,000 tasks of 0.25 s: 31 s on 8 threads; the consumer grows to 64 or more and ends far sooner."""
    handles = st.waits.publish_many([(0.25,)] * 1000, _pool=pool)
    t0 = time.monotonic()
    c = consume(pool)
    took = time.monotonic() - t0
    assert pool.gather(handles, timeout=30) == [0.25] * 1000
    assert c.slots >= 64 and st.IN_FLIGHT.most >= 64, (c.slots, st.IN_FLIGHT.most)
    assert took < 20, f"1,000 waits of 0.25 s took {took:.1f} s"  # ~6 s here; 31 s on 8 threads


def test_a_consumer_of_computing_tasks_keeps_its_threads(pool: QueuePool) -> None:
    """Tasks that keep a core busy (for 3 s in all, in Python) grow no threads."""
    handles = st.computes.publish_many([(0.02,)] * 150, _pool=pool)
    c = consume(pool)
    assert pool.gather(handles, timeout=60) == [0.02] * 150
    assert c.slots == DEFAULT_CONCURRENCY and st.IN_FLIGHT.most <= DEFAULT_CONCURRENCY, (c.slots, st.IN_FLIGHT.most)


def test_a_concurrency_given_is_kept(pool: QueuePool) -> None:
    handles = st.waits.publish_many([(0.25,)] * 48, _pool=pool)
    c = consume(pool, concurrency=4)
    assert pool.gather(handles, timeout=30) == [0.25] * 48
    assert c.slots == 4 and st.IN_FLIGHT.most <= 4
