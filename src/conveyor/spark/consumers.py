"""SparkConsumerPool: consumers running as long-lived Spark tasks on the executors.

`spark.range(n, numPartitions=n).mapInArrow(...)` starts n Spark tasks; each runs one `Consumer`
(consumer i of n, serving its own shards first and stealing from the others) in the executor's
Python worker until the queues are drained (`until_empty`) or a stop is signalled. Only the
DataFrame API is used, so it runs wherever that exists (Spark Connect included; there the job is
tagged instead of grouped). A Spark task that fails is retried by Spark; the messages its consumer
held come back when their leases end (a running task's lease is extended only while it runs).

No task ever waits for another to start: on a cluster some may never get a slot (fewer slots than
tasks, a lost host whose retried task waits for a free one). With `feed`, a task that has worked
off its rows waits for the other tasks' rows only while work keeps coming (FEED_IDLE_S), then ends
and frees its slot; a task that starts later consumes its own rows. The driver watches the job
(`conveyor.spark.watch`): a server out of reach, or no slot ever granted, ends it with the reason.

A stop travels through the queue servers, not Spark: `stop()` stores a blob whose key the
consumers know, and each checks for it about once a second, then stops gracefully.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from conveyor.client.pool import QueuePool
from conveyor.client.queue_client import QueueClient
from conveyor.client.sharded import ShardedQueues
from conveyor.constants import DEFAULT_UNREACHABLE_S, H_IDEMPOTENCY_KEY
from conveyor.errors import ConveyorError
from conveyor.gc_policy import gc_tuned
from conveyor.message import Message
from conveyor.protocol.report import FIGURES, HOST, ConsumerReport, Shown
from conveyor.spark.cluster import driver_pool, is_local
from conveyor.spark.preflight import preflight
from conveyor.spark.session import check_workers_python, task_slots
from conveyor.spark.watch import START_TIMEOUT_S, JobGroup, JobWatch
from conveyor.tasks.publish import get_default_pool
from conveyor.tasks.queue_config import QueueConfig
from conveyor.worker.affinity import auto_pin, resolve_slots
from conveyor.worker.consumer import Consumer
from conveyor.worker.consumer_pool import CONSUMER_SWITCH_INTERVAL_S
from conveyor.worker.options import ConsumerKeywords, ConsumerOptions, options_of, refuse_shared_selector
from conveyor.worker.stats import ConsumerStats

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from typing_extensions import Unpack  # typing.Unpack is 3.11+; only the type checker reads it

log = logging.getLogger("conveyor.spark")

# a row of a job's consumer stats: the consumer's report (which process, its figures counted since it
# started: conveyor.protocol.report) among the job's own columns, in this order
_WHO = [name for name, f in FIGURES.items() if f.shown is Shown.WHO]
_TOTALS = [name for name, f in FIGURES.items() if f.shown is Shown.TOTAL]
STATS_DDL = ", ".join(
    [
        "consumer long",
        f"{HOST} string",
        *(f"{name} long" for name in _WHO),
        "started double",
        "finished double",
        *(f"{name} long" for name in _TOTALS),
        "rows long",
    ]
)
STOP_PREFIX = b"conveyor-stop:"

Prelude = Callable[[Iterator["pa.RecordBatch"], int], int]  # (the task's input batches, task index) -> rows fed
FEED_IDLE_S = 5.0  # a fed consumer with nothing to do waits this long for other tasks' rows, then ends
SLOTS_WAIT_S = 10.0  # with no executor registered yet, how long to wait for one before sizing the job


def _key(prefix: bytes, job: str) -> str:
    return hashlib.sha256(prefix + job.encode()).hexdigest()


def fed_queue(job: str) -> str:
    """The queue where each task of a fed job says, once, that it has put its rows (and how many)."""
    return f"conveyor-fed-{job}"


def say_once(backend: ShardedQueues | QueueClient, queue: str, key: str, record: dict[str, Any]) -> None:
    """A record on a job's bookkeeping queue, once whatever the attempts of the task saying it (`key` is an idempotency key)."""
    backend.put(queue, [Message(payload=json.dumps(record).encode(), headers={H_IDEMPOTENCY_KEY: key})])


def said(pool: ShardedQueues, queue: str) -> Iterator[dict[str, Any]]:
    """The records on a bookkeeping queue (taken, never acked: the queue is dropped after)."""
    while got := pool.get(queue, 1000):
        yield from (json.loads(m.payload) for m in got)


def _say_fed(pool: ShardedQueues, job: str, task: int, rows: int) -> None:
    """Task `task` has put its `rows`: one message per task, whatever its attempts."""
    say_once(pool, fed_queue(job), f"fed:{job}:{task}", {"task": task, "rows": rows})


