"""Async tasks (`conveyor.worker.async_slots`): coroutines on one event loop per consumer (pool="async"), on real servers.

Many calls in flight at little CPU, time limits that cancel, retries and dead letters as for plain
tasks, plain tasks beside them in threads of their own (abandoned over their time limit, never
keeping the program from exiting), async tasks in thread and process slots, and stops that lose
nothing.
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool
from conveyor.constants import DEFAULT_ASYNC_CONCURRENCY
from conveyor.errors import ConveyorError, TaskFailedError
from conveyor.message import Message
from conveyor.worker import Consumer, async_slots
from conveyor.worker.affinity import resolve_slots
from conveyor.worker.async_slots import AsyncSlots
from conveyor.worker.completions import Completions
from conveyor.worker.executors import Completion

from ..support import async_tasks as at
from ..support.docs import run_example, section_code
from ..support.servers import wait_for

MODULES = ["tests.support.async_tasks"]


@pytest.fixture
def pool() -> Iterator[QueuePool]:
    at.IN_FLIGHT.reset()
    with QueuePool.local(n_servers=2) as p:
        yield p


def consume(pool: QueuePool, /, **kw: object) -> Consumer:
    """Run a consumer of async slots on 'jobs' in this thread until the queue is drained."""
    options: dict[str, object] = {"pool": "async", "until_empty": True, "task_modules": MODULES}
    options.update(kw)
    c = Consumer(pool.queues, ["jobs"], **options)  # type: ignore[arg-type]
    c.run()
    return c


def said(log: Path) -> Counter[str]:
    """How often each line was noted in `log`."""
    return Counter(log.read_text().splitlines() if log.exists() else [])


def test_the_default_concurrency_of_async_slots_is_for_io() -> None:
    assert resolve_slots(None, "async", 1) == (DEFAULT_ASYNC_CONCURRENCY, True)
    assert resolve_slots(40, "async", 1) == (40, False)


def test_hundreds_of_calls_wait_at_once_on_one_loop(pool: QueuePool) -> None:
    """600 calls of 1 s each: one consumer has 500 or more in flight, and ends far under the 600 s they take one by one."""
    handles = at.naps.publish_many([(1.0,)] * 600, _pool=pool)
    t0 = time.monotonic()
    c = consume(pool, concurrency=600)
    took = time.monotonic() - t0
    assert pool.gather(handles, timeout=30) == [1.0] * 600
    assert at.IN_FLIGHT.most >= 500, at.IN_FLIGHT.most
    assert took < 60, f"600 calls of 1 s took {took:.1f} s"  # ~1 s on an idle machine; bound for a loaded one
    assert c.stats.processed == 600


def test_a_consumer_whose_calls_all_wait_uses_next_to_no_cpu(pool: QueuePool) -> None:
    """300 calls sleeping 2 s: the consumer's process spends well under half a second of CPU on them.

    The servers are processes of their own; what this process spends while the consumer runs is the
    consumer's (its loop, its event loop, its settler): no thread polls.
    """
    handles = at.naps.publish_many([(2.0,)] * 300, _pool=pool)
    cpu0, t0 = time.process_time(), time.monotonic()
    consume(pool, concurrency=300)
    cpu, took = time.process_time() - cpu0, time.monotonic() - t0
    assert pool.gather(handles, timeout=30) == [2.0] * 300
    assert at.IN_FLIGHT.most >= 250, at.IN_FLIGHT.most  # they did wait together
    assert cpu < 0.5, f"{cpu:.2f} s of CPU over {took:.1f} s"


def test_a_call_over_its_time_limit_is_cancelled_retried_then_dead_lettered(pool: QueuePool, tmp_path: Path) -> None:
    log = tmp_path / "overruns.log"
    h = at.overruns.publish(str(log), _pool=pool)
    quick = at.naps.publish(0.01, _pool=pool)
    t0 = time.monotonic()
    c = consume(pool, concurrency=4)
    assert time.monotonic() - t0 < 30  # 3 attempts of 0.5 s, not 60 s each
    with pytest.raises(
        TaskFailedError, match=r"TimeLimitExceeded: the task ran over its time limit of 0\.5 s \(its call was cancelled\)"
    ):
        pool.gather([h])
    [dl] = pool.dead_letters("jobs")
    assert dl.message.id == h.id and dl.message.attempts == 3  # max_retries=2
    assert c.stats.timed_out == 3 and c.stats.dead == 1
    # each attempt's coroutine got CancelledError
    wait_for(lambda: said(log)["cancelled"] == 3, timeout=10, what="three cancellations noted")
    assert said(log) == Counter({"start 1": 1, "start 2": 1, "start 3": 1, "cancelled": 3})
    assert pool.gather([quick]) == [0.01]


def test_a_failing_call_is_retried_and_its_error_kept(pool: QueuePool) -> None:
    """Retries and dead letters as for plain tasks; `current_message()` works inside a coroutine."""
    third = at.fails_before.publish(3, _pool=pool)
    bad = at.always_fails.publish(_pool=pool)
    c = consume(pool)
    assert pool.gather([third]) == [3]  # its own message said which attempt it was
    [dl] = pool.dead_letters("jobs")
    assert dl.message.id == bad.id and dl.message.attempts == 3
    assert dl.error.startswith("ValueError: this input is bad") and "Traceback" in dl.error
    assert (c.stats.retried, c.stats.dead, c.stats.processed) == (4, 1, 1)


def test_a_plain_task_runs_in_a_thread_of_its_own_and_holds_up_no_call(pool: QueuePool) -> None:
    blocking = at.blocks.publish(2.0, _pool=pool)
    quick = at.ends_at.publish_many([(0.1,)] * 20, _pool=pool)
    consume(pool)
    [b] = pool.gather([blocking])
    ends = pool.gather(quick)
    assert b["thread"].startswith("conveyor-task") and b["id"] == blocking.id  # current_message() there too
    assert max(ends) < b["end"] - 1.0, "the calls waited for the plain task"


def test_plain_tasks_past_their_time_limit_leave_their_threads_to_the_next(pool: QueuePool, tmp_path: Path) -> None:
    """concurrency=2: two plain tasks hang past their 1 s limit; the plain tasks after them run, in time.

    Abandoned, as thread slots abandon theirs, the hung tasks' threads are replaced: the next tasks'
    clocks start when a thread runs them, not while they wait behind the hung ones.
    """
    flag, published = tmp_path / "release", threading.Event()
    hung = at.hangs.publish_many([(str(flag),)] * 2, _pool=pool)
    c = Consumer(
        pool.queues,
        ["jobs"],
        pool="async",
        concurrency=2,
        until_empty=True,
        expect_more=lambda: not published.is_set(),  # not drained before the quick ones are in
        task_modules=MODULES,
    )
    t = threading.Thread(target=c.run, name="consumer-under-test")
    t.start()
    try:
        wait_for(lambda: at.IN_FLIGHT.now == 2, timeout=30, what="both plain tasks hanging")
        quick = at.takes.publish_many([(0.1,)] * 6, _pool=pool)
        published.set()
        t.join(60)  # the hung ones are abandoned after 1 s, and the quick ones take 0.1 s each, 2 at once
        # (waiting behind the hung ones, whose threads run on for 60 s, they would go past their 5 s)
        assert not t.is_alive()
        assert pool.gather(quick, timeout=10) == [0.1] * 6
        for h in hung:
            with pytest.raises(TaskFailedError, match=r"time limit of 1 s \(its thread was abandoned and may still be running\)"):
                pool.gather([h])
        assert (c.stats.timed_out, c.stats.processed) == (2, 6)
    finally:
        flag.touch()  # the hung tasks return: their threads end
        published.set()
        c.stop(graceful=False)
        t.join(30)


def test_a_hung_plain_task_does_not_keep_the_program_from_exiting(tmp_path: Path) -> None:
    """tests/support/async_hung_exit.py: a plain task sleeps for an hour; after a hard stop the program ends."""
    mark = tmp_path / "started"
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "support" / "async_hung_exit.py"), str(mark)],
        capture_output=True,
        text=True,
        timeout=120,  # the servers' start, the task's, the stop: seconds; a thread joined at exit: an hour
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_an_async_task_in_thread_and_process_slots_runs_on_a_loop_of_its_own(pool: QueuePool, mode: str) -> None:
    handles = at.where_it_ran.publish_many([()] * 4, _pool=pool)

    async def ad_hoc(x: int) -> int:
        return x * 2

    adhoc = pool.map(ad_hoc, range(5), _queue="jobs")
    consume(pool, pool=mode, concurrency=2)
    ran = pool.gather(handles)
    assert pool.gather(adhoc) == [0, 2, 4, 6, 8]
    assert all(r["thread"].startswith("conveyor-task") or mode == "process" for r in ran)


def test_an_ad_hoc_async_function_runs_on_the_consumers_loop(pool: QueuePool) -> None:
    async def ad_hoc(x: int) -> int:
        return x * 2

    handles = pool.map(ad_hoc, range(50), _queue="jobs")
    consume(pool)
    assert pool.gather(handles) == [2 * x for x in range(50)]


def _run_until_in_flight(pool: QueuePool, n: int, **kw: object) -> tuple[Consumer, threading.Thread]:
    """A consumer of async slots on 'jobs' in a thread of its own, once `n` of its calls are in flight."""
    c = Consumer(pool.queues, ["jobs"], pool="async", concurrency=100, task_modules=MODULES, **kw)  # type: ignore[arg-type]
    t = threading.Thread(target=c.run, name="consumer-under-test")
    t.start()
    wait_for(lambda: at.IN_FLIGHT.now == n, timeout=30, what=f"{n} calls in flight")
    return c, t


def test_a_graceful_stop_lets_the_calls_in_flight_finish(pool: QueuePool, tmp_path: Path) -> None:
    log, flag = tmp_path / "runs.log", tmp_path / "flag"
    handles = at.waits_for.publish_many([(str(log), str(flag), 1.0, i) for i in range(40)], _pool=pool)
    c, t = _run_until_in_flight(pool, 40)
    c.stop()
    t.join(30)  # the calls end in 1 s
    assert not t.is_alive()
    assert sorted(pool.gather(handles, timeout=10)) == list(range(40))
    assert (c.stats.processed, c.stats.handed_back) == (40, 0)
    assert said(log) == Counter({**{f"start {i}": 1 for i in range(40)}, **{f"done {i}": 1 for i in range(40)}})


@pytest.mark.parametrize("how", ["past-shutdown-timeout", "hard"])
def test_a_stop_cancels_the_calls_in_flight_and_hands_them_back(pool: QueuePool, tmp_path: Path, how: str) -> None:
    """Calls cut short by a stop (hard, or past the shutdown timeout) are cancelled and handed back: none is lost."""
    log, flag = tmp_path / "runs.log", tmp_path / "flag"
    handles = at.waits_for.publish_many([(str(log), str(flag), 60.0, i) for i in range(40)], _pool=pool)
    c, t = _run_until_in_flight(pool, 40, shutdown_timeout=0.5)
    t0 = time.monotonic()
    c.stop(graceful=how != "hard")
    t.join(30)  # at once (hard), or after 0.5 s: not the calls' 60 s
    assert not t.is_alive() and time.monotonic() - t0 < 20
    assert c.stats.handed_back == 40 and c.stats.processed == 0
    wait_for(lambda: sum(said(log)[f"cancelled {i}"] for i in range(40)) == 40, timeout=10, what="every call cancelled")
    flag.touch()  # from now on the calls return at once
    consume(pool, concurrency=100)
    assert sorted(pool.gather(handles, timeout=10)) == list(range(40))  # every message came back and ran
    assert all(said(log)[f"done {i}"] == 1 for i in range(40))


def test_the_example_in_the_docs_runs_as_written(tmp_path: Path) -> None:
    """docs/workers.md's "Async tasks" example, run as a script: 1,000 calls of 0.5 s at 256 in flight."""
    t0 = time.monotonic()
    done = run_example(section_code("workers.md", "## Async tasks"), tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sum(i * i for i in range(1000)))
    assert time.monotonic() - t0 < 60  # four rounds of 0.5 s, and the servers' start; 1,000 s one by one


