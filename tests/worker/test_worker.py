"""Consumers against real queue servers.

Results, retries, dead letters, time limits, back-pressure, work stealing, graceful stops, and local
consumer pools surviving killed workers.

A consumer's connections are `conveyor.worker.connections`, its fetches `conveyor.worker.fetching`,
and processes that do not outlive their parent `conveyor.worker.lifelines`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool
from conveyor.constants import H_CONTENT_TYPE, H_TASK
from conveyor.errors import ConveyorError, TaskFailedError, TaskOptionError
from conveyor.message import Message, Status
from conveyor.protocol.report import ConsumerReport
from conveyor.tasks.envelope import encode_call
from conveyor.worker import Consumer, ConsumerPool, Middleware, QueueConfig, TaskFailure
from conveyor.worker.completions import Completions
from conveyor.worker.executors import Completion, ProcessSlots, ThreadSlots

from ..support import worker_tasks as wt
from ..support.graph_helpers import ROOT
from ..support.procs import process_tree, wait_gone
from ..support.servers import wait_for

MODULES = ["tests.support.worker_tasks"]


@pytest.fixture
def pool() -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=2) as p:
        yield p


def consume(pool: QueuePool, /, **kw: object) -> Consumer:
    """Run a consumer on 'jobs' in this thread until the queue is drained."""
    options: dict[str, object] = {"concurrency": 4, "until_empty": True, "task_modules": MODULES}
    options.update(kw)
    c = Consumer(pool.queues, kw.pop("queues", ["jobs"]), **options)  # type: ignore[arg-type]
    c.run()
    return c


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_function_and_class_tasks_run_with_results(pool: QueuePool, tmp_path: Path, mode: str) -> None:
    handles = wt.add.publish_many([(i, 10) for i in range(200)], _pool=pool)
    log_ok, log_bad = tmp_path / "ok.log", tmp_path / "bad.log"
    ok = wt.Hooked.publish({"log": str(log_ok), "user": "ada"}, 7, _pool=pool)
    bad = wt.Hooked.publish({"log": str(log_bad)}, 8, fail=True, _pool=pool)
    c = consume(pool, pool=mode)
    assert pool.gather(handles) == [i + 10 for i in range(200)]
    assert pool.gather([ok]) == [{"x": 7, "app_data": {"log": str(log_ok), "user": "ada"}}]
    with pytest.raises(TaskFailedError, match="RuntimeError: asked to fail"):
        pool.gather([bad])
    assert lines(log_ok) == ["before_run", "run_task 7 attempt 1", "after_run", "cleanup None"]
    assert lines(log_bad) == ["before_run", "run_task 8 attempt 1", "on_failure RuntimeError", "cleanup RuntimeError"]
    assert c.stats.processed == 201 and c.stats.failed == 1


def test_retries_are_counted_and_spaced_then_dead_lettered(pool: QueuePool, tmp_path: Path) -> None:
    log = tmp_path / "attempts.log"
    h = wt.always_fails.publish(str(log), _pool=pool)
    c = consume(pool)
    times = [float(t) for t in lines(log)]
    assert len(times) == 3  # max_retries=2: three attempts
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # retry_backoff=(0.2, 2): ceilings 0.2 then 0.4 s, "equal" jitter waits at least half of each
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2, gaps
    [dl] = pool.dead_letters("jobs")
    assert dl.message.id == h.id and dl.message.attempts == 3
    assert dl.error.startswith("ValueError: this input is bad") and "Traceback" in dl.error
    assert (c.stats.retried, c.stats.dead) == (2, 1)


def test_a_flaky_task_succeeds_on_a_retry(pool: QueuePool, tmp_path: Path) -> None:
    h = wt.flaky.publish(str(tmp_path / "f.log"), 2, _pool=pool)
    consume(pool)
    assert pool.gather([h]) == ["ok after 3"]


def test_errors_no_retry_can_mend_fail_at_once(pool: QueuePool) -> None:
    a = wt.fails_for_good.publish(_pool=pool)
    b = wt.listed_no_retry.publish(_pool=pool)
    payload, headers = encode_call("tests.support.worker_tasks.never_defined", (), {})
    [unknown] = pool.put(
        "jobs",
        [Message(payload=payload, headers={**headers, H_TASK: "tests.support.worker_tasks.never_defined"}, max_attempts=5)],
    )
    [garbage] = pool.put("jobs", [Message(payload=b"\xc1 not an envelope", headers={H_CONTENT_TYPE: "msgpack"}, max_attempts=5)])
    consume(pool)
    dead = {d.message.id: d for d in pool.dead_letters("jobs")}
    assert set(dead) == {a.id, b.id, unknown, garbage}
    assert all(d.message.attempts == 1 for d in dead.values())  # failed at once, not after 5 attempts
    assert "Unfixable: no retry can mend this" in dead[a.id].error
    assert "KeyError" in dead[b.id].error
    assert "unknown task 'tests.support.worker_tasks.never_defined'" in dead[unknown].error
    assert dead[garbage].error


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_time_limit_stops_the_task(pool: QueuePool, mode: str) -> None:
    slow = wt.sleeps.publish(5.0, _pool=pool)
    quick = wt.sleeps.publish(0.01, _pool=pool)
    t0 = time.monotonic()
    c = consume(pool, pool=mode, concurrency=1)
    assert time.monotonic() - t0 < 4  # the 5 s task did not hold the consumer
    with pytest.raises(TaskFailedError, match=r"TimeLimitExceeded: the task ran over its time limit of 0\.5 s") as e:
        pool.gather([slow])
    assert ("process was killed" if mode == "process" else "thread was abandoned") in e.value.error
    assert pool.gather([quick]) == [0.01]  # the slot was replaced and kept working
    assert c.stats.timed_out == 1


def test_a_task_that_hangs_on_every_attempt_ends_in_the_dead_letters_and_the_consumer_stops(pool: QueuePool) -> None:
    """A task hanging on every attempt ends in the dead letters, and the consumer stops without waiting.

    Each attempt's thread is abandoned in turn, though the first still hangs when the next starts
    (the same message id in two slots): the consumer then stops without waiting for any of them.
    """
    h = wt.hangs.publish(30.0, _pool=pool)
    t0 = time.monotonic()
    c = consume(pool, concurrency=2)
    assert time.monotonic() - t0 < 10  # 3 attempts of 0.3 s and short backoffs, not a hung thread's 30 s
    assert c.stats.timed_out == 3 and c.stats.dead == 1
    with pytest.raises(TaskFailedError, match="TimeLimitExceeded"):
        pool.gather([h])


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_messages_in_line_for_a_slot_have_not_started_and_can_be_taken_back(pool: QueuePool, mode: str) -> None:
    """A read-ahead message waits in line: it has not started, and a stopping consumer takes it back.

    It has no start time (its time limit has not begun), and a stopping consumer takes it back
    rather than running it.
    """
    wt.sleeps.publish_many([(0.5,), (0.01,), (0.01,)], _pool=pool)
    msgs = pool.queues.get("jobs", 3)
    done: Completions[Completion] = Completions()
    slots = ThreadSlots(1, done, None) if mode == "thread" else ProcessSlots(1, done, None, MODULES)
    slots.start()
    for m in msgs:
        slots.submit(m)
    wait_for(lambda: slots.started(msgs[0].key) is not None, timeout=5)
    assert slots.started(msgs[1].key) is None and slots.started(msgs[2].key) is None
    assert [m.id for m in slots.unstarted()] == [msgs[1].id, msgs[2].id]
    done.wait(5.0)
    assert [c.message.id for c in done.take()] == [msgs[0].id]
    assert slots.started(msgs[0].key) is None  # ended
    slots.close()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_slots_tell_apart_messages_of_two_queues_with_the_same_id(pool: QueuePool, mode: str) -> None:
    """Each queue numbers its own messages: the slots know a running message by (queue, id).

    So a time limit is measured, and a stop aimed, at the right one.
    """
    wt.sleeps.publish_many([(0.4,), (0.0,)], _pool=pool)
    a, quick = pool.queues.get("jobs", 2)
    b = dataclasses.replace(quick, queue="other", id=a.id)  # a quick task, numbered as `a` in another queue
    done: Completions[Completion] = Completions()
    slots = ThreadSlots(2, done, None) if mode == "thread" else ProcessSlots(2, done, None, MODULES)
    slots.start()
    slots.submit(a)
    wait_for(lambda: slots.started(a.key) is not None, timeout=5)
    assert slots.started(b.key) is None  # not started: only the other queue's message of that id is
    slots.submit(b)
    finished: list[Completion] = []

    def b_done() -> bool:
        done.wait(0.1)
        finished.extend(done.take())
        return any(c.message.key == b.key for c in finished)

    wait_for(b_done, timeout=5, what="b done")
    assert slots.started(a.key) is not None and slots.started(b.key) is None
    assert slots.stop_task(b.key) is None and slots.started(a.key) is not None  # a stop for b leaves a running
    slots.close()


def test_process_slots_that_cannot_replace_a_dead_child_say_so(pool: QueuePool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Process slots that cannot replace a dead child say why, for the consumer to stop on.

    A child dies and no replacement can start (the fork server gone, no descriptors left): the slots
    say why, for the consumer to stop on, rather than leaving what waits in line to wait for ever.
    """
    done: Completions[Completion] = Completions()
    slots = ProcessSlots(1, done, None, MODULES)
    slots.start()
    assert slots.broken is None
    child = next(iter(slots._children.values()))

    def cannot_start() -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(slots, "_spawn", cannot_start)
    os.kill(child.proc.pid, signal.SIGKILL)
    wait_for(lambda: slots.broken is not None, timeout=10)
    assert slots.broken is not None and "could not start a worker process" in slots.broken
    assert "Too many open files" in slots.broken
    slots.close()


