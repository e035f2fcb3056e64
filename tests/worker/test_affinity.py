"""Pinning thread-mode consumers to cores of their own.

The lock files that share the cores out (also across processes, and after a SIGKILL), the masks set
and restored, and consumers that run their tasks pinned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool
from conveyor.constants import DEFAULT_CONCURRENCY
from conveyor.worker import Consumer, ConsumerOptions, ConsumerPool
from conveyor.worker.affinity import CORE_LOCK_DIR_ENV, CorePin, auto_pin, default_slots, pin_core, resolve_slots

from ..support import worker_tasks as wt
from ..support.servers import wait_for

CORES = sorted(os.sched_getaffinity(0))


def in_thread(fn, *args):  # type: ignore[no-untyped-def]
    """fn(*args) in a new thread (a pin holds the calling thread); its return value and the thread's cores afterwards."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.extend([fn(*args), sorted(os.sched_getaffinity(0))]))
    t.start()
    t.join(30)
    assert not t.is_alive()
    return out


@pytest.fixture
def pool() -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=2) as p:
        yield p


def test_each_pin_takes_a_core_no_one_holds_and_release_gives_it_back(tmp_path: Path) -> None:
    pins: list[CorePin] = []
    for _ in CORES:
        pin, mask = in_thread(pin_core, tmp_path)
        assert isinstance(pin, CorePin) and mask == [pin.core]
        pins.append(pin)
    assert sorted(p.core for p in pins) == CORES  # one consumer per core
    assert in_thread(pin_core, tmp_path)[0] is None  # every core held: unpinned, not doubled up
    pins[0].release()
    pins[0].release()  # twice is harmless
    again = in_thread(pin_core, tmp_path)[0]
    assert isinstance(again, CorePin) and again.core == pins[0].core
    for p in [again, *pins[1:]]:
        p.release()


def test_release_restores_the_threads_cores(tmp_path: Path) -> None:
    def pin_then_release() -> tuple[int, list[int]]:
        pin = pin_core(tmp_path)
        assert pin is not None
        pinned = sorted(os.sched_getaffinity(0))
        pin.release()
        return pin.core, pinned

    (core, pinned), after = in_thread(pin_then_release)
    assert pinned == [core] and after == CORES


