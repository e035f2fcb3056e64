"""The queue job under a Spark entry point: its input put on a queue, consumed by Spark tasks, read back.

`conveyor.spark.map` is an entry point over a `QueueJob`. An entry point supplies only what is its
own, a `JobForm`: the task each message runs, how an Arrow batch of input becomes the messages'
arguments (`Parcel`s), and how one server's results become output rows. The job does the rest, the
same for every entry point:

- the servers (`queue_job`): the pool given, the default one, or servers started for the call and
  stopped after it; checked to answer, and on a cluster every executor checked first (`preflight`);
- its queue, `<entry>-<job>`, declared with the job's lease and the task's attempts, and the task
  stored once on the servers as a blob;
- the put (`InputPut`): each Spark task puts its share of the input, every message with an
  idempotency key (job, task, rows before its batch, message: a retried task puts nothing twice),
  saying how many rows it carries, a server out of reach retried;
- the consumers: a `SparkConsumerPool` fed with the input (each consumer task puts its share, then
  consumes), or, with fewer input partitions than consumers, the input put first by a Spark job of
  its own; the driver's `JobWatch` over both, and the stop blob, are the consumer pool's;
- the read-back: a second Spark job, one task per server, through the form's `read`, started as
  soon as the servers say the work is done, while the consumers' job ends (`ReadAhead`); each task
  records what it read (`ReadCounts`: the input rows its messages stood for, and the output rows,
  which need not be as many) and the driver checks that every input row came back once; the output
  is computed once before the call returns, its lineage only that read;
- `MapStats`, and on a failure or an interrupt the queue dropped, or what is left said
  (`abandon_queue`).

A resumable job (`JobSettings.job`, map's `job=`) has the queue `<entry>-job-<name>` instead, and
the marker queue `<entry>-chunks-<name>`, kept when a run fails or is interrupted (or its driver
dies) so that the next run of the same call reuses what they hold. Its input is put first, by a
Spark job over the input's own partitions, in chunks whose keys say what they hold
(`conveyor.spark.resume`): a run after another puts only the chunks not put whole before (none, when
the first run got past its put), and refuses an input that changed (`JobInputChangedError`); the
read-back finding results of more rows than went in tells it too. A run that ends well keeps its
output in Spark (a checkpoint) and drops both queues.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from conveyor.client.pool import QueuePool
from conveyor.client.sharded import ShardedQueues
from conveyor.constants import (
    DEFAULT_UNREACHABLE_S,
    ERR_NO_QUEUE,
    ERR_QUEUE_CONFLICT,
    H_ROWS,
    INTERNAL_QUEUE_PREFIX,
    MAP_DEFAULT_LEASE_S,
)
from conveyor.errors import ConnectionLostError, ConveyorError, JobInputChangedError, RequestError
from conveyor.gc_policy import gc_tuned
from conveyor.message import Message
from conveyor.spark.arrow_batches import ByteBoundLift
from conveyor.spark.cluster import driver_pool, is_local
from conveyor.spark.consumers import Feed, SparkConsumerPool, check_count, consumer_count
from conveyor.spark.form import JobForm, JobTask, MakeParcels, Parcel, ReadShard, ServerOutcomes
from conveyor.spark.preflight import preflight
from conveyor.spark.read_ahead import ReadAhead
from conveyor.spark.records import ReadCounts, TaskRecords, drop_where_answering
from conveyor.spark.resources import consumer_profile
from conveyor.spark.resume import ChunkedInput, chunked_input, hashed_input, input_chunks
from conveyor.spark.session import check_workers_python
from conveyor.spark.watch import START_TIMEOUT_S, JobGroup, cancel_group
from conveyor.tasks.envelope import adhoc_task_name, function_ref
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.policy import attempts_for
from conveyor.tasks.publish import build_message, get_default_pool
from conveyor.worker.options import ConsumerOptions, refuse_shared_selector

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from conveyor.client.queue_client import QueueClient

log = logging.getLogger("conveyor.spark")

PUT_RETRY_S = 0.2  # a put to a server out of reach is tried again this often
PUT_PATIENCE = 2.0  # ... for up to this many times the job's unreachable_s
PUT_JOB_DDL = "partition long, rows long"  # a row of the job that puts the input first
READ_GROUP = "-read"  # the read-back's Spark job group: the consumers' and this (it runs beside theirs)
JOB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")  # a resumable job's name (a part of its queue's)


@dataclass(frozen=True)
class MapStats:
    """What a queue job did (`map(..., stats=True)`), for reports: its output rows, failures, and the consumers' times."""

    rows: int  # output rows (map's: one per input row)
    failed: int  # of them, rows that failed
    enqueue_s: float
    consume_s: float
    read_s: float
    consumers: list[dict[str, Any]]
    queue: str  # holds the results until dropped (`QueuePool.drop`, `conveyor drop`)
    instances: int = 0  # instances of a class given as the function the consumers built, as their results report (at least)