def test_a_consumer_whose_slots_cannot_start_a_process_stops_and_says_why(
    pool: QueuePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer of those slots stops with their reason, not holding what is in line for ever.

    The message that killed the child is settled as it would be, the one behind it comes back.
    """
    poison = wt.kills_its_worker.publish(_pool=pool)
    after = wt.add.publish(1, 1, _pool=pool)
    spawn = ProcessSlots._spawn

    def only_the_first(self: ProcessSlots) -> object:
        monkeypatch.setattr(ProcessSlots, "_spawn", cannot_start)
        return spawn(self)

    def cannot_start(self: ProcessSlots) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(ProcessSlots, "_spawn", only_the_first)
    c = Consumer(pool.queues, ["jobs"], pool="process", concurrency=1, task_modules=MODULES)
    t0 = time.monotonic()
    with pytest.raises(ConveyorError, match=r"could not start a worker process.*Too many open files"):
        c.run()
    assert time.monotonic() - t0 < 30
    st = pool.stats("jobs")["jobs"]  # nothing stuck with the stopped consumer: the poison back for a retry, the other given back
    assert (st.acked, st.failed, st.delivered, st.ready + st.delayed) == (0, 0, 0, 2), st
    assert pool.queues.status("jobs", [poison.id, after.id]) == [Status.READY, Status.READY]


def test_process_mode_replaces_a_killed_child(pool: QueuePool) -> None:
    first = wt.pid_of_worker.publish(_pool=pool)
    consume(pool, pool="process", concurrency=1)
    [pid1] = pool.gather([first])
    wt.sleeps.publish(5.0, _pool=pool)  # killed at its time limit
    after = wt.pid_of_worker.publish(_pool=pool)
    consume(pool, pool="process", concurrency=1)
    [pid2] = pool.gather([after])
    assert pid1 != pid2 != os.getpid()


def test_back_pressure_fetches_only_what_it_can_start(pool: QueuePool) -> None:
    """Tasks too long for a read-ahead start as soon as they are fetched.

    Never more fetched and unfinished than there are slots.
    """
    wt.sleeps.publish_many([(0.25,)] * 12, _pool=pool)  # 8 a second: under one in the read-ahead window
    c = Consumer(pool.queues, ["jobs"], concurrency=2, batch_size=100, until_empty=True, task_modules=MODULES)
    seen: list[int] = []

    class Watch(Middleware):
        def deadline(self, message: Message, started: float) -> float | None:
            seen.append(len(c._running) + 1)  # the running ones, and this one, starting now
            return None

    c.middleware.insert(0, Watch())
    c.run()
    assert len(seen) == 12 and max(seen) == 2
    assert pool.stats("jobs")["jobs"].acked == 12


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_quick_tasks_are_read_ahead_in_large_fetches(pool: QueuePool, mode: str) -> None:
    """A consumer of quick tasks reads ahead in large fetches when the queue's batch size is left out.

    With the queue's batch size left out, a consumer of quick tasks holds more than its slots and
    fetches many at a time: far fewer fetches than the same consumer given a bound on what it holds
    (a fetch per few free slots), measured in the same run so that a busy machine slows both (in
    process mode too: a child that finishes starts the next in line at once). Enough tasks that the
    pace which sizes the read-ahead is measured over many looks, not one stall.
    """
    n = 10_000
    runs = {}
    for concurrency in (8, None):  # given: a bound on the messages held, so no read-ahead; left out: a read-ahead
        wt.add.publish_many([(i, 1) for i in range(n)], _pool=pool)
        runs[concurrency] = consume(pool, concurrency=concurrency, pool=mode)
        assert runs[concurrency].stats.processed == n
    assert pool.stats("jobs")["jobs"].acked == 2 * n
    bounded, ahead = runs[8], runs[None]
    assert bounded.reads_ahead is False and ahead.reads_ahead is True
    assert ahead.stats.fetches * 5 < bounded.stats.fetches, (ahead.stats.fetches, bounded.stats.fetches)


def test_a_consumer_steals_from_other_shards(pool: QueuePool) -> None:
    handles = wt.add.publish_many([(i, 1) for i in range(30)], _pool=pool)
    shards = {pool.queues.split_id(h.id)[0] for h in handles}
    assert shards == {0}  # one batch: all on shard 0
    c = consume(pool, consumer=1, n_consumers=2)  # assigned shard 1, which is empty
    assert c.shards[0] == 1 and c.stats.stolen == 30
    assert pool.gather(handles) == [i + 1 for i in range(30)]


def test_graceful_stop_finishes_running_tasks_and_leaves_the_rest(pool: QueuePool, tmp_path: Path) -> None:
    log, release = tmp_path / "runs.log", tmp_path / "release"
    handles = wt.starts_then_waits_for_file.publish_many([(str(log), str(release), 30.0)] * 10, _pool=pool)
    c = Consumer(pool.queues, ["jobs"], concurrency=2, task_modules=MODULES)
    t = threading.Thread(target=c.run)
    t.start()
    # started, not only delivered: a stopping consumer gives back what it holds but has not started
    wait_for(lambda: lines(log) == ["started"] * 2, what="two tasks running")
    c.stop()
    release.touch()  # the running two may finish now; the stop is asked before they do
    t.join(10)
    assert not t.is_alive()
    st = pool.stats("jobs")["jobs"]
    assert (st.acked, st.delivered, st.ready) == (2, 0, 8)  # the running two finished; nothing else taken
    assert sorted(lines(log)) == ["done"] * 2 + ["started"] * 2
    statuses = pool.queues.status("jobs", [h.id for h in handles])
    assert sum(s is not None and s.name == "READY" for s in statuses) == 8
    # the untouched eight were never delivered: a later consumer gets them on their first attempt
    got = pool.queues.get("jobs", 10)
    assert all(m.attempts == 1 for m in got)


def test_publish_rejects_a_time_limit_at_the_queue_visibility_timeout(pool: QueuePool) -> None:
    pool.queues.declare("jobs", lease_s=0.5)
    with pytest.raises(TaskOptionError, match="must be below the visibility timeout"):
        wt.sleeps.publish(1.0, _pool=pool)  # time_limit 0.5 s is not below a 0.5 s lease
    configured = QueuePool(pool.queues, queue_configs=[QueueConfig("jobs", visibility_timeout_sec=60)])
    wt.sleeps.publish(0.01, _pool=configured)  # its configuration wins over the lease (not closed: its client is the fixture's)


def test_submit_and_map_ad_hoc_callables(pool: QueuePool) -> None:
    factor = 3
    hs = pool.map(lambda x: x * factor, range(50), _queue="jobs")
    h = pool.submit(divmod, 17, 5, _queue="jobs")
    bad = pool.submit(int, "not a number", _queue="jobs", _max_retries=0)
    consume(pool, pool="process")
    assert pool.gather(hs) == [x * 3 for x in range(50)]
    assert pool.gather([h]) == [(3, 2)]
    with pytest.raises(TaskFailedError, match="ValueError"):
        pool.gather([bad])
    assert len(pool._blobs_sent) == 3  # the lambda went to the servers once, not 50 times


def test_a_function_bigger_than_a_frame_reaches_the_consumers(pool: QueuePool) -> None:
    """A model kept in a closure past the 64 MiB frame (80 MiB) is stored in chunks, once, and runs."""
    model = os.urandom(80 * 2**20)
    hs = pool.map(lambda i: model[i], range(20), _queue="jobs")
    consume(pool)
    assert pool.gather(hs) == [model[i] for i in range(20)]


def test_workers_report_their_counts(pool: QueuePool) -> None:
    wt.add.publish_many([(1, 2)] * 20, _pool=pool)
    c = consume(pool, name="w-under-test")
    w = pool.queues.workers()["w-under-test"]
    assert w["processed"] == 20 and w["failed"] == 0 and w["seen"] < 30
    assert c.stats.fetched_by_shard == {0: 20}
    assert ConsumerReport.from_counts("w-under-test", w).ended  # its last report: done with its queues


def test_a_stopped_consumer_says_it_ended_and_a_running_one_does_not(pool: QueuePool) -> None:
    c = Consumer(pool.queues, ["jobs"], concurrency=2, name="stopped", task_modules=MODULES)
    t = threading.Thread(target=c.run, daemon=True)
    t.start()
    try:
        got = wait_for(lambda: pool.queues.workers().get("stopped"), what="its first report")
        assert not ConsumerReport.from_counts("stopped", got).ended
    finally:
        c.stop()
        t.join(30)
    assert not t.is_alive()
    assert ConsumerReport.from_counts("stopped", pool.queues.workers()["stopped"]).ended


# --- local consumer pools ------------------------------------------------------------------------
def test_consumers_see_the_environment_as_it_is_when_the_pool_starts(pool: QueuePool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Consumers fork from a server started as the pool is made: what changed since still reaches them."""
    cp = ConsumerPool(pool, 1, queues=["jobs"], task_modules=MODULES)
    monkeypatch.setenv("CONVEYOR_TEST_LATE", "set after the pool was made")
    h = wt.env_of_worker.publish("CONVEYOR_TEST_LATE", _pool=pool)
    with cp:
        cp.join(timeout=60, progress=False)
    assert h.result(timeout=10) == "set after the pool was made"


def test_consumer_pool_results_and_failures(pool: QueuePool) -> None:
    handles = wt.add.publish_many([(i, i) for i in range(100)], _pool=pool)
    bad = wt.fails_for_good.publish(_pool=pool)
    with ConsumerPool(pool, 2, queues=["jobs"], task_modules=MODULES) as cp:
        st = cp.join(timeout=60, progress=False)
        results = dict(cp.results())
    assert st["jobs"].acked == 100 and st["jobs"].failed == 1
    assert (cp.stats.processed, cp.stats.failed, cp.stats.dead) == (100, 1, 1)  # summed as the consumers stopped
    assert {results[h.id] for h in handles} == {2 * i for i in range(100)}
    assert isinstance(results[bad.id], TaskFailure) and "no retry can mend this" in str(results[bad.id])
    assert all(not p.is_alive() for p in cp.processes)


def test_sigkilled_consumer_loses_nothing_and_runs_each_task_to_completion_once(pool: QueuePool, tmp_path: Path) -> None:
    pool.queues.declare("jobs", lease_s=1.0)  # the killed consumer's tasks come back after 1 s
    log = tmp_path / "done.log"
    handles = wt.slow_once.publish_many([(str(log), 0.3)] * 12, _pool=pool)
    cp = ConsumerPool(pool, 2, queues=["jobs"], concurrency=2, task_modules=MODULES).start()
    try:
        wait_for(lambda: pool.stats("jobs")["jobs"].delivered >= 3, what="tasks running")
        victim = cp.processes[0]
        os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
        cp.join(timeout=60, progress=False)
    finally:
        cp.cancel()
    assert cp.restarts == 1
    results = dict(cp.results())
    assert sorted(results) == sorted(h.id for h in handles)  # exactly one result per task
    assert set(results.values()) == {"finished"}
    assert len(lines(log)) >= 12  # some ran twice (killed mid-task), each message acked once


def test_a_stop_does_not_wait_on_a_killed_server(pool: QueuePool) -> None:
    """A stop does not wait on a SIGKILLed server, which its wake cannot reach.

    `cancel` neither waits on it nor fails, and the consumers idle in long polls stop all the same.
    """
    pool.queues.declare("jobs")
    cp = ConsumerPool(pool, 2, queues=["jobs"], task_modules=MODULES).start()
    try:
        wait_for(lambda: len(pool.queues.workers()) == 2, what="both consumers polling")
        victim = pool.servers.processes[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        t0 = time.monotonic()
        cp.cancel()
        took = time.monotonic() - t0
    finally:
        cp.cancel()
    assert took < 5, f"the stop took {took:.1f} s"
    assert all(not p.is_alive() for p in cp.processes)
    assert pool.queues.clients[0].ping() is not None  # the live server is untouched


@pytest.mark.parametrize("case", ["kept", "temporary", "forked"])
def test_servers_and_consumers_do_not_outlive_their_pool_process(tmp_path: Path, case: str) -> None:
    """Servers and consumers exit soon after the process that started them is SIGKILLed mid-task.

    SIGKILL the process that started a local pool and its consumers mid-task: every process it
    started exits soon after, even when a child it forked still holds the pipes they watch; the
    queue still holds every task (none acked, none lost), or, in temporary directories, those are
    removed.
    """
    data_dir = "-" if case == "temporary" else tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    job = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "support" / "pool_job.py"),
            str(data_dir),
            str(tmp_path / "done.log"),
            "8",
            *(["fork"] if case == "forked" else []),
        ],
        stdout=subprocess.PIPE,
        env=env,
    )
    forked = 0
    try:
        assert job.stdout is not None
        assert select.select([job.stdout], [], [], 60)[0], "the pool did not start within 60 s"
        started = json.loads(job.stdout.readline())
        forked = started["forked"]
        descendants = [p for p in process_tree(job.pid)[1:] if p != forked]  # servers, consumers, helpers
        assert set(started["servers"] + started["consumers"]) <= set(descendants)
    finally:
        job.kill()
        job.wait()
        job.stdout.close()  # type: ignore[union-attr]
    # with a forked child alive, multiprocessing's own helpers (forkserver, resource tracker) wait
    # for it as well: they watch pipes it holds; ours must go regardless
    must_go = started["servers"] + started["consumers"] if case == "forked" else descendants
    try:
        assert wait_gone(must_go, timeout=20) == [], "processes outlived the process that started them"
    finally:
        if forked:
            os.kill(forked, signal.SIGKILL)
    if case == "temporary":
        assert len(started["temporary"]) == 2 and not any(Path(d).exists() for d in started["temporary"])
        return
    with QueuePool.local(2, data_dir=tmp_path / "data") as again:
        st = again.stats("jobs")["jobs"]
    assert st.acked + st.pending == 8 and st.failed == 0


