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
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from conveyor.client.pool import QueuePool
from conveyor.client.sharded import ShardedQueues
from conveyor.constants import DEFAULT_UNREACHABLE_S, INTERNAL_QUEUE_PREFIX
from conveyor.errors import ConveyorError
from conveyor.gc_policy import gc_tuned
from conveyor.protocol import requests as calls
from conveyor.protocol.report import FIGURES, HOST, ConsumerReport, Shown
from conveyor.spark.arrow_batches import ByteBoundLift
from conveyor.spark.cluster import driver_pool, is_local
from conveyor.spark.preflight import preflight
from conveyor.spark.records import RowsPut, TaskRecords, where_answering
from conveyor.spark.resources import check_resources, consumer_profile, given_resources, profile_slots
from conveyor.spark.session import check_workers_python, task_slots
from conveyor.spark.watch import START_TIMEOUT_S, JobGroup, JobWatch
from conveyor.tasks.publish import get_default_pool
from conveyor.tasks.queue_config import QueueConfig
from conveyor.tasks.runner import forget_adhoc
from conveyor.worker.affinity import auto_pin, resolve_slots
from conveyor.worker.consumer import Consumer
from conveyor.worker.consumer_pool import CONSUMER_SWITCH_INTERVAL_S
from conveyor.worker.options import ConsumerKeywords, ConsumerOptions, options_of, refuse_shared_selector
from conveyor.worker.stats import ConsumerStats

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.resource import ResourceProfile
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

PutInput = Callable[[Iterator["pa.RecordBatch"], int], int]  # (a task's input batches, its index) -> rows put
FEED_IDLE_S = 5.0  # a fed consumer with nothing to do waits this long for other tasks' rows, then ends
SLOTS_WAIT_S = 10.0  # with no executor registered yet, how long to wait for one before sizing the job


def _stop_blob(job: str) -> bytes:
    """The blob whose presence on the servers tells the consumers of `job` to stop (`stop()`)."""
    return STOP_PREFIX + job.encode()


def _stop_key(job: str) -> str:
    """The key the servers store `_stop_blob(job)` under (its sha256), which the consumers look for."""
    return hashlib.sha256(_stop_blob(job)).hexdigest()


def rows_put_records(job: str) -> TaskRecords[RowsPut]:
    """Where each task of a fed job records, once, that it has put its rows (and how many)."""
    return TaskRecords(f"{INTERNAL_QUEUE_PREFIX}fed-{job}", RowsPut)


@dataclass(frozen=True, slots=True)
class ConsumerRow:
    """What one consumer task of a job did: its figures since it started, when it ran, the rows it put.

    It crosses from the Spark task to the driver as a row of STATS_DDL; the dicts users see (`run`,
    `MapStats.consumers`) are made of it (`as_dict`) where it leaves conveyor.
    """

    consumer: int  # its index among the job's consumers
    host: str
    # those of its report that STATS_DDL has a column for (Shown.WHO, Shown.TOTAL), by name: keyed by string, as
    # the report's declaration (conveyor.protocol.report FIGURES) names them and every reader reads them through it
    figures: dict[str, int]
    started: float
    finished: float
    rows: int  # the input rows it put (a fed consumer), else 0

    @classmethod
    def of(cls, consumer: int, r: ConsumerReport, started: float, finished: float, rows: int) -> ConsumerRow:
        """The row of consumer `consumer` of a job, from its report."""
        return cls(consumer, r.host, r.figures(Shown.WHO, Shown.TOTAL), started, finished, rows)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> ConsumerRow:
        """A row as Spark hands it back (STATS_DDL's columns)."""
        figures = {name: int(row[name]) for name in (*_WHO, *_TOTALS)}
        return cls(int(row["consumer"]), str(row[HOST]), figures, float(row["started"]), float(row["finished"]), int(row["rows"]))

    def as_dict(self) -> dict[str, Any]:
        """The row as STATS_DDL declares it, in its order."""
        return {
            "consumer": self.consumer,
            HOST: self.host,
            **{name: self.figures[name] for name in _WHO},
            "started": self.started,
            "finished": self.finished,
            **{name: self.figures[name] for name in _TOTALS},
            "rows": self.rows,
        }