@dataclass(frozen=True, slots=True)
class JobSettings:
    """How an entry point's queue job runs, checked once; what the entry point does with rows is its `JobForm`.

    Only what holds for every queue job is checked here; an entry point checks its own arguments
    (map refuses `middleware`, which would take the place of its max_retries= and time_limit=).
    """

    entry: str  # the entry point's name ("map"): its queue's prefix, and what its errors and logs start with
    options: ConsumerOptions  # how each consumer runs the messages; no early_ack (every result is read back)
    n_consumers: int | None = None  # consumers, Spark tasks (None: one per task slot)
    lease_s: float = MAP_DEFAULT_LEASE_S  # the queue's lease, extended while a message runs
    unreachable_s: float = DEFAULT_UNREACHABLE_S  # a server out of reach for longer fails the job
    start_timeout_s: float = START_TIMEOUT_S  # no task started within it fails the job (NoSlotsError)
    progress: bool | None = None  # a progress bar (None: when stderr is a terminal)
    job: str | None = None  # a resumable job's name: a run again after a failure reuses the results stored
    restart: bool = False  # drop what earlier runs of the resumable job stored, and run it anew
    default_concurrency: int | None = None  # a thread consumer's threads when concurrency is left out (None: 8, grown)
    resources: dict[str, float] = dataclasses.field(default_factory=dict)  # Spark resources each consumer takes

    def __post_init__(self) -> None:
        for name in ("lease_s", "unreachable_s", "start_timeout_s"):
            check_seconds(self.entry, name, getattr(self, name))
        if self.job is not None and not (isinstance(self.job, str) and JOB_NAME.fullmatch(self.job)):
            raise ValueError(
                f"{self.entry}: job must be a name of 1-64 letters, digits, '_', '.' or '-' (not starting with '.' or '-'), "
                f"got {self.job!r:.80}"
            )
        if self.restart is not False and (self.restart is not True or self.job is None):
            raise ValueError(f"{self.entry}: restart=True is for a resumable job, with job='name'; got restart={self.restart!r}")
        if self.options.early_ack:
            raise ValueError(
                f"{self.entry}: early_ack is not for {self.entry}: a row acked on delivery leaves no result or error to read back"
            )
        check_count("n_consumers", self.n_consumers)
        refuse_shared_selector(self.entry, self.options)  # said in the entry point's name, before its consumers' check

    @property
    def resumable(self) -> bool:
        """Whether the job is a named, resumable one (`job`)."""
        return self.job is not None


def check_seconds(entry: str, name: str, value: float | None) -> None:
    """Refuse a duration that is not a number of seconds > 0 (None stands for none)."""
    if value is not None and not (isinstance(value, (int, float)) and value > 0):
        raise ValueError(f"{entry}: {name} must be a number of seconds > 0, got {value!r}")


@dataclass(frozen=True)
class JobOutcome:
    """What a job gives back: the output, computed once and kept in Spark, and its stats."""

    frame: DataFrame
    stats: MapStats