def test_a_task_that_kills_its_worker_ends_in_the_dead_letters(pool: QueuePool) -> None:
    pool.queues.declare("jobs", lease_s=600)  # never waited out: a dead consumer's leases end with its connections
    poison = wt.kills_its_worker.publish(_pool=pool)  # max_retries=2: three attempts, each killing a consumer
    good = wt.add.publish_many([(i, 0) for i in range(40)], _pool=pool)
    with ConsumerPool(pool, 2, queues=["jobs"], concurrency=1, task_modules=MODULES) as cp:
        cp.join(timeout=90, progress=False)
        results = dict(cp.results())
    # three attempts take three consumer lives: the two it started with and at least one restart (the
    # last deaths may end the work before the pool sees them: two can come within one look of its join)
    assert cp.restarts >= 1
    assert isinstance(results[poison.id], TaskFailure)
    assert "its consumer's connection closed on its last attempt (3 of 3)" in results[poison.id].error
    assert [results[h.id] for h in good] == list(range(40))


def test_in_process_mode_a_dying_child_is_a_retried_failure(pool: QueuePool) -> None:
    poison = wt.kills_its_worker.publish(_pool=pool)
    after = wt.add.publish(1, 1, _pool=pool)
    c = consume(pool, pool="process", concurrency=1)
    [dl] = pool.dead_letters("jobs")
    assert dl.message.id == poison.id and dl.message.attempts == 3 and "WorkerDied" in dl.error and "13" in dl.error
    assert pool.gather([after]) == [2] and c.stats.dead == 1