@dataclass(frozen=True)
class Feed:
    """Input the consumer tasks put on the queue themselves before they consume (`SparkConsumerPool(feed=...)`)."""

    frame: DataFrame  # its rows, coalesced to one partition per consumer task (no shuffle)
    put: PutInput  # (a task's input batches, its index) -> the rows it put


def _consume(
    pool: ShardedQueues,
    queues: list[QueueConfig | str],
    n: int,
    job: str,
    options: ConsumerOptions,
    run: _ConsumerRun,
    put_input: PutInput | None,
) -> Any:
    """The function each Spark task runs: its input put on the queue (if fed), one consumer, then one row of counts."""

    def consume(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = cast("TaskContext", TaskContext.get())  # always set inside a Spark task
        index = context.partitionId()
        with gc_tuned():  # on the way out, what the job built (a model holds cycles) collected at once
            rows = 0
            expect_more = None
            if put_input is None:
                for _ in batches:  # the range rows: only the partition number matters
                    pass
            else:
                rows = put_input(batches, index)
                rows_put_records(job).record(pool, index, RowsPut(rows))
                expect_more = _while_others_put(pool, job, n, index, lambda: consumer.stats)
            stop = _stop_key(job)
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
                slots_defaulted=run.slots_defaulted,
            )
            old = sys.getswitchinterval()
            sys.setswitchinterval(CONSUMER_SWITCH_INTERVAL_S)  # see conveyor.worker.consumer_pool
            started = time.time()
            try:
                with given_resources(context):
                    consumer.run()
            finally:
                sys.setswitchinterval(old)
                pool.close()
                for name in run.job_tasks:
                    forget_adhoc(name)
        yield pa.RecordBatch.from_pylist([ConsumerRow.of(index, consumer.report(), started, time.time(), rows).as_dict()])

    return consume