@dataclass(frozen=True)
class InputPut:
    """`put(batches, task)` -> rows put: a Spark task's input on the job's queue, as `parcels` makes messages of it.

    Every message has an idempotency key (job, task, rows before its batch, message), so that a
    Spark task retried after a failure puts nothing twice, and says how many rows it carries (its
    consumer reports them: the dashboard's progress in rows). A server out of reach is retried, as
    the consumers retry it: the driver's watch ends the job with ServerUnreachableError once it has
    been so for `unreachable_s`; should nobody, the put gives up after `patience_s`.

    With `chunked` (a resumable job's put), the task's input is cut into chunks at fixed offsets,
    whatever Arrow batches it came in; a message's key is its chunk's and its place in it, and a
    chunk put whole gets its marker (`conveyor.spark.resume`).
    """

    pool: ShardedQueues
    queue: str
    job: str
    task_name: str
    options: TaskOptions
    parcels: MakeParcels
    patience_s: float
    chunked: ChunkedInput | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch], task: int) -> int:
        if self.chunked is not None:
            return self._put_chunks(self.chunked, batches, task)
        n = 0
        now = time.time()
        for batch in batches:
            self._put(
                self.queue, [self._message(p, f"{self.job}:{task}:{n}:{j}", now) for j, p in enumerate(self.parcels(batch))]
            )
            n += batch.num_rows
        return n

    def _put_chunks(self, chunked: ChunkedInput, batches: Iterator[pa.RecordBatch], task: int) -> int:
        n = 0
        now = time.time()
        for key, chunk in chunked.chunks(batches, task):
            if not (chunked.skip_landed and self.pool.stored(chunked.markers, [key])[0]):
                self._put(self.queue, [self._message(p, f"{key}:{j}", now) for j, p in enumerate(self.parcels(chunk))])
                self._put(chunked.markers, [chunked.marker(key)])
            n += chunk.num_rows
        return n

    def _message(self, parcel: Parcel, key: str, now: float) -> Message:
        m = build_message(self.task_name, self.options, parcel.args, {}, key=key, now=now)
        return dataclasses.replace(m, headers={**m.headers, H_ROWS: str(parcel.rows)})

    def _put(self, queue: str, messages: list[Message]) -> None:
        if not messages:
            return
        deadline = time.monotonic() + self.patience_s
        while True:
            try:
                self.pool.put(queue, messages)
                return
            except ConnectionLostError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(PUT_RETRY_S)


