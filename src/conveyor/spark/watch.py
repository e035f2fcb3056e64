"""The driver's watch over a Spark job of consumers: no silent hang.

A thread on the driver polls the queue servers (and feeds the progress bar) while the job runs. It
ends the job, by cancelling its Spark job group (or, under Spark Connect, its tag), with an error
that says why, when
- a queue server has been out of reach for longer than `unreachable_s` (the consumers would retry
  it, and the job wait for them, for as long as anyone waits): `ServerUnreachableError`;
- no Spark task of the job has started within `start_timeout_s` (the cluster grants no slot: Spark
  itself only logs "Initial job has not accepted any resources", forever): `NoSlotsError`.
A server going out of reach is logged on the driver at once, not only in an executor's log.

With `started`, the watch calls it once a task of the job runs (its plan is made by then).

With `finished` (consumers that end once the queues are drained), the watch also ends a job whose
work is all done (nothing pending anywhere, `finished()` true) but which Spark still runs after
DONE_GRACE_S: its last tasks ran on executors that were lost without a word (a host gone), which
Spark notices only after `spark.network.timeout` (120 s by default). `finished` is then set.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from conveyor.client.progress import JoinProgress
from conveyor.client.sharded import summed_stats
from conveyor.errors import ConveyorError, NoSlotsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from conveyor.client.sharded import ShardedQueues

log = logging.getLogger("conveyor.spark")

START_TIMEOUT_S = 120.0  # no task of a job started within this: the cluster grants no slot (NoSlotsError)
POLL_S = 1.0  # how often the servers are asked (with a progress bar: BAR_POLL_S)
BAR_POLL_S = 0.25
DONE_GRACE_S = 5.0  # consumers end within ~1 s of the queues draining; a job running this long after is stuck


class JobWatch:
    """Watch the Spark jobs of `group` started inside the `with` block; see the module docstring.

    On exit after a failure the watch's reason, if it has one, is raised in place of Spark's
    cancellation error (which says only that the job was cancelled).
    """

    def __init__(
        self,
        spark: SparkSession,
        pool: ShardedQueues,
        group: str,
        queues: list[str],
        *,
        unreachable_s: float,
        start_timeout_s: float,
        progress: bool | None = False,
        description: str = "rows",
        finished: Callable[[], bool] | None = None,
        started: Callable[[], None] | None = None,
    ) -> None:
        self.spark, self.pool, self.group, self.queues = spark, pool, group, queues
        self._on_start = started  # called once, when a task of the job is first seen running
        self.unreachable_s, self.start_timeout_s = unreachable_s, start_timeout_s
        self.bar = JoinProgress(enabled=progress, description=description)
        self.error: ConveyorError | None = None
        self.finished = False  # the work was done and the job ended by the watch
        self._finished = finished
        self._done_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"conveyor-watch-{group}", daemon=True)
        self._started_at = 0.0
        self._down: set[str] = set()  # servers out of reach, already logged

    def __enter__(self) -> JobWatch:
        self._started_at = time.monotonic()
        self.bar.__enter__()
        self._thread.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        self._stop.set()
        self._thread.join()
        self.bar.__exit__(None, None, None)
        if e is not None:  # failed or interrupted (Ctrl-C): no task of the job may run on
            self._cancel()
        if e is not None and self.error is not None:
            raise self.error from e

    def _run(self) -> None:
        poll = BAR_POLL_S if self.bar.enabled else POLL_S
        while not self._stop.wait(poll):
            try:
                self._see_start()
                reason = self._reason_to_end()
            except Exception as e:  # a glitch in watching must not fail the job
                log.debug("watch of %s: %s", self.group, e)
                continue
            if reason is not None:
                self.error = reason
                log.error("%s: cancelling the Spark job", reason)
                self._cancel()
                return
            if self.finished:
                log.warning(
                    "job group %s: the work is done, but Spark still counts %s task(s) as running %.0f s later "
                    "(on executors lost without a word); ending the job",
                    self.group,
                    self._running(),
                    DONE_GRACE_S,
                )
                self._cancel()
                return

    def _reason_to_end(self) -> ConveyorError | None:
        """One look at the servers and Spark (servers lost and back logged, the bar fed); why to end the job, if so."""
        per = self.pool.reachable_stats(self.queues)
        for c, p in zip(self.pool.clients, per, strict=True):
            if isinstance(p, Exception) and c.address not in self._down:
                self._down.add(c.address)
                log.warning(
                    "queue server %s is out of reach (%s); the consumers retry it for up to %.0f s",
                    c.address,
                    p,
                    self.unreachable_s,
                )
            elif not isinstance(p, Exception) and c.address in self._down:
                self._down.discard(c.address)
                log.warning("queue server %s answers again", c.address)
        st = {q: s for q, s in summed_stats(p for p in per if isinstance(p, dict)).items() if q in self.queues}
        self.bar.update(st)
        self._check_done(all(isinstance(p, dict) for p in per) and all(s.pending == 0 for s in st.values()))
        try:
            self.pool.check_reachable(self.unreachable_s, self.queues)
        except ConveyorError as e:
            return e
        waited = time.monotonic() - self._started_at
        if waited > self.start_timeout_s and not self._any_task_started():
            executors = _executors(self.spark)
            return NoSlotsError(
                f"no Spark task of job group {self.group} started within {waited:.0f} s: the cluster grants "
                f"no task slot ({executors} executor(s) registered). Check that the Spark workers are "
                "up and have free cores, or lower spark.executor.cores / spark.task.cpus"
            )
        return None

    def _see_start(self) -> None:
        if self._on_start is not None and self._any_task_started():
            on_start, self._on_start = self._on_start, None
            on_start()

    def _check_done(self, drained: bool) -> None:
        if self._finished is None or not drained or not self._finished():
            self._done_since = None
            return
        now = time.monotonic()
        if self._done_since is None:
            self._done_since = now
        self.finished = now - self._done_since >= DONE_GRACE_S

    def _stages(self) -> list[Any]:
        """The stage infos of the group's jobs (raises where Spark cannot tell: Spark Connect)."""
        tracker = self.spark.sparkContext.statusTracker()
        return [
            s
            for job in tracker.getJobIdsForGroup(self.group)
            if (info := tracker.getJobInfo(job))
            for stage in info.stageIds
            if (s := tracker.getStageInfo(stage)) is not None
        ]

    def _running(self) -> int | str:
        try:
            return int(sum(s.numActiveTasks for s in self._stages()))
        except Exception:
            return "some"

    def _any_task_started(self) -> bool:
        """Whether any task of the group's jobs runs or ran (True where Spark cannot tell: Spark Connect)."""
        try:
            stages = self._stages()
        except Exception:
            return True
        return any(s.numActiveTasks or s.numCompletedTasks or s.numFailedTasks for s in stages)

    def _cancel(self) -> None:
        cancel_group(self.spark, self.group)