def _while_others_put(
    pool: ShardedQueues, job: str, n: int, index: int, stats: Callable[[], ConsumerStats]
) -> Callable[[], bool]:
    """`expect_more` of a fed consumer: True while another task has not put its rows yet and work came within FEED_IDLE_S.

    Never longer: that task may have no slot (it may be waiting for this one's), or have died; when
    it runs, it consumes its own rows.
    """
    seen, since = -1, time.monotonic()
    records = rows_put_records(job)

    def expect_more() -> bool:
        nonlocal seen, since
        if records.count(pool) >= n:
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
    feed: a `Feed`: each consumer task first runs `feed.put(batches, task)` over its share of the
        rows of `feed.frame` (coalesced to n_consumers tasks: no shuffle), to put them on the queue,
        then consumes (see the module docstring for how long it waits for the others' rows). This
        is how `map` overlaps putting rows on the queue with working them off.
    unreachable_s: a queue server out of reach for longer fails the job (`ServerUnreachableError`).
    start_timeout_s: no task started within it fails the job (`NoSlotsError`).
    queue_pool: the queue servers; None: the default pool, or else servers started for these consumers
        (beside the driver on a cluster: `conveyor.spark.cluster`), put work through `.pool`,
        stopped by `close()` (or the `with` block's end).
    where: the name its errors start with: the entry point the user called (`map` for its consumers).
    job_tasks: ad-hoc task names that are these consumers' alone (a map's task): each consumer
        drops them from its process's function cache as it ends, and with them what they built
        there (a model), so that a Python worker Spark reuses keeps none of it.
    default_concurrency: a thread consumer's threads when `concurrency` is left out, then held as if
        given (None: 8, which grow while the tasks wait, with quick tasks read ahead:
        `worker/thread_scaling.py`, `worker/pacing.py`). map_batches gives 1: a batch function
        computes on whole arrays, threads beside it only contend, and batches read ahead would
        wait behind a consumer's own while another consumer runs out of work at the end.
    resources: Spark resources each consumer takes, e.g. {"gpu": 1}: the consumers run under a task
        resource profile, only on executors that hold them, each with its own addresses
        (`task_resources()`; default n_consumers: as many as the resources allow at once). On a
        cluster with dynamic allocation off; see `conveyor.spark.resources`.
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
        feed: Feed | None = None,
        unreachable_s: float = DEFAULT_UNREACHABLE_S,
        start_timeout_s: float = START_TIMEOUT_S,
        progress: bool | None = False,
        options: ConsumerOptions | None = None,
        where: str = "SparkConsumerPool",
        job_tasks: Sequence[str] = (),
        default_concurrency: int | None = None,
        resources: Mapping[str, float] | None = None,
        **keywords: Unpack[ConsumerKeywords],
    ) -> None:
        self.spark = spark
        given = options_of(where, options, keywords)
        refuse_shared_selector(where, given)
        if given.early_ack:  # the job's watch counts a consumer done when nothing it holds is unsettled
            raise ValueError(
                f"{where}: early_ack is for ConsumerPool and conveyor worker: a Spark consumer's "
                "progress and stop are judged by what it has settled"
            )
        check_count("n_consumers", n_consumers)
        self.resources = check_resources(where, resources)
        self._profile = consumer_profile(spark, where, self.resources)
        self.n_consumers = consumer_count(spark, n_consumers, self._profile)
        check_workers_python(spark)
        default = get_default_pool()  # servers started here come last: nothing below can fail and leave them running
        self._own = None if queue_pool is not None or isinstance(default, QueuePool) else _servers_for(spark)
        self.pool: QueuePool = queue_pool or self._own or cast("QueuePool", default)
        self.queues, self.task_modules = list(queues), list(given.task_modules)
        self.queue_names = [q if isinstance(q, str) else q.name for q in self.queues]
        # each consumer is a Spark task: one task slot, a core (processes in its stead: for that core)
        slots, defaulted = resolve_slots(given.concurrency, given.pool, 1, cores=1)
        if defaulted and given.pool == "thread" and default_concurrency is not None:
            check_count("default_concurrency", default_concurrency)
            slots, defaulted = default_concurrency, False
        pin = auto_pin(given.pin_core, given.pool, self.n_consumers, task_slots(spark))
        self.options = replace(given, concurrency=slots, pin_core=pin)  # what each consumer runs with
        self.until_empty = until_empty
        self._consumer_run = _ConsumerRun(until_empty, unreachable_s, defaulted, tuple(job_tasks))
        self.job = uuid.uuid4().hex[:12]
        self._rows_put = rows_put_records(self.job)
        self.description = description or (
            f"conveyor: {self.n_consumers} consumer(s) x {slots} {given.pool}(s) on {', '.join(self.queue_names)}"
        )
        self.feed = feed
        self.unreachable_s, self.start_timeout_s, self.progress = unreachable_s, start_timeout_s, progress
        self._rows: list[ConsumerRow] | None = None
        self.fed_rows = 0  # with `feed`, after `run`: the rows the tasks put
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def group(self) -> str:
        """The Spark job group (or, under Spark Connect, tag) of the consumers' job."""
        return f"conveyor-{self.job}"

    def dataframe(self) -> DataFrame:
        """The (lazy) DataFrame whose evaluation runs the consumers: one row of counts per consumer."""
        put_input = None if self.feed is None else self.feed.put
        fn = _consume(self.pool.queues, self.queues, self.n_consumers, self.job, self.options, self._consumer_run, put_input)
        if self.feed is None:
            source = self.spark.range(self.n_consumers, numPartitions=self.n_consumers)
        else:
            source = self.feed.frame.coalesce(self.n_consumers)
        return source.mapInArrow(fn, STATS_DDL, profile=self._profile)

    def job_group(self, suffix: str = "") -> JobGroup:
        """A context naming the Spark jobs started inside it after these consumers (in the Spark UI).

        `suffix`: a group of its own (the consumers' group and `suffix`), for a job that runs beside
        theirs (the read-back started ahead) and that the consumers' watch must not see.
        """
        return JobGroup(self.spark, self.group + suffix, self.description)

    def work_done(self, servers: ShardedQueues, wait_s: float) -> bool:
        """Whether every row is put and no server holds anything pending in the queues (each must answer).

        Asked of `servers` (these consumers' servers, over connections that may long-poll: see
        `ShardedQueues.own_connections`); once every row is put, it waits up to `wait_s` for the
        queues to drain.
        """
        if not self._all_input_put(servers):
            return False
        per = servers.reachable_stats(self.queue_names, drained_wait_s=wait_s)
        return all(isinstance(p, dict) and all(q in p and p[q].pending == 0 for q in self.queue_names) for p in per)

    def watch(self, consuming: bool = True, started: Callable[[], None] | None = None) -> JobWatch:
        """The driver's watch over the consumers' job (see `conveyor.spark.watch`).

        `consuming=False` for a job that only puts work (a drained queue does not mean its work is
        done); `started` is called once a task of the job runs.
        """
        done = self._all_input_put if consuming and self.until_empty else None
        return JobWatch(
            self.spark,
            self.pool.queues,
            self.group,
            self.queue_names,
            unreachable_s=self.unreachable_s,
            start_timeout_s=self.start_timeout_s,
            progress=self.progress,
            finished=done,
            started=started,
        )

    @property
    def stats(self) -> list[dict[str, Any]] | None:
        """Each consumer's counts once `run` has returned (None before), as `run` returns them."""
        return None if self._rows is None else [r.as_dict() for r in self._rows]

    def run(self) -> list[dict[str, Any]]:
        """Run the consumers as one Spark job and return each one's counts (STATS_DDL's columns), by consumer.

        Blocks until they end; a Spark task that ran again, e.g. after its executor was lost, counts
        once, as its last run.

        When the work is all done but Spark still counts some tasks as running (their executors
        were lost without a word: Spark notices only after `spark.network.timeout`), the watch
        ends the job early; the counts then come from the consumers' last reports.
        """
        return [r.as_dict() for r in self.run_rows()]

    def run_rows(self) -> list[ConsumerRow]:
        """`run`, each consumer's counts a `ConsumerRow`."""
        if not is_local(self.spark):
            preflight(
                self.spark,
                self.pool.queues,
                self.task_modules,
                unreachable_s=self.unreachable_s,
                start_timeout_s=self.start_timeout_s,
            )
        if self.feed is not None:
            self._rows_put.declare(self.pool.queues)
        lift = ByteBoundLift(self.spark, None if self.feed is None else self.feed.frame.schema)
        watch = self.watch(started=lift.release)
        try:
            with self.job_group(), lift, watch:
                try:
                    rows = [ConsumerRow.from_dict(r.asDict()) for r in self.dataframe().collect()]
                except Exception:
                    if not watch.finished:
                        raise
                    rows = self._reported()
        except BaseException:
            self._drop_bookkeeping()
            raise
        self._count_rows_put()
        self._drop_bookkeeping()
        self._rows = sorted(rows, key=lambda r: r.consumer)
        return self._rows

    def _all_input_put(self, servers: ShardedQueues | None = None) -> bool:
        return self.feed is None or self._rows_put.count(self.pool.queues if servers is None else servers) >= self.n_consumers

    def _reported(self) -> list[ConsumerRow]:
        """Each consumer's counts from its last report to the servers (the job ended before they could return them)."""
        out: dict[int, ConsumerRow] = {}
        now = time.time()
        for name, c in self.pool.queues.workers().items():
            parts = name.split(":")
            if len(parts) == 5 and parts[0] == "spark" and parts[2] == self.job:
                out[int(parts[3])] = ConsumerRow.of(int(parts[3]), ConsumerReport.from_counts(name, c), now, now, 0)
        return list(out.values())

    def _count_rows_put(self) -> None:
        """The consumers have ended: read how many rows the fed tasks put (`fed_rows`)."""
        try:
            if self.feed is not None:
                self.fed_rows = sum(r.rows for r in self._rows_put.read(self.pool.queues).values())
        except ConveyorError as e:
            log.warning("could not read what the tasks of %s put: %s", self.job, e)

    def _drop_bookkeeping(self) -> None:
        """Drop the job's bookkeeping on the servers that answer.

        A failed job may have lost one: no wait on it; what a server keeps of a job is a small queue
        and a blob.
        """
        if self.feed is not None:
            self._rows_put.drop(self.pool.queues)
        stop = _stop_key(self.job)
        where_answering(self.pool.queues, calls.forget_blobs([stop]), f"remove the stop blob of {self.job}")

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
        """Wait for the consumers to end and return each one's counts, as `run` does; re-raises the Spark job's error."""
        if self._thread is None:
            raise ConveyorError("SparkConsumerPool.join() before start()")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the Spark consumers still run after {timeout} s")
        if self._error is not None:
            raise self._error
        stats = self.stats
        assert stats is not None  # run returned
        return stats

    def stop(self, wait: bool = True, timeout: float | None = None) -> None:
        """Tell the consumers to stop (each finishes its running tasks); with `wait`, wait for them."""
        if self._thread is not None and not self._thread.is_alive():
            return  # they have ended (and nobody would remove the marker)
        self.pool.queues.put_blob(_stop_blob(self.job))
        if wait and self._thread is not None:
            self.join(timeout)