class QueueJob:
    """One queue job on `pool`: `run(df, form)` puts df's rows, consumes them, reads the results back.

    Made by `queue_job`, which picks and checks the servers. `queue` holds the results once the job
    has run (the caller drops it when done); a job that fails drops it itself (`abandon_queue`). A
    resumable job's queue is the job's: kept when a run fails, dropped when one ends well.
    """

    def __init__(self, spark: SparkSession, pool: QueuePool, settings: JobSettings, *, ephemeral: bool) -> None:
        self.spark, self.pool, self.settings = spark, pool, settings
        self.ephemeral = ephemeral  # servers started for this job: they stop when it ends
        self.id = uuid.uuid4().hex[:12]  # this run's: its bookkeeping queues, and its keys unless resumable
        self.queue = f"{settings.entry}-job-{settings.job}" if settings.resumable else f"{settings.entry}-{self.id}"
        self.markers = f"{settings.entry}-chunks-{settings.job}"  # a resumable job's: markers of its chunks put whole
        self.read_counts = TaskRecords(f"{INTERNAL_QUEUE_PREFIX}read-{self.id}", ReadCounts)

    def run(self, df: DataFrame, form: JobForm) -> JobOutcome:
        """Put `df` through the queue and read the output back; a failure or an interrupt abandons the queue.

        A resumable job's queue is kept instead, with what it holds, for the next run.
        """
        try:
            outcome = self._run(df, form)
        except BaseException as e:
            if self.settings.resumable:
                self._keep_for_next_run(e)
            else:
                abandon_queue(self.pool, self.queue, e, entry=self.settings.entry, ephemeral=self.ephemeral)
            raise
        if self.settings.resumable:
            self._finish_job()
        return outcome

    def _run(self, df: DataFrame, form: JobForm) -> JobOutcome:
        s = self.settings
        if s.restart:
            self._drop_job_queue()
        task_name = self._declare(form.task)
        # declared now, not once the consumers are done: a declare's fsync right after a job's writes
        # waits for them to reach the disk (15-40 ms in W1 against ~3 ms here)
        self.read_counts.declare(self.pool.queues)
        try:
            return self._consumed_and_read(df, form, task_name)
        finally:
            self.read_counts.drop(self.pool.queues)

    def _consumed_and_read(self, df: DataFrame, form: JobForm, task_name: str) -> JobOutcome:
        s = self.settings
        put = InputPut(
            self.pool.queues,
            self.queue,
            s.job if s.job is not None else self.id,
            task_name,
            form.task.options,
            form.parcels,
            PUT_PATIENCE * s.unreachable_s,
            chunked_input(df, s.job, form.message_rows, self.markers) if s.job is not None else None,
        )
        t0 = time.time()
        n = consumer_count(self.spark, s.n_consumers, consumer_profile(self.spark, s.entry, s.resources))
        # each of n consumer tasks puts its share of the rows, then consumes; a resumable job's rows are put
        # first, by the input's own partitions, so that its keys do not depend on the consumers
        fed = not s.resumable and n <= _partitions(df)
        consumers = SparkConsumerPool(
            self.spark,
            self.pool,
            n,
            queues=[self.queue],
            description=f"conveyor.spark.{s.entry} through {self.queue}",
            feed=Feed(df, put) if fed else None,
            unreachable_s=s.unreachable_s,
            start_timeout_s=s.start_timeout_s,
            progress=s.progress,
            options=s.options,
            where=s.entry,
            job_tasks=[task_name],  # built instances (a model) end with the job's consumers
            default_concurrency=s.default_concurrency,
            resources=s.resources or None,
        )
        rows, t1 = 0, t0  # rows put before consuming, and when that ended (when the consumers put them: none, at once)
        if put.chunked is not None:
            rows, t1 = self._put_chunks(df, put, put.chunked, consumers), time.time()
        elif not fed:
            rows, t1 = self._put_first(df, put, consumers), time.time()
        group = consumers.job_group(READ_GROUP)
        with (
            self.pool.queues.own_connections() as watching,
            ReadAhead(
                lambda: self._read_plan(form),
                lambda plan: self._read_back(plan, group),
                lambda wait_s: consumers.work_done(watching, wait_s),
                lambda: cancel_group(self.spark, group.group),
            ) as ahead,
        ):
            done = consumers.run_rows()
            rows += consumers.fed_rows
            t2 = min(max((c.finished for c in done), default=t1), time.time())
            frame = ahead.result()
        got = self._counts_read()
        t3 = time.time()
        if got.inputs > rows and s.resumable:
            raise JobInputChangedError(
                f"{s.entry}: job {s.job!r}: its queue {self.queue} holds results of {got.inputs - rows:,} rows more than "
                f"this input's {rows:,}: the input is not the one of the job's earlier runs (rows, their order or their "
                "partitions changed). The queue is kept: run the job over its earlier input to reuse them, or pass "
                "restart=True to run it anew over this one"
            )
        if got.inputs != rows:
            lost = (
                ""
                if s.resumable
                else " A queue server whose host lost power or crashed during the job and came back within "
                "unreachable_s loses what the job's queue had not yet written to disk (it is kept without fsync: "
                "docs/spark.md): run it again. Otherwise,"
            )
            raise ConveyorError(
                f"{s.entry}: {rows:,} rows went in but the read-back accounts for {got.inputs:,} of them "
                f"(queue {self.queue}).{lost} please report this"
            )
        consumer_stats = [c.as_dict() for c in done]
        return JobOutcome(
            frame, MapStats(got.rows, got.failed, t1 - t0, t2 - t1, t3 - t2, consumer_stats, self.queue, got.instances)
        )

    def _declare(self, task: JobTask) -> str:
        """Declare the job's queue and store its task; returns the name its messages call the task by."""
        if task.options.queue != self.queue:
            raise ValueError(f"the job's task goes to queue {task.options.queue!r}, not the job's own {self.queue!r}")
        # A job's queue lives as long as the call, unless resumable: its writes are left to the OS
        # (fsync="never"). A server process that dies and starts again on its data keeps them (they
        # are in the OS's cache), so the map goes on; only a host that loses power and comes back
        # within unreachable_s may lose some, which the read-back's count reports.
        fsync = None if self.settings.resumable else "never"
        try:
            self.pool.queues.declare(
                self.queue, lease_s=self.settings.lease_s, max_attempts=attempts_for(task.options.max_retries), fsync=fsync
            )
        except RequestError as e:
            if e.kind != ERR_QUEUE_CONFLICT or not self.settings.resumable:
                raise
            raise ConveyorError(
                f"{self.settings.entry}: job {self.settings.job!r} was run before with other settings ({e}): run it "
                "with the same lease_s and max_retries to go on from its results, or pass restart=True to run it anew"
            ) from None
        ref = function_ref(task.run)
        self.pool.queues.put_function(ref)
        return adhoc_task_name(ref.digest)

    def _put_first(self, df: DataFrame, put: InputPut, consumers: SparkConsumerPool) -> int:
        """Fewer partitions than consumers: the rows put by a Spark job of their own; returns how many."""
        lift = ByteBoundLift(self.spark, df.schema)
        with consumers.job_group(), lift, consumers.watch(consuming=False, started=lift.release):
            counts = df.mapInArrow(_put_task(put), PUT_JOB_DDL).collect()
        return sum(r["rows"] for r in counts)

    def _put_chunks(self, df: DataFrame, put: InputPut, chunked: ChunkedInput, consumers: SparkConsumerPool) -> int:
        """A resumable job's input put first, but for the chunks an earlier run put whole; returns its rows.

        With markers from earlier runs, the input's chunks are named in the JVM first: if the
        servers hold a marker for each, nothing is put; if they hold markers of chunks this input
        does not have, it is refused.
        """
        hashed = hashed_input(df)
        earlier = self._markers_held()
        if not earlier:
            return self._put_first(hashed, put, consumers)
        with consumers.job_group(), consumers.watch(consuming=False):
            chunks = input_chunks(hashed, chunked)
        landed = sum(1 for i in self.pool.queues.stored(self.markers, [c.key for c in chunks]) if i)
        if landed < earlier:
            s = self.settings
            raise JobInputChangedError(
                f"{s.entry}: job {s.job!r}: {earlier - landed:,} of the {earlier:,} chunks of input its earlier runs put "
                "are not in this input: it is not the one of the job's earlier runs (rows, their order or their "
                "partitions changed). Nothing was put; the job's queues are kept: run it over its earlier input to "
                "reuse what they hold, or pass restart=True to run it anew over this one"
            )
        log.info(
            "%s: job %r: %d of its %d chunks of input were put by an earlier run",
            self.settings.entry,
            self.settings.job,
            landed,
            len(chunks),
        )
        if landed < len(chunks):
            self._put_first(hashed, dataclasses.replace(put, chunked=chunked.landed_too()), consumers)
        return sum(c.rows for c in chunks)

    def _markers_held(self) -> int:
        """How many chunks earlier runs of the resumable job put whole (their markers)."""
        try:
            return self.pool.queues.stats(self.markers)[self.markers].pending
        except RequestError as e:
            if e.kind != ERR_NO_QUEUE:
                raise
            return 0

    def _read_plan(self, form: JobForm) -> DataFrame:
        """The read-back, not yet run: one Spark task per server, reading its results."""
        shards = len(self.pool.queues)
        return self.spark.range(shards, numPartitions=shards).mapInArrow(
            _read_task(self.pool.queues, self.queue, form.read, self.read_counts), form.output
        )

    def _read_back(self, read: DataFrame, group: JobGroup) -> DataFrame:
        """The output: the read-back (`_read_plan`) computed once (`_materialize`), its Spark job in `group`."""
        with group:
            return self._materialize(read)

    def _counts_read(self) -> ReadCounts:
        """What the read-back tasks read, summed; an error if one said nothing."""
        by_shard = self.read_counts.read(self.pool.queues)
        if len(by_shard) != len(self.pool.queues):
            missing = sorted(set(range(len(self.pool.queues))) - set(by_shard))
            raise ConveyorError(
                f"{self.settings.entry}: the read-back of server(s) {missing} did not say what it read; please report this"
            )
        return sum(by_shard.values(), ReadCounts(0, 0, 0))

    def _drop_job_queue(self) -> None:
        """restart=True: what earlier runs of the resumable job stored, dropped on every server (all must answer)."""
        for client in self.pool.queues.clients:
            for queue in (self.queue, self.markers):
                if client.drop(queue):
                    log.info(
                        "%s: job %r: dropped its queue %s on %s (restart)",
                        self.settings.entry,
                        self.settings.job,
                        queue,
                        client.address,
                    )

    def _keep_for_next_run(self, error: BaseException) -> None:
        """A resumable job's run failed or was interrupted: its queue stays, and the error says how to go on."""
        s = self.settings
        what = (
            f"job {s.job!r} keeps what it has done in its queues {self.queue} and {self.markers}: run the same call "
            "again to go on from there (restart=True to run it anew; pool.drop or conveyor drop to give it up)"
        )
        log.info("%s: %s", s.entry, what)
        error.add_note(f"conveyor.spark.{s.entry}: {what}")

    def _finish_job(self) -> None:
        """A resumable job that ended well: its output is in Spark (checkpointed), so its queue goes."""
        for queue in (self.queue, self.markers):
            left = drop_where_answering(self.pool.queues, queue)
            if left:
                log.warning(
                    "%s: job %r is done but its queue %s may be left on %s; drop it with: %s",
                    self.settings.entry,
                    self.settings.job,
                    queue,
                    ", ".join(left),
                    drop_command(left, queue),
                )

    def _materialize(self, result: DataFrame) -> DataFrame:
        """Compute the rows once and keep them in Spark, in one single-stage job.

        With servers that stop when the call returns, or a resumable job's queue, dropped once it
        ends well, the lineage is cut: the rows no longer need the servers (a checkpoint in Spark's
        checkpoint directory if one is set, which outlives a lost executor; else a local one). With
        servers that stay, the rows are persisted and the lineage (a read from the servers) kept, so
        that rows lost with an executor are read again; a write to Spark's "noop" sink computes (and
        so caches) them without a shuffle or a trip through Python.
        """
        from pyspark import StorageLevel

        if self.settings.resumable and _checkpoint_dir(self.spark):
            return result.checkpoint(eager=True)
        if self.ephemeral or self.settings.resumable:
            return result.localCheckpoint(eager=True)
        result = result.persist(StorageLevel.MEMORY_AND_DISK)
        result.write.format("noop").mode("overwrite").save()
        return result


