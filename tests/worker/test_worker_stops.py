"""`conveyor worker` stopped from every direction.

SIGTERM to its process group (`kill -TERM -PGID`), to every process it started (systemd's default
KillMode=control-group signals the whole cgroup), to its first process only, and Ctrl-C (SIGINT to
the group, as a terminal sends it). Running tasks finish and are acked, each task runs once, and the
worker exits within --shutdown-timeout; past it, what still runs is handed back.

The summary a stopped worker prints is `conveyor.worker.stats`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool
from conveyor.tasks.envelope import decode_result

from ..support import worker_tasks as wt
from ..support.procs import kill_tree, process_tree, wait_gone
from ..support.servers import wait_for
from ..support.worker_command import ROOT, start_worker, worker_args

NAP_S = 1.5  # how long each task runs: a stop lands while every slot runs one
SLOTS = 2  # tasks each consumer runs at once


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=1, data_dir=tmp_path / "data") as p:
        yield p


def runs(log: Path) -> tuple[Counter[int], Counter[int]]:
    """How many times each task started, and finished, as its log says."""
    said = re.findall(r"^(start|done) (\d+)$", log.read_text(), re.MULTILINE) if log.exists() else []
    return Counter(int(t) for w, t in said if w == "start"), Counter(int(t) for w, t in said if w == "done")


def stop(worker: subprocess.Popen[str], how: str) -> None:
    sig = signal.SIGINT if how == "ctrl-c" else signal.SIGTERM
    if how.startswith("parent"):
        os.kill(worker.pid, sig)
    elif how == "every-process":  # what systemd's KillMode=control-group does: each process of the cgroup
        for pid in process_tree(worker.pid):
            os.kill(pid, sig)
    else:  # "group", "ctrl-c"
        os.killpg(worker.pid, sig)


@pytest.mark.parametrize(
    ("how", "processes", "mode"),
    [
        ("group", "2", "thread"),
        ("group", "1", "process"),
        ("every-process", "2", "process"),
        ("every-process", "1", "thread"),
        ("parent", "2", "thread"),
        ("parent-until-empty", "2", "thread"),  # a worker meant to drain the queues, stopped before
        ("ctrl-c", "2", "thread"),
        ("ctrl-c", "1", "process"),
        ("group", "2", "async"),  # plain tasks, in the event loop's threads
    ],
)
def test_a_stop_lets_running_tasks_finish_and_acks_them(
    pool: QueuePool, tmp_path: Path, how: str, processes: str, mode: str
) -> None:
    log = tmp_path / "runs.log"
    n_running = int(processes) * SLOTS
    n = n_running + 2  # two wait for a slot when the stop comes: given back, run by the next worker
    handles = wt.naps.publish_many([(str(log), tag, NAP_S) for tag in range(n)], _pool=pool)
    until_empty = ["--until-empty"] if how.endswith("until-empty") else []
    worker = start_worker(
        pool.addresses, "--processes", processes, "--pool", mode, "--shutdown-timeout", "20", *until_empty, concurrency=SLOTS
    )
    try:
        # every slot runs a task (the tasks are long enough for a stop to land while they run)
        wait_for(lambda: sum(runs(log)[0].values()) >= n_running, timeout=60, what="every slot running a task")
        tree = process_tree(worker.pid)
        stop(worker, how)
        t0 = time.monotonic()
        _, stderr = worker.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if worker.poll() is None:
            kill_tree(worker)
    started, done = runs(log)
    assert worker.returncode == 0, stderr
    assert took < 20, f"the stop took {took:.1f} s: past --shutdown-timeout\n{stderr}"
    assert started == done and set(started.values()) == {1}, (started, done, stderr)  # each finished, once
    assert "the process that started it is gone" not in stderr and "Traceback" not in stderr, stderr
    summary = stderr.strip().splitlines()[-1]
    assert summary.startswith(f"processed {len(done)}, failed 0 (retried 0, dead 0)"), stderr
    st = pool.stats("jobs")["jobs"]
    assert (st.acked, st.failed, st.delivered) == (len(done), 0, 0)  # settled: acked, none handed back
    assert wait_gone(tree, timeout=20) == [], "processes outlived the worker"
    # the next worker runs the rest: every task ran exactly once
    drain = [*worker.args, *([] if until_empty else ["--until-empty"])]
    out = subprocess.run(drain, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    started, done = runs(log)
    assert started == done == Counter(range(n))
    assert [decode_result(r) for r in pool.queues.result("jobs", [h.id for h in handles])] == list(range(n))


@pytest.mark.parametrize(("how", "processes"), [("shutdown-timeout", "2"), ("second-signal", "1")])
def test_tasks_still_running_at_the_end_of_a_stop_are_handed_back_without_counting_an_attempt(
    pool: QueuePool, tmp_path: Path, how: str, processes: str
) -> None:
    """Tasks still running at the end of a stop go back to their queue, the attempt not counted.

    Tasks still running past --shutdown-timeout, or at a second signal (one process): handed back to
    their queue for another worker, the attempt not counted (the worker stopped, the task did not
    fail: these have no retries, and a counted attempt would make them dead letters).
    """
    log, err = tmp_path / "runs.log", tmp_path / "worker.err"
    n = int(processes) * SLOTS
    wt.naps.publish_many([(str(log), tag, 60.0) for tag in range(n)], _pool=pool)
    timeout = "1" if how == "shutdown-timeout" else "60"
    with err.open("w") as stderr_file:
        worker = start_worker(
            pool.addresses, "--processes", processes, "--shutdown-timeout", timeout, concurrency=SLOTS, stderr=stderr_file
        )
    try:
        wait_for(lambda: sum(runs(log)[0].values()) == n, timeout=60, what="every slot running a task")
        os.killpg(worker.pid, signal.SIGTERM)
        t0 = time.monotonic()
        if how == "second-signal":  # once the first is heard
            wait_for(lambda: "stopping: finishing running tasks" in err.read_text(), timeout=30, what="the first stop said")
            os.kill(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if worker.poll() is None:
            kill_tree(worker)
    stderr = err.read_text()
    assert worker.returncode == 0, stderr
    assert took < 15, f"the stop took {took:.1f} s"  # at once, or 1 s and then the hand-back (a task would take 60)
    if how == "shutdown-timeout":
        assert "running tasks are handed back" in stderr
    summary = stderr.strip().splitlines()[-1]
    assert re.match(rf"processed 0, failed 0 \(retried 0, dead 0\).*, handed back {n} ", summary), stderr
    st = pool.stats("jobs")["jobs"]
    assert (st.acked, st.failed, st.ready) == (0, 0, n)  # back in the queue at once, for another worker
    again = pool.queues.get("jobs", n, lease_s=60)
    assert sorted(m.attempts for m in again) == [1] * n  # this delivery is their first counted attempt


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_what_a_task_starts_can_be_terminated(pool: QueuePool, mode: str) -> None:
    """What a task starts, a program it runs or a process it forks, ends on SIGTERM as anywhere else.

    A stop reaches the consumers, which end their task processes themselves (those ignore systemd's
    SIGTERM to every process), but what a task starts keeps the default: a program it runs, or a
    process it forks, ends on SIGTERM as anywhere else (`Popen.terminate`, `Process.terminate`).
    """
    handle = wt.terminates_its_children.publish(_pool=pool)
    drain = worker_args(pool.addresses, "--pool", mode, "--until-empty", concurrency=SLOTS)
    out = subprocess.run(drain, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert handle.result(timeout=10) == [-signal.SIGTERM, -signal.SIGTERM]