def _fed(pool: ShardedQueues, job: str) -> int:
    """How many tasks of the job have put their rows."""
    st = pool.wait_drained([fed_queue(job)], 0.0).get(fed_queue(job))
    return 0 if st is None else st.pending


def _consume(
    pool: ShardedQueues,
    queues: list[QueueConfig | str],
    n: int,
    job: str,
    options: ConsumerOptions,
    run: _Run,
    prelude: Prelude | None,
) -> Any:
    """The function each Spark task runs: its prelude (if any), one consumer, then one row of counts."""

    def consume(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        index = cast("TaskContext", TaskContext.get()).partitionId()  # always set inside a Spark task
        rows = 0
        expect_more = None
        if prelude is None:
            for _ in batches:  # the range rows: only the partition number matters
                pass
        else:
            rows = prelude(batches, index)
            _say_fed(pool, job, index, rows)
            expect_more = _others_feeding(pool, job, n, index, lambda: consumer.stats)
        stop = _key(STOP_PREFIX, job)
        consumer = Consumer(
            pool,
            queues,
            options=options,
            until_empty=run.until_empty,
            unreachable_s=run.unreachable_s,
            consumer=index,
            n_consumers=n,
            stop_when=lambda: pool.get_blob(stop) is not None,
            expect_more=expect_more,
            name=f"spark:{os.uname().nodename}:{job}:{index}:{os.getpid()}",
            read_ahead=run.read_ahead,
        )
        old = sys.getswitchinterval()
        sys.setswitchinterval(CONSUMER_SWITCH_INTERVAL_S)  # see conveyor.worker.consumer_pool
        started = time.time()
        try:
            with gc_tuned():
                consumer.run()
        finally:
            sys.setswitchinterval(old)
            pool.close()
        yield pa.RecordBatch.from_pylist([_stats_row(index, consumer.report(), started, time.time(), rows)])

    return consume


def _stats_row(index: int, r: ConsumerReport, started: float, finished: float, rows: int) -> dict[str, Any]:
    """The row of STATS_DDL of consumer `index` of a job, from its report."""
    return {
        "consumer": index,
        HOST: r.host,
        **r.figures(Shown.WHO),
        "started": started,
        "finished": finished,
        **r.figures(Shown.TOTAL),
        "rows": rows,
    }


def _others_feeding(pool: ShardedQueues, job: str, n: int, index: int, stats: Callable[[], ConsumerStats]) -> Callable[[], bool]:
    """`expect_more` of a fed consumer: True while another task has not put its rows yet and work came within FEED_IDLE_S.

    Never longer: that task may have no slot (it may be waiting for this one's), or have died; when
    it runs, it consumes its own rows.
    """
    seen, since = -1, time.monotonic()

    def expect_more() -> bool:
        nonlocal seen, since
        if _fed(pool, job) >= n:
            return False
        done = stats().processed + stats().failed
        if done != seen:
            seen, since = done, time.monotonic()
        if time.monotonic() - since < FEED_IDLE_S:
            return True
        log.info(
            "consumer %d of job %s: other tasks have not put their rows after %.0f s idle; ending "
            "(they consume their own rows when they run)",
            index,
            job,
            FEED_IDLE_S,
        )
        return False

    return expect_more


class SparkConsumerPool:
    """Consumers as Spark tasks: `run()` until drained, or `start()` ... `stop()`.

    n_consumers: Spark tasks to run (default: the task slots the cluster has, see `task_slots`).
    options (`options=`, or keywords of their names): `ConsumerOptions`. Left out, `concurrency`
        is sized for a core per consumer (its Spark task's), `pin_core` for the task slots.
    until_empty: consumers end once the queues are drained; False keeps them running until `stop()`.
    feed: (df, prelude): each consumer task first runs `prelude(batches, task)` over its share of
        df's rows (df coalesced to n_consumers tasks: no shuffle), e.g. to put them on the queue,
        then consumes (see the module docstring for how long it waits for the others' rows). This
        is how `map` overlaps putting rows on the queue with working them off.
    unreachable_s: a queue server out of reach for longer fails the job (`ServerUnreachableError`).
    start_timeout_s: no task started within it fails the job (`NoSlotsError`).
    queue_pool: the queue servers; None: the default pool, or else servers started for these consumers
        (beside the driver on a cluster: `conveyor.spark.cluster`), put work through `.pool`,
        stopped by `close()` (or the `with` block's end).
    On a cluster, `run` and `start` first check the executors (`conveyor.spark.preflight`).
    """

    def __init__(
        self,
        spark: SparkSession,
        queue_pool: QueuePool | None = None,
        n_consumers: int | None = None,
        *,
        queues: Sequence[QueueConfig | str] = ("default",),
        until_empty: bool = True,
        description: str | None = None,
        feed: tuple[DataFrame, Prelude] | None = None,
        unreachable_s: float = DEFAULT_UNREACHABLE_S,
        start_timeout_s: float = START_TIMEOUT_S,
        progress: bool | None = False,
        options: ConsumerOptions | None = None,
        **keywords: Unpack[ConsumerKeywords],
    ) -> None:
        self.spark = spark
        given = options_of("SparkConsumerPool", options, keywords)
        refuse_shared_selector("SparkConsumerPool", given)
        if given.early_ack:  # the job's watch counts a consumer done when nothing it holds is unsettled
            raise ValueError(
                "SparkConsumerPool: early_ack is for ConsumerPool and conveyor worker: a Spark consumer's "
                "progress and stop are judged by what it has settled"
            )
        check_count("n_consumers", n_consumers)
        self.n_consumers = consumer_count(spark, n_consumers)
        check_workers_python(spark)
        default = get_default_pool()  # servers started here come last: nothing below can fail and leave them running
        self._own = None if queue_pool is not None or isinstance(default, QueuePool) else _servers_for(spark)
        self.pool: QueuePool = queue_pool or self._own or cast("QueuePool", default)
        self.queues, self.task_modules = list(queues), list(given.task_modules)
        self.queue_names = [q if isinstance(q, str) else q.name for q in self.queues]
        # each consumer is a Spark task: one task slot, a core (processes in its stead: for that core)
        slots, read_ahead = resolve_slots(given.concurrency, given.pool, 1, cores=1)
        pin = auto_pin(given.pin_core, given.pool, self.n_consumers, task_slots(spark))
        self.options = replace(given, concurrency=slots, pin_core=pin)  # what each consumer runs with
        self.until_empty = until_empty
        self._run = _Run(until_empty, unreachable_s, read_ahead)
        self.job = uuid.uuid4().hex[:12]
        self.description = description or (
            f"conveyor: {self.n_consumers} consumer(s) x {slots} {given.pool}(s) on {', '.join(self.queue_names)}"
        )
        self.feed = feed
        self.unreachable_s, self.start_timeout_s, self.progress = unreachable_s, start_timeout_s, progress
        self.stats: list[dict[str, Any]] | None = None
        self.fed_rows = 0  # with `feed`, after `run`: the rows the tasks put
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def group(self) -> str:
        """The Spark job group (or, under Spark Connect, tag) of the consumers' job."""
        return f"conveyor-{self.job}"

    def dataframe(self) -> DataFrame:
        """The (lazy) DataFrame whose evaluation runs the consumers: one row of counts per consumer."""
        prelude = None if self.feed is None else self.feed[1]
        fn = _consume(self.pool.queues, self.queues, self.n_consumers, self.job, self.options, self._run, prelude)
        if self.feed is None:
            return self.spark.range(self.n_consumers, numPartitions=self.n_consumers).mapInArrow(fn, STATS_DDL)
        return self.feed[0].coalesce(self.n_consumers).mapInArrow(fn, STATS_DDL)

    def job_group(self) -> JobGroup:
        """A context naming the Spark jobs started inside it after these consumers (in the Spark UI)."""
        return JobGroup(self.spark, self.group, self.description)

    def watch(self, consuming: bool = True) -> JobWatch:
        """The driver's watch over the consumers' job (see `conveyor.spark.watch`).

        `consuming=False` for a job that only puts work (a drained queue does not mean its work is
        done).
        """
        done = self._all_fed if consuming and self.until_empty else None
        return JobWatch(
            self.spark,
            self.pool.queues,
            self.group,
            self.queue_names,
            unreachable_s=self.unreachable_s,
            start_timeout_s=self.start_timeout_s,
            progress=self.progress,
            finished=done,
        )

    def run(self) -> list[dict[str, Any]]:
        """Run the consumers as one Spark job and return each one's counts.

        Blocks until they end; a Spark task that ran again, e.g. after its executor was lost, counts
        once, as its last run.

        When the work is all done but Spark still counts some tasks as running (their executors
        were lost without a word: Spark notices only after `spark.network.timeout`), the watch
        ends the job early; the counts then come from the consumers' last reports.
        """
        if not is_local(self.spark):
            preflight(
                self.spark,
                self.pool.queues,
                self.task_modules,
                unreachable_s=self.unreachable_s,
                start_timeout_s=self.start_timeout_s,
            )
        if self.feed is not None:
            self.pool.queues.declare(fed_queue(self.job))
        watch = self.watch()
        try:
            with self.job_group(), watch:
                try:
                    rows = [r.asDict() for r in self.dataframe().collect()]
                except Exception:
                    if not watch.finished:
                        raise
                    rows = self._reported()
        except BaseException:
            self._tidy()
            raise
        self._clean_up()
        self.stats = sorted(rows, key=lambda r: r["consumer"])
        return self.stats

    def _all_fed(self) -> bool:
        return self.feed is None or _fed(self.pool.queues, self.job) >= self.n_consumers

    def _reported(self) -> list[dict[str, Any]]:
        """Each consumer's counts from its last report to the servers (the job ended before they could return them)."""
        out: dict[int, dict[str, Any]] = {}
        now = time.time()
        for name, c in self.pool.queues.workers().items():
            parts = name.split(":")
            if len(parts) == 5 and parts[0] == "spark" and parts[2] == self.job:
                out[int(parts[3])] = _stats_row(int(parts[3]), ConsumerReport.from_counts(name, c), now, now, 0)
        return list(out.values())

    def _clean_up(self) -> None:
        """The consumers have ended: read how many rows each fed task put, then drop the bookkeeping."""
        try:
            if self.feed is not None:
                by_task = {d["task"]: d["rows"] for d in said(self.pool.queues, fed_queue(self.job))}
                self.fed_rows = sum(by_task.values())
        except ConveyorError as e:
            log.warning("could not read what the tasks of %s put: %s", self.job, e)
        self._tidy()

    def _tidy(self) -> None:
        """Drop the job's bookkeeping on the servers that answer.

        A failed job may have lost one: no wait on it; what a server keeps of a job is a small queue
        and a blob.
        """
        for c in self.pool.queues.health.answering():
            try:
                if self.feed is not None:
                    c.drop(fed_queue(self.job))
                c.forget_blobs([_key(STOP_PREFIX, self.job)])
            except (ConveyorError, OSError) as e:
                log.warning("could not remove the bookkeeping of %s on %s: %s", self.job, c.address, e)

    def close(self) -> None:
        """Stop the servers started for these consumers (none with a pool given or a default one)."""
        if self._own is not None:
            self._own.close()

    def __enter__(self) -> SparkConsumerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> SparkConsumerPool:
        """Run in a background thread of the driver; `join()` waits, `stop()` ends it early."""

        def target() -> None:
            try:
                self.run()
            except BaseException as e:
                self._error = e

        self._thread = threading.Thread(target=target, name=f"conveyor-spark-{self.job}", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Wait for the consumers to end; re-raises the Spark job's error."""
        if self._thread is None:
            raise ConveyorError("SparkConsumerPool.join() before start()")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the Spark consumers still run after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self.stats is not None
        return self.stats

    def stop(self, wait: bool = True, timeout: float | None = None) -> None:
        """Tell the consumers to stop (each finishes its running tasks); with `wait`, wait for them."""
        if self._thread is not None and not self._thread.is_alive():
            return  # they have ended (and nobody would remove the marker)
        self.pool.queues.put_blob(STOP_PREFIX + self.job.encode())  # its key: _key(STOP_PREFIX, job)
        if wait and self._thread is not None:
            self.join(timeout)


@dataclass(frozen=True, slots=True)
class _Run:
    """How each consumer of a job runs, beside its options."""

    until_empty: bool  # it ends once the queues are drained
    unreachable_s: float  # a server out of reach this long ends it with an error
    read_ahead: bool  # it may hold quick tasks beyond its slots (sized here: the options leave them out)


def _servers_for(spark: SparkSession) -> QueuePool:
    """Servers for consumers given no pool: local ones on a local master, else beside the driver."""
    return QueuePool.local(n_servers=2) if is_local(spark) else driver_pool(spark)


def check_count(name: str, value: int | None) -> None:
    """Refuse a count that is not a positive integer here, on the driver, rather than in every Spark task."""
    if value is not None and (type(value) is not int or value < 1):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def consumer_count(spark: SparkSession, requested: int | None) -> int:
    """`requested`, or one consumer per task slot.

    With no executor yet, wait up to SLOTS_WAIT_S for one; then (dynamic allocation, or a cluster
    still starting) `defaultParallelism`: tasks never wait for each other, so a guess too high only
    runs some later, and the job's watch ends it if no slot ever comes.
    """
    if requested is not None:
        if requested > (slots := task_slots(spark)) > 0:
            log.warning(
                "%d consumers but %d Spark task slots: the consumers beyond them start only as others end", requested, slots
            )
        return requested
    deadline = time.monotonic() + SLOTS_WAIT_S
    while (slots := task_slots(spark)) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    if slots:
        return slots
    try:
        guess = int(spark.sparkContext.defaultParallelism)
    except Exception:
        guess = 2
    log.warning("no Spark executor has registered within %.0f s: sizing for %d consumers", SLOTS_WAIT_S, guess)
    return guess