@contextmanager
def queue_job(
    spark: SparkSession, queue_pool: QueuePool | None, settings: JobSettings, *, task_modules: Sequence[str]
) -> Iterator[QueueJob]:
    """A `QueueJob` on `queue_pool`, the default pool, or servers started for it (stopped when the block ends).

    The servers must answer; on a cluster every executor must import conveyor and `task_modules`
    and reach them (`conveyor.spark.preflight`).
    """
    check_workers_python(spark)
    with ExitStack() as stack:
        ephemeral = queue_pool is None and _ambient(settings.entry) is None  # servers that stop when the job ends
        if ephemeral and settings.resumable:
            raise ValueError(
                f"{settings.entry}: job={settings.job!r} needs queue servers that outlive the call, where its results wait "
                "for the next run: pass queue_pool= (servers of `conveyor serve --data-dir`), or run it under "
                "conveyor.local(data_dir=...), whose servers start again on the same data"
            )
        pool = queue_pool if queue_pool is not None else _default_pool(stack, spark, settings.entry)
        _check_servers(pool.queues, settings.entry)
        if not is_local(spark):  # every executor can import conveyor and the task's module, and reach the servers
            preflight(
                spark,
                pool.queues,
                list(task_modules),
                unreachable_s=settings.unreachable_s,
                start_timeout_s=settings.start_timeout_s,
            )
        yield QueueJob(spark, pool, settings, ephemeral=ephemeral)