def cancel_group(spark: SparkSession, group: str) -> None:
    """Cancel the Spark jobs of job group `group` (under Spark Connect, of tag `group`)."""
    try:
        spark.sparkContext.cancelJobGroup(group)
    except Exception:  # Spark Connect: the jobs carry a tag instead
        try:
            spark.interruptTag(group)
        except Exception as e:
            log.error("could not cancel the Spark jobs of %s: %s", group, e)


def _executors(spark: SparkSession) -> int | str:
    try:
        return len(spark.sparkContext.statusTracker().getExecutorInfos()) - 1  # the driver is listed too
    except Exception:
        return "unknown"


class JobGroup:
    """Name a job in the Spark UI: a job group and description, or (Spark Connect) a tag."""

    def __init__(self, spark: SparkSession, group: str, description: str) -> None:
        self.spark, self.group, self.description = spark, group, description
        self._sc: Any = None

    def __enter__(self) -> None:
        try:
            self._sc = self.spark.sparkContext
        except Exception:
            self._sc = None
        if self._sc is not None:
            self._sc.setJobGroup(self.group, self.description, interruptOnCancel=True)
        else:
            try:
                self.spark.addTag(self.group)
            except Exception as e:  # naming is a courtesy: never fail the job for it
                log.debug("could not tag the Spark job: %s", e)

    def __exit__(self, *exc: object) -> None:
        if self._sc is not None:
            self._sc.setLocalProperty("spark.jobGroup.id", None)
            self._sc.setLocalProperty("spark.job.description", None)
        else:
            try:
                self.spark.removeTag(self.group)
            except Exception as e:
                log.debug("could not untag the Spark job: %s", e)