def test_a_consumer_whose_event_loop_dies_stops_with_an_error_and_hands_its_messages_back(
    pool: QueuePool, tmp_path: Path
) -> None:
    """A task's SystemExit ends the loop: the consumer says so and ends, its message back in its queue."""
    flag = tmp_path / "flag"
    h = at.ends_the_loop.publish(str(flag), _pool=pool)
    c = Consumer(pool.queues, ["jobs"], pool="async", until_empty=True, task_modules=MODULES)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            c.run()
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=run, name="consumer-under-test")
    t.start()
    try:
        t.join(30)  # the call ends the loop at once; the consumer's sweep sees it within 0.05 s
        assert not t.is_alive(), "the consumer went on with a dead event loop"
    finally:
        c.stop(graceful=False)
        t.join(30)
    [e] = raised
    assert isinstance(e, ConveyorError)
    assert re.search(r"its event loop ended: SystemExit\('out of a task a call created'\) came out of it", str(e)), e
    assert c.stats.handed_back == 1 and c.stats.failed == 0
    flag.touch()  # from now on the task returns
    consume(pool)
    assert pool.gather([h], timeout=10) == ["ran"]  # its message came back, and ran


def leased(pool: QueuePool, n: int) -> list[Message]:
    """`n` messages of 'jobs', leased (from either server)."""
    got: list[Message] = []

    def more() -> bool:
        got.extend(pool.queues.get("jobs", n - len(got)))
        return len(got) == n

    wait_for(more, timeout=10, what=f"{n} messages leased")
    return got


