"""The driver's watch over a Spark job (`conveyor.spark.watch.JobWatch`), on local Spark and real servers.

The watch ends a job, with its reason in place of Spark's cancellation error, when a queue server
stays out of reach past `unreachable_s` or when no task of the job starts within `start_timeout_s`;
a job whose tasks run is left alone. Given `finished`, it also ends a job whose work is all done
but which Spark still runs (its tasks on executors lost without a word), never while work is pending.

The jobs here run tasks that hold their slot until the test releases them (or HOLD_S passes), so a
job that ends sooner was ended by the watch.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from conveyor.client.pool import QueuePool
from conveyor.client.queue_client import QueueClient
from conveyor.errors import NoSlotsError, ServerUnreachableError
from conveyor.message import Message
from conveyor.spark.watch import DONE_GRACE_S, POLL_S, JobGroup, JobWatch

from ..support.servers import wait_for

pytestmark = pytest.mark.timeout(240)
HOLD_S = 150.0  # how long a held task waits for its release: past every bound here, so only the watch ends it sooner
UNREACHABLE_S = 2.0
START_TIMEOUT_S = 8.0  # generous: on a busy machine a task can take seconds to start


def holding(started: Path, release: Path) -> Callable[[Iterable[int]], None]:
    """A Spark partition function that says it started, then holds its slot until `release` exists."""

    def run(_: Iterable[int]) -> None:
        started.touch()
        deadline = time.monotonic() + HOLD_S
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # the test's release is a file: polled

    return run


@pytest.fixture(autouse=True)
def slots_freed(spark: SparkSession, tmp_path: Path) -> Iterator[None]:
    """After each test, release its held tasks and wait until both slots run tasks again.

    A job the watch cancelled leaves its Python tasks running until they return: held, they would
    keep the next test's tasks from starting (and its watch would see no slot).
    """
    yield
    (tmp_path / "release").touch()
    # both partitions at once need both slots: it returns once the held tasks have let them go
    spark.sparkContext.parallelize(range(2), 2).foreach(lambda _: None)


def run_held_job(spark: SparkSession, tmp_path: Path) -> None:
    """Two tasks that hold their slots until `tmp_path / "release"` exists."""
    spark.sparkContext.parallelize(range(2), 2).foreachPartition(holding(tmp_path / "started", tmp_path / "release"))


def test_a_server_out_of_reach_ends_the_job_with_the_server_named(spark: SparkSession, tmp_path: Path) -> None:
    group = "watch-test-unreachable"
    with QueuePool.local(n_servers=2) as pool:
        gone = pool.addresses[1]
        t0 = time.monotonic()
        with pytest.raises(ServerUnreachableError, match=re.escape(gone)) as raised:
            watch = JobWatch(spark, pool.queues, group, ["jobs"], unreachable_s=UNREACHABLE_S, start_timeout_s=HOLD_S)
            with JobGroup(spark, group, "a job the watch ends"), watch:
                pool.servers.processes[1].kill()  # SIGKILL: the server is gone for good
                run_held_job(spark, tmp_path)
        took = time.monotonic() - t0
    assert raised.value is watch.error and raised.value.address == gone
    assert raised.value.seconds > UNREACHABLE_S
    assert raised.value.__cause__ is not None  # Spark's own error on the cancelled job, kept as the cause
    assert took < HOLD_S / 2, f"the job ran {took:.0f} s: its tasks ended on their own, not cancelled by the watch"
    assert not watch.finished


def test_a_job_no_task_of_which_starts_ends_with_no_slots(spark: SparkSession) -> None:
    """No task of the group starts (as on a cluster granting no slot): the watch gives up, naming the group."""
    group = "watch-test-no-slot"
    with QueuePool.local(n_servers=1) as pool:
        watch = JobWatch(spark, pool.queues, group, [], unreachable_s=HOLD_S, start_timeout_s=START_TIMEOUT_S)
        with watch:
            wait_for(lambda: watch.error is not None, 60, "the watch to give up on a job group with no task started")
    assert isinstance(watch.error, NoSlotsError)
    said = str(watch.error)
    assert group in said and "executor(s) registered" in said and "free cores" in said


def _tasks_running(spark: SparkSession, group: str) -> bool:
    """Whether Spark's status tracker lists a running task of the group's jobs."""
    tracker = spark.sparkContext.statusTracker()
    infos = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
    stages = [tracker.getStageInfo(stage) for info in infos if info for stage in info.stageIds]
    return any(s.numActiveTasks for s in stages if s is not None)


def test_a_job_whose_tasks_run_past_the_start_timeout_is_left_alone(spark: SparkSession, tmp_path: Path) -> None:
    """A job whose tasks run is watched past its start timeout: the watch leaves it alone.

    The job starts (in a thread of its own) before the watch, which is entered once a task has
    started: so the premise, tasks started within the bound, holds however slowly a loaded machine
    starts them.
    """
    group = "watch-test-running"
    failed: list[BaseException] = []

    def job() -> None:
        try:
            with JobGroup(spark, group, "a job that runs"):
                run_held_job(spark, tmp_path)  # returns once released: not cancelled
        except BaseException as e:
            failed.append(e)

    runner = threading.Thread(target=job, daemon=True)
    runner.start()
    wait_for((tmp_path / "started").exists, 60, "a task of the job to start")
    # and Spark's status tracker, which the watch reads, to list it: its listener bus lags on a busy machine
    wait_for(lambda: _tasks_running(spark, group), 60, "the status tracker to list the running task")
    with QueuePool.local(n_servers=1) as pool:
        watch = JobWatch(spark, pool.queues, group, [], unreachable_s=HOLD_S, start_timeout_s=START_TIMEOUT_S)
        with watch:
            # the property: the tasks run on past the start timeout (and a few looks after it), and the watch does not end them
            threading.Event().wait(START_TIMEOUT_S + 4 * POLL_S)
        (tmp_path / "release").touch()
        runner.join(timeout=60)
    assert not runner.is_alive() and not failed, failed
    assert watch.error is None and not watch.finished


def test_a_job_still_running_once_its_work_is_done_is_ended_but_not_while_work_is_pending(
    spark: SparkSession, tmp_path: Path
) -> None:
    """`finished` says the work is all done; the watch ends the job only once the queue has drained too.

    The held tasks stand for tasks on executors lost without a word, which Spark counts as running
    until its network timeout. While a message is pending the watch waits; once it is acked, the
    watch ends the job within DONE_GRACE_S (and a poll or two) and says the work was finished.
    """
    group = "watch-test-finished"
    with QueuePool.local(n_servers=1) as pool, QueueClient(pool.addresses[0]) as client:
        client.put("jobs", [Message(payload=b"pending")])
        watch = JobWatch(spark, pool.queues, group, ["jobs"], unreachable_s=HOLD_S, start_timeout_s=HOLD_S, finished=lambda: True)
        seen: dict[str, bool] = {}
        acked_at: list[float] = []

        def settle_later() -> None:
            wait_for((tmp_path / "started").exists, 60, "a task of the job to start")
            # the property: pending work keeps the job alive past the grace the watch gives a finished one
            threading.Event().wait(DONE_GRACE_S + 3 * POLL_S)
            seen["ended while work was pending"] = watch.finished
            [m] = client.get("jobs", 1, lease_s=60)
            assert client.ack("jobs", [m.id]) == [True]
            acked_at.append(time.monotonic())

        settler = threading.Thread(target=settle_later, daemon=True)
        settler.start()
        with pytest.raises(Exception, match="cancel"), JobGroup(spark, group, "a job past its work"), watch:
            run_held_job(spark, tmp_path)
        ended_at = time.monotonic()
        settler.join(timeout=60)
    assert seen == {"ended while work was pending": False}
    assert watch.finished and watch.error is None
    assert acked_at and ended_at - acked_at[0] < DONE_GRACE_S + 30, "the watch did not end the job once the work was done"