def module_of(func: Callable[..., Any]) -> list[str]:
    """The module a function is pickled by reference to (the executors import it), if not ours or __main__."""
    module = getattr(func, "__module__", None) or getattr(type(func), "__module__", None)
    if not module or module == "__main__" or module.split(".")[0] in ("conveyor", "builtins"):
        return []
    return [module] if getattr(sys.modules.get(module), "__file__", None) else []


def abandon_queue(pool: QueuePool, queue: str, error: BaseException, *, entry: str, ephemeral: bool) -> None:
    """Clean up after a job that failed or was interrupted, and say what is left (a note on `error`).

    Its queue is dropped where the servers answer. What is left elsewhere is pointed at only on
    servers that outlive this program (a pool the user gave): servers it started stop with it (a
    Ctrl-C reaches them only through their stop), their queues gone with them unless they keep a
    data directory. An ephemeral pool's servers stop with the call, their data with them.
    """

    def say(level: int, what: str) -> None:  # in the log, and on the error (Python 3.11+: the log says it on 3.10)
        log.log(level, "%s: %s", entry, what)
        if hasattr(error, "add_note"):
            error.add_note(f"conveyor.spark.{entry}: {what}")

    if ephemeral:
        say(logging.INFO, f"the servers started for this {entry} stop with it: nothing is left behind")
        return
    left = drop_where_answering(pool.queues, queue)
    if not left:
        say(logging.INFO, f"dropped its queue {queue}: nothing is left behind")
    elif pool.servers is not None and pool.servers.data_dir is None:
        say(logging.INFO, f"its queue {queue} goes with the servers this program started: nothing is left behind")
    elif pool.servers is not None:
        say(
            logging.WARNING,
            f"its queue {queue} stays in {pool.servers.data_dir}: drop it (pool.drop) when servers run on it again",
        )
    else:
        say(logging.ERROR, f"could not drop its queue {queue} on {', '.join(left)}; drop it with: {drop_command(left, queue)}")