@dataclass(frozen=True, slots=True)
class _ConsumerRun:
    """How each consumer of a job runs, beside its options."""

    until_empty: bool  # it ends once the queues are drained
    unreachable_s: float  # a server out of reach this long ends it with an error
    slots_defaulted: bool  # concurrency was left out: the slots were sized here (see Consumer)
    job_tasks: tuple[str, ...] = ()  # ad-hoc tasks dropped from the process when it ends (SparkConsumerPool)


def _servers_for(spark: SparkSession) -> QueuePool:
    """Servers for consumers given no pool: local ones on a local master, else beside the driver."""
    return QueuePool.local(n_servers=2) if is_local(spark) else driver_pool(spark)


def check_count(name: str, value: int | None) -> None:
    """Refuse a count that is not a positive integer here, on the driver, rather than in every Spark task."""
    if value is not None and (type(value) is not int or value < 1):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def consumer_count(spark: SparkSession, requested: int | None, profile: ResourceProfile | None = None) -> int:
    """`requested`, or one consumer per task slot (of tasks under `profile`, when the consumers take resources).

    With no executor yet, wait up to SLOTS_WAIT_S for one; then (dynamic allocation, or a cluster
    still starting) `defaultParallelism`: tasks never wait for each other, so a guess too high only
    runs some later, and the job's watch ends it if no slot ever comes.
    """

    def slots_now() -> int:
        return task_slots(spark) if profile is None else profile_slots(spark, profile)

    if requested is not None:
        if requested > (slots := slots_now()) > 0:
            log.warning(
                "%d consumers but %d Spark task slots: the consumers beyond them start only as others end", requested, slots
            )
        return requested
    deadline = time.monotonic() + SLOTS_WAIT_S
    while (slots := slots_now()) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    if slots:
        return slots
    try:
        guess = int(spark.sparkContext.defaultParallelism)
    except Exception:
        guess = 2
    log.warning("no Spark executor has registered within %.0f s: sizing for %d consumers", SLOTS_WAIT_S, guess)
    return guess