def test_slots_closed_waiting_let_the_calls_and_the_line_end(pool: QueuePool) -> None:
    """close(wait=True), as thread slots: the calls end, and what waits in line runs, plain tasks too.

    So messages acked on delivery, which a stopping consumer puts back in line to run, are not dropped.
    """
    at.naps.publish_many([(0.2,)] * 4, _pool=pool)
    at.takes.publish_many([(0.1,)] * 2, _pool=pool)
    msgs = leased(pool, 6)
    done: Completions[Completion] = Completions()
    slots = AsyncSlots(2, done, None)
    slots.start()
    for m in msgs:
        slots.submit(m)
    slots.close(wait=True)  # at once: two calls run, four wait in line
    ran = done.take()
    assert sorted(c.message.id for c in ran) == sorted(m.id for m in msgs)
    assert [c.error for c in ran] == [None] * 6


def test_a_call_that_outlasts_its_cancel_is_awaited_before_the_loop_closes(
    pool: QueuePool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A call cancelled by a hard close, cleaning up for 1 s, ends before its loop closes: none is destroyed pending."""
    monkeypatch.setattr(async_slots, "CANCEL_WAIT_S", 0.2)  # the call's cleanup outlasts it five times
    log = tmp_path / "runs.log"
    at.outlasts_its_cancel.publish(str(log), _pool=pool)
    [m] = leased(pool, 1)
    done: Completions[Completion] = Completions()
    slots = AsyncSlots(4, done, None)
    slots.start()
    slots.submit(m)
    wait_for(lambda: said(log)["start"] == 1, timeout=10, what="the call started")
    slots.close(wait=False)
    wait_for(lambda: said(log)["ended"] == 1, timeout=10, what="the cancelled call's cleanup ended")
    del slots
    gc.collect()
    assert said(log) == Counter({"start": 1, "cancelled": 1, "ended": 1})
    assert "Task was destroyed" not in caplog.text
    assert "go on 0.2 s after their cancel" in caplog.text  # named while it went on
    assert done.take() == []  # cancelled: the consumer's to hand back


def test_the_leases_of_calls_in_flight_are_extended(pool: QueuePool, tmp_path: Path) -> None:
    """Calls of 3 s on a queue whose lease is 1 s: extended while they run, none comes back to run again."""
    pool.queues.declare("jobs", lease_s=1.0)
    log, flag = tmp_path / "runs.log", tmp_path / "flag"
    handles = at.waits_for.publish_many([(str(log), str(flag), 3.0, i) for i in range(50)], _pool=pool)
    consume(pool)
    assert sorted(pool.gather(handles, timeout=10)) == list(range(50))
    assert said(log) == Counter({**{f"start {i}": 1 for i in range(50)}, **{f"done {i}": 1 for i in range(50)}})