def test_a_core_held_by_a_killed_process_is_free_again(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; from conveyor.worker.affinity import pin_core; "
        "p = pin_core(Path(sys.argv[1])); print(p.core, flush=True); time.sleep(600)"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        held = int(child.stdout.readline())
        mine = [in_thread(pin_core, tmp_path)[0] for _ in CORES[1:]]
        assert held not in [p.core for p in mine if p is not None]  # another process's core is left alone
        assert in_thread(pin_core, tmp_path)[0] is None
        for p in mine:
            p.release()  # type: ignore[union-attr]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        child.stdout.close()  # type: ignore[union-attr]
    pins = [in_thread(pin_core, tmp_path)[0] for _ in CORES]  # the kernel dropped the dead process's lock
    assert sorted(p.core for p in pins) == CORES  # type: ignore[union-attr]
    for p in pins:
        p.release()  # type: ignore[union-attr]


def test_by_default_consumers_pin_when_there_is_one_per_core(pool: QueuePool) -> None:
    assert auto_pin(None, "thread", consumers=2, cores=2) is True
    assert auto_pin(None, "thread", consumers=3, cores=2) is True  # the third runs unpinned (no core left)
    assert auto_pin(None, "thread", consumers=1, cores=2) is False  # cores to spare: left free to use several
    assert auto_pin(None, "process", consumers=4, cores=2) is False  # the OS spreads task processes
    assert auto_pin(False, "thread", consumers=2, cores=2) is False and auto_pin(True, "thread", 1, 8) is True
    with pytest.raises(ValueError, match="pin_core is for pool='thread'"):
        auto_pin(True, "process", consumers=2, cores=2)
    cores = len(os.sched_getaffinity(0))
    assert ConsumerPool(pool, cores).options.pin_core is True  # resolved here, told to each consumer
    assert ConsumerPool(pool, cores, pin_core=False).options.pin_core is False


def test_by_default_a_consumer_has_8_threads_or_a_process_per_core_of_its_share_plus_one(pool: QueuePool) -> None:
    assert default_slots("thread", consumers=2, cores=2) == DEFAULT_CONCURRENCY
    assert default_slots("process", consumers=1, cores=1) == 2  # a Spark consumer: its task slot's core
    assert default_slots("process", consumers=2, cores=16) == 9
    assert default_slots("process", consumers=4, cores=2) == 2  # never fewer than one core's worth
    assert ConsumerPool(pool, 1, pool="process").options.concurrency == default_slots("process", 1)
    assert ConsumerPool(pool, 1, pool="process", concurrency=5).options.concurrency == 5


def test_slots_left_out_read_ahead_and_slots_given_bound_what_is_held(pool: QueuePool) -> None:
    assert resolve_slots(None, "thread", consumers=2, cores=2) == (DEFAULT_CONCURRENCY, True)
    assert resolve_slots(None, "process", consumers=1, cores=1) == (2, True)
    assert resolve_slots(3, "thread", consumers=2) == (3, False)
    with pytest.raises(ValueError, match=r"concurrency must be an integer >= 1 .*got 0"):
        ConsumerPool(pool, 1, concurrency=0)
    assert ConsumerPool(pool, 1)._wiring.slots_defaulted is True
    assert ConsumerPool(pool, 1, concurrency=8)._wiring.slots_defaulted is False
    assert Consumer(pool.queues, ["jobs"]).reads_ahead and not Consumer(pool.queues, ["jobs"], concurrency=8).reads_ahead


def test_pinning_is_refused_for_the_process_pool(pool: QueuePool) -> None:
    with pytest.raises(ValueError, match="pin_core is for pool='thread'"):
        Consumer(pool.queues, ["jobs"], pool="process", pin_core=True)
    with pytest.raises(ValueError, match="pin_core is for pool='thread'"):
        ConsumerPool(pool, 1, queues=["jobs"], pool="process", pin_core=True)
    with pytest.raises(ValueError, match="pin_core is for pool='thread'"):
        ConsumerOptions(concurrency=8, pool="process", pin_core=True)  # SparkConsumerPool and map: on the driver


def test_a_pinned_consumer_runs_its_tasks_on_its_core_then_unpins(
    pool: QueuePool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the lock files of this test only
    handles = wt.cores_of_worker.publish_many([() for _ in range(20)], _pool=pool)

    def run() -> None:
        Consumer(
            pool.queues, ["jobs"], concurrency=4, until_empty=True, pin_core=True, task_modules=["tests.support.worker_tasks"]
        ).run()

    _, after = in_thread(run)
    masks = {tuple(cores) for _, cores in pool.gather(handles)}
    assert len(masks) == 1 and len(next(iter(masks))) == 1  # all on the one core it took
    assert after == CORES  # the thread that ran the consumer has its cores back
    free = in_thread(pin_core, tmp_path)[0]
    assert isinstance(free, CorePin)  # and the core is free again
    free.release()


def test_a_pinned_consumer_holds_fewer_tasks_as_the_queue_drains(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One of 2 pinned consumers holds at most half its share of what is left in the queue.

    With 16 slots and batches of 8, a pinned consumer would run 16 tasks at once; one of 2 consumers
    holds at most half its share of what is left, so the last tasks wait in the queue for whichever
    consumer frees a slot first.
    """
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with QueuePool.local(n_servers=1) as pool:
        handles = wt.running_at_start.publish_many([(0.05,) for _ in range(40)], _pool=pool)
        assert pool.queues.clients[0].get("jobs", 0).left == 40  # what a get tells of the queue
        consumer = Consumer(
            pool.queues,
            ["jobs"],
            n_consumers=2,
            concurrency=16,
            batch_size=8,
            until_empty=True,
            pin_core=True,
            task_modules=["tests.support.worker_tasks"],
        )
        stats = in_thread(consumer.run)[0]
        at_once = pool.gather(handles)
    assert stats.processed == 40
    assert max(at_once) <= 8  # after the first batch of 8, 32 left: hold 8, not 16
    assert max(at_once[-4:]) <= 2  # the last ones: 2 at a time


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores to show two consumers on two of them")
def test_a_pool_of_pinned_consumers_spreads_over_the_cores(
    pool: QueuePool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each consumer of the pool on a core of its own.

    The pool's lock files are its own: pinned consumers elsewhere on this host (another test run, a
    benchmark) would hold cores, and a consumer with none free runs unpinned, as it should (tested
    above).
    """
    monkeypatch.setenv(CORE_LOCK_DIR_ENV, str(tmp_path))
    with ConsumerPool(
        pool, 2, queues=["jobs"], concurrency=2, batch_size=1, pin_core=True, task_modules=["tests.support.worker_tasks"]
    ) as cp:
        # both consumers pinned and polling before there is work, however long a busy machine takes to start
        # them: one started late would find the queue drained by the other
        wait_for(lambda: len(pool.queues.workers()) == 2, timeout=60, what="both consumers reporting")
        # tasks that wait a little, so that both consumers take some while the other runs
        handles = wt.cores_of_worker.publish_many([(0.05,) for _ in range(40)], _pool=pool)
        cp.join(timeout=60, progress=False)
    by_pid: dict[int, set[tuple[int, ...]]] = {}
    for pid, cores in pool.gather(handles):
        by_pid.setdefault(pid, set()).add(tuple(cores))
    assert len(by_pid) == 2
    masks = [m for ms in by_pid.values() for m in ms]
    assert all(len(m) == 1 for m in masks) and len(set(masks)) == 2  # each on a core, not the same one