def test_publishing_with_a_key_twice_runs_the_task_once(pool: QueuePool) -> None:
    a = wt.add.publish(1, 2, _key="sum-1-2", _pool=pool)
    b = wt.add.publish(1, 2, _key="sum-1-2", _pool=pool)
    assert a == b
    consume(pool)
    assert pool.stats("jobs")["jobs"].acked == 1 and pool.gather([a, b]) == [3, 3]


SCRIPT = """
import sys
from conveyor.client.pool import QueuePool
from conveyor.worker import Consumer, ConsumerPool

def main():
    with QueuePool.local(n_servers=1) as pool:
        handles = pool.map(abs, [-1, -2, -3], _queue="jobs")
        if sys.argv[1] == "process-mode":
            Consumer(pool.queues, ["jobs"], concurrency=2, pool="process", until_empty=True).run()
        else:
            with ConsumerPool(pool, 2, queues=["jobs"], concurrency=1) as workers:
                workers.join(timeout=120, progress=False)
                print("stats:", workers.stats.processed, "restarts:", workers.restarts)
        print("results:", pool.gather(handles))
"""


@pytest.mark.parametrize("how", ["pool", "process-mode"])
@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "unguarded"])
def test_a_script_without_the_main_guard_fails_once_with_a_clear_error(tmp_path: Path, guarded: bool, how: str) -> None:
    """A script without the main guard fails, saying why, instead of restarting its processes forever.

    Consumer processes, and the task processes of a consumer in process mode, import the main module
    again: without the guard each one runs the script and dies before it starts. After a few such
    deaths in a row the script fails, saying why, instead of restarting them forever; with the guard
    the same script runs.
    """
    script = tmp_path / "job.py"
    script.write_text(SCRIPT + ('\nif __name__ == "__main__":\n    main()\n' if guarded else "\nmain()\n"))
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    if guarded:
        assert out.returncode == 0, out.stderr[-3000:]
        assert "results: [1, 2, 3]" in out.stdout
        assert how != "pool" or "stats: 3 restarts: 0" in out.stdout
        return
    assert out.returncode == 1 and "results:" not in out.stdout
    what = "consumer process" if how == "pool" else "worker process"
    assert re.search(f"{what} [0-9]* ?exited 3 times in a row before it started", out.stderr), out.stderr[-3000:]
    assert 'without the `if __name__ == "__main__":` guard' in out.stderr
    if how == "pool":  # each of the two consumers was restarted at most twice, then the pool gave up
        assert 2 <= out.stderr.count("before it started; restarting it") <= 4
    assert time.monotonic() - started < 90