def drop_command(servers: Sequence[str], queue: str) -> str:
    """The command that drops `queue` on `servers` (those where the program could not)."""
    return f"conveyor drop --connect {','.join(servers)} {queue}"


def _ambient(entry: str) -> QueuePool | None:
    """The default pool (`conveyor.local()`, `set_default_pool`), which must be a QueuePool."""
    pool = get_default_pool()
    if pool is not None and not isinstance(pool, QueuePool):
        raise ConveyorError(f"{entry}: the default pool is a {type(pool).__name__}, not a QueuePool: pass queue_pool=...")
    return pool


def _default_pool(stack: ExitStack, spark: SparkSession, entry: str) -> QueuePool:
    ambient = _ambient(entry)
    if ambient is not None:
        return ambient
    if not is_local(spark):
        log.info("conveyor.spark.%s: no pool given on a cluster: starting queue servers beside the driver for this call", entry)
        return stack.enter_context(driver_pool(spark))
    log.info("conveyor.spark.%s: no pool given and no conveyor.local(): starting local queue servers for this call", entry)
    return stack.enter_context(QueuePool.local(n_servers=2))


def _check_servers(pool: ShardedQueues, entry: str) -> None:
    """Fail at once, naming the servers, when some do not answer (rather than a bare ConnectionLostError later)."""
    down = [f"{c.address} ({p})" for c, p in zip(pool.clients, pool.reachable_stats(), strict=True) if isinstance(p, Exception)]
    if down:
        raise ConnectionLostError(f"{entry}: {len(down)} of {len(pool)} queue server(s) do not answer: {'; '.join(down)}")


def _checkpoint_dir(spark: SparkSession) -> str | None:
    """Spark's checkpoint directory, if one is set (None where it cannot be told: Spark Connect)."""
    try:
        return spark.sparkContext.getCheckpointDir()
    except Exception:
        return None


def _partitions(df: DataFrame) -> int:
    """The DataFrame's partitions (0 where it cannot be told without computing it: Spark Connect)."""
    try:
        return int(df.rdd.getNumPartitions())
    except Exception:
        return 0


# --- executor side --------------------------------------------------------------------------------
def _put_task(put: InputPut) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function of the job that puts the input first: a partition's rows on the queue; one row of counts."""

    def put_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        part = cast("TaskContext", TaskContext.get()).partitionId()  # always set inside a Spark task
        with gc_tuned():  # Spark's collection after the task then walks only what came after it
            n = put(batches, part)
            put.pool.close()
        yield pa.RecordBatch.from_pylist([{"partition": part, "rows": n}])

    return put_partition


def _read_task(
    pool: ShardedQueues, queue: str, read: ReadShard, records: TaskRecords[ReadCounts]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function of the read-back job: task i yields the output rows of server i (none if it lost the queue).

    Then it records what it read, once (`records`), while the job waits for them: a partition read
    again later, with the records queue gone, records nothing.
    """

    def read_shard(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        for _ in batches:
            pass
        shard = cast("TaskContext", TaskContext.get()).partitionId()  # always set inside a Spark task
        with gc_tuned():  # Spark's collection after the task then walks only what came after it
            try:
                client = pool.clients[shard]
                counts = ReadCounts(0, 0, 0)
                if queue in _queues(client):
                    counts = yield from read(ServerOutcomes(client, queue, shard))
                if records.queue in _queues(client):
                    records.record(client, shard, counts)
            finally:
                pool.close()

    return read_shard


def _queues(client: QueueClient) -> set[str]:
    """The names of the queues a server holds."""
    return {q.name for q in client.queues()}
