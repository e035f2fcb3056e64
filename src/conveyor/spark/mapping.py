"""`conveyor.spark.map`: a DataFrame mapped through the queue, row by row, back into a DataFrame.

1. Enqueue and consume (one Spark job): each consumer task puts its share of the input rows on the
   queue servers (nothing is collected on the driver), then works off the queue with the others
   until it is drained. A few rows in order make one message, a `RowRunner(func)` call as an
   ad-hoc task, with an idempotency key `job:partition:first row`, so a Spark task retried after a
   failure does not enqueue its rows twice. Work is balanced message by message, failing rows are
   retried, and the messages held by a lost consumer come back when their leases end (a running
   message's lease is extended every third of `lease_s`, so a short lease costs little). With
   fewer input partitions than consumers, the rows are put first, in a job of their own.
2. Read back (a second Spark job, of one stage): one task per queue server reads its results (and
   dead letters) into the output DataFrame, which is computed once before `map` returns, and says
   how many rows it read in a small queue of the map's (the driver checks that every row came
   out, and counts the failures, without a second job). Its lineage is only that read: a
   partition lost with an executor later is read again from the servers.

No task waits for another to start (see `SparkConsumerPool`), so fewer slots than tasks, or a lost
host, never deadlock the job; the driver watches it and ends it with the reason when a server
stays out of reach (`unreachable_s`) or no slot is granted. A map that fails, or is interrupted,
drops its queue (or says how to).

Rows travel up to `rows_per_message` to a message (a few rows per message cut the queue's overhead
per row; balancing is at that grain), dealt from each Arrow batch so that neighbours spread out. The
output has one row per input row, whatever happened on the way (the store keeps exactly one result
per message): the `schema` columns from `func(row)`, plus `_id` (the id of the row's message) and
`_error` (None, or the error of a row that failed after its retries, whose `schema` columns are then
null and whose input row is in `_input`, as JSON).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast, overload

from conveyor.client.pool import QueuePool
from conveyor.client.sharded import ShardedQueues
from conveyor.constants import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_UNREACHABLE_S,
    MAP_DEFAULT_LEASE_S,
    MAP_DEFAULT_ROWS_PER_MESSAGE,
)
from conveyor.errors import ConnectionLostError, ConveyorError
from conveyor.spark.cluster import driver_pool, is_local
from conveyor.spark.consumers import SparkConsumerPool, check_count, consumer_count, said, say_once
from conveyor.spark.preflight import preflight
from conveyor.spark.rows import EXTRA_COLUMNS, MAX_ROWS_PER_MESSAGE, RowRunner, put_partitions, putter, read_results, with_extra
from conveyor.spark.session import check_workers_python
from conveyor.spark.watch import START_TIMEOUT_S
from conveyor.tasks.envelope import adhoc_task_name, function_ref
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.policy import attempts_for, check_max_retries
from conveyor.tasks.publish import get_default_pool
from conveyor.worker.options import ConsumerKeywords, ConsumerOptions, options_of

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType
    from typing_extensions import Unpack  # typing.Unpack is 3.11+; only the type checker reads it


log = logging.getLogger("conveyor.spark")


@dataclass(frozen=True)
class MapStats:
    """What a `map` did (`map(..., stats=True)`), for reports: rows in and out, failures, and the consumers' times."""

    rows: int
    failed: int
    enqueue_s: float
    consume_s: float
    read_s: float
    consumers: list[dict[str, Any]]
    queue: str  # holds the results until dropped (`QueuePool.drop`, `conveyor drop`)


@overload
def map(
    df: DataFrame,
    func: Callable[[dict[str, Any]], Any],
    *,
    schema: str | StructType,
    queue_pool: QueuePool | None = ...,
    n_consumers: int | None = ...,
    max_retries: int = ...,
    time_limit: float | None = ...,
    lease_s: float = ...,
    rows_per_message: int | None = ...,
    unreachable_s: float = ...,
    start_timeout_s: float = ...,
    progress: bool | None = ...,
    stats: Literal[False] = ...,
    options: ConsumerOptions | None = ...,
    **keywords: Unpack[ConsumerKeywords],
) -> DataFrame: ...
@overload
def map(
    df: DataFrame,
    func: Callable[[dict[str, Any]], Any],
    *,
    schema: str | StructType,
    queue_pool: QueuePool | None = ...,
    n_consumers: int | None = ...,
    max_retries: int = ...,
    time_limit: float | None = ...,
    lease_s: float = ...,
    rows_per_message: int | None = ...,
    unreachable_s: float = ...,
    start_timeout_s: float = ...,
    progress: bool | None = ...,
    stats: Literal[True],
    options: ConsumerOptions | None = ...,
    **keywords: Unpack[ConsumerKeywords],
) -> tuple[DataFrame, MapStats]: ...
def map(
    df: DataFrame,
    func: Callable[[dict[str, Any]], Any],
    *,
    schema: str | StructType,
    queue_pool: QueuePool | None = None,
    n_consumers: int | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    time_limit: float | None = None,
    lease_s: float = MAP_DEFAULT_LEASE_S,
    rows_per_message: int | None = None,
    unreachable_s: float = DEFAULT_UNREACHABLE_S,
    start_timeout_s: float = START_TIMEOUT_S,
    progress: bool | None = None,
    stats: bool = False,
    options: ConsumerOptions | None = None,
    **keywords: Unpack[ConsumerKeywords],
) -> DataFrame | tuple[DataFrame, MapStats]:
    """Apply `func` to every row of `df` through the queue; returns the results as a DataFrame.

    func: called with each row as a dict; returns the output row as a dict (by column name), a
        tuple (in `schema` order) or, for a one-column schema, the value.
    schema: the output columns (DDL string or StructType), without `_id`, `_error`, `_input`.
    queue_pool: the queue servers; None: the default pool (`conveyor.local()`'s, `conveyor.cluster()`'s,
        or `set_default_pool`'s, which must be a QueuePool), or else servers started for this call
        and stopped after it: on this machine for local Spark, beside the driver on a cluster (with
        a token and TLS: `conveyor.spark.cluster`). The output is read back from the servers if an
        executor holding part of it is lost later; with servers stopped after the call it is
        checkpointed on the executors instead. On a cluster the executors are checked first
        (`conveyor.spark.preflight`): conveyor and func's module importable, the servers reachable.
    n_consumers: the consumers, Spark tasks (default: one per task slot; see `SparkConsumerPool`).
    options (`options=`, or keywords of their names: `concurrency`, `pool`, `batch_size`, ...):
        how each consumer runs the rows, `ConsumerOptions` (all but `early_ack`: every row's result
        is read back; and `middleware`: a row's retries and time limit are `max_retries` and
        `time_limit`).
    max_retries: a row that raises is run again, up to this many times, then reported.
    time_limit: seconds a row may take; a row over it fails (and is retried). The limit holds a
        message, so with it rows travel one to a message unless `rows_per_message` is given: then
        a message of k rows gets k * time_limit, and running over fails all its rows.
    lease_s: the queue's lease, extended every third of it while a message runs (a heartbeat):
        rows held by a consumer that died, or whose host was lost, come back after at most this long.
    rows_per_message: at most this many rows travel and run together (default 8; 1 with a
        `time_limit`). They run on one worker; an Arrow batch is dealt out over its messages like
        cards, so costly neighbours spread out. Balancing is at this grain; each message costs the
        queue the same, so a few rows per message cut its overhead per row. Use 1 for rows that
        take seconds, more (up to 1,000) for tiny ones. A message delivered again (its worker
        died or stopped, or it ran over its time) is split into one message per row: the row at
        fault fails alone (with max_retries=0 there is no second delivery: all its rows fail).
    unreachable_s: a queue server out of reach for longer fails the map (`ServerUnreachableError`,
        naming the server and what it held); one back within it, and the map goes on.
    start_timeout_s: no Spark task of the map started within it (the cluster grants no slot) fails
        the map (`NoSlotsError`).
    progress: a progress bar while the rows are processed (default: when stderr is a terminal).
    stats: also return what the call did (`MapStats`: rows, failures, times, the results queue):
        `out, st = map(..., stats=True)`.
    """
    import pyarrow  # noqa: F401 - fail early, here, if it is missing

    if not callable(func):
        raise TypeError(f"map: func must be callable (it gets each row as a dict), got {type(func).__name__}")
    if rows_per_message is None:
        rows_per_message = MAP_DEFAULT_ROWS_PER_MESSAGE if time_limit is None else 1
    if type(rows_per_message) is not int or not 1 <= rows_per_message <= MAX_ROWS_PER_MESSAGE:
        raise ValueError(f"map: rows_per_message must be an integer in 1..{MAX_ROWS_PER_MESSAGE}, got {rows_per_message!r}")
    check_max_retries(max_retries, "map: ")
    for name, value in (
        ("time_limit", time_limit),
        ("lease_s", lease_s),
        ("unreachable_s", unreachable_s),
        ("start_timeout_s", start_timeout_s),
    ):
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"map: {name} must be a number of seconds > 0, got {value!r}")
    consumer_options = options_of("map", options, keywords)
    if consumer_options.early_ack:
        raise ValueError("map: early_ack is not for map: a row acked on delivery leaves no result or error to read back")
    if consumer_options.middleware is not None:  # it would take the place of the Retries and TimeLimits that serve them
        raise ValueError(
            "map: middleware is not for map: its rows' retries and time limit are map's own max_retries= and time_limit="
        )
    check_count("n_consumers", n_consumers)
    pool = queue_pool
    spark: SparkSession = df.sparkSession
    out_schema = _output_schema(spark, schema)
    check_workers_python(spark)
    with ExitStack() as stack:
        ephemeral = pool is None and _ambient() is None  # servers that stop when map returns
        if pool is None:
            pool = _default_pool(stack, spark)
        _check_servers(pool.queues)
        if not is_local(spark):  # every executor can import conveyor and func's module, and reach the servers
            preflight(spark, pool.queues, _module_of(func), unreachable_s=unreachable_s, start_timeout_s=start_timeout_s)
        job = uuid.uuid4().hex[:12]
        queue = f"map-{job}"
        try:
            return _run(
                spark,
                df,
                func,
                out_schema,
                pool,
                queue,
                job,
                ephemeral,
                stats=stats,
                n_consumers=n_consumers,
                max_retries=max_retries,
                time_limit=time_limit,
                lease_s=lease_s,
                rows_per_message=rows_per_message,
                unreachable_s=unreachable_s,
                start_timeout_s=start_timeout_s,
                progress=progress,
                options=consumer_options,
            )
        except BaseException as e:
            _abandon(pool, queue, e, ephemeral)
            raise


def _run(
    spark: SparkSession,
    df: DataFrame,
    func: Callable[[dict[str, Any]], Any],
    out_schema: StructType,
    pool: QueuePool,
    queue: str,
    job: str,
    ephemeral: bool,
    *,
    stats: bool,
    n_consumers: int | None,
    max_retries: int,
    time_limit: float | None,
    lease_s: float,
    rows_per_message: int,
    unreachable_s: float,
    start_timeout_s: float,
    progress: bool | None,
    options: ConsumerOptions,
) -> DataFrame | tuple[DataFrame, MapStats]:
    from pyspark.sql.pandas.types import to_arrow_schema

    queues = pool.queues
    queues.declare(queue, lease_s=lease_s, max_attempts=attempts_for(max_retries))
    # a message is delivered again only when its worker died or it ran over its time limit
    opts = TaskOptions(
        queue=queue, time_limit=None if time_limit is None else time_limit * rows_per_message, max_retries=max_retries
    )
    row_opts = TaskOptions(queue=queue, time_limit=time_limit, max_retries=max_retries)  # of a row split off (RowRunner)
    ref = function_ref(RowRunner(func, max_retries, to_arrow_schema(out_schema), row_opts))
    queues.put_blob(ref.data)

    t0 = time.time()
    put_rows = putter(queues, queue, job, adhoc_task_name(ref.digest), opts, rows_per_message, unreachable_s)
    n = consumer_count(spark, n_consumers)
    rows, t1 = 0, t0  # rows put before consuming, and when that ended (when consumers put them: none, at once)
    fed = n <= _partitions(df)  # each of n tasks puts its share of the rows, then consumes
    consumers = SparkConsumerPool(
        spark,
        pool,
        n,
        queues=[queue],
        description=f"conveyor.spark.map through {queue}",
        feed=(df, put_rows) if fed else None,
        unreachable_s=unreachable_s,
        start_timeout_s=start_timeout_s,
        progress=progress,
        options=options,
    )
    if not fed:  # fewer partitions than consumers: put the rows first (a job of its own), then consume
        with consumers.job_group(), consumers.watch(consuming=False):
            counts = df.mapInArrow(put_partitions(queues, put_rows), "partition long, rows long").collect()
        rows, t1 = sum(r["rows"] for r in counts), time.time()
    done = consumers.run()
    rows += consumers.fed_rows  # what the consumer tasks put themselves
    t2 = min(max((s["finished"] for s in done), default=t1), time.time())
    shards = len(queues)
    tally = tally_queue(job)
    queues.declare(tally)
    try:
        read = spark.range(shards, numPartitions=shards).mapInArrow(
            _reader(queues, queue, out_schema, tally), with_extra(out_schema)
        )
        with consumers.job_group():
            result = _materialize(read, ephemeral)
        got, failed = _tallied(queues, tally, shards)
    finally:
        for c in queues.health.answering():  # no wait on a server that is gone: the map fails on it anyway
            with contextlib.suppress(ConveyorError, OSError):
                c.drop(tally)
    t3 = time.time()
    if got != rows:
        raise ConveyorError(f"map: {rows:,} rows went in but {got:,} came out (queue {queue}); please report this")
    if failed:
        log.warning("map: %d of %d rows failed; see the _error column", failed, rows)
    return (result, MapStats(rows, failed, t1 - t0, t2 - t1, t3 - t2, done, queue)) if stats else result


def _reader(
    pool: ShardedQueues, queue: str, schema: StructType, tally: str
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function of the read-back job: task i yields the rows of server i.

    Then it says how many it yielded (and how many failed) in `tally`, once (an idempotency key),
    while `map` waits for them: a partition read again later, with `tally` gone, says nothing.
    """

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        for _ in batches:
            pass
        shard = cast("TaskContext", TaskContext.get()).partitionId()  # always set inside a Spark task
        try:
            counts = yield from read_results(pool, queue, schema, [shard])
            client = pool.clients[shard]
            if tally in {q.name for q in client.queues()}:
                say_once(client, tally, f"{tally}:{shard}", {"shard": shard, **counts})
        finally:
            pool.close()

    return read


def tally_queue(job: str) -> str:
    """Where the read-back tasks of map `job` say how many rows they read (see `_reader`)."""
    return f"conveyor-read-{job}"


def _tallied(pool: ShardedQueues, tally: str, shards: int) -> tuple[int, int]:
    """(rows, failed rows) the read-back tasks said they read; an error if a task said nothing."""
    by_shard = {d["shard"]: d for d in said(pool, tally)}
    if len(by_shard) != shards:
        missing = sorted(set(range(shards)) - set(by_shard))
        raise ConveyorError(f"map: the read-back of server(s) {missing} did not say what it read; please report this")
    return sum(d["out_rows"] for d in by_shard.values()), sum(d["out_failed"] for d in by_shard.values())


def _module_of(func: Callable[..., Any]) -> list[str]:
    """The module a function is pickled by reference to (the executors import it), if not ours or __main__."""
    module = getattr(func, "__module__", None) or getattr(type(func), "__module__", None)
    if not module or module == "__main__" or module.split(".")[0] in ("conveyor", "builtins"):
        return []
    return [module] if getattr(sys.modules.get(module), "__file__", None) else []


def _check_servers(pool: ShardedQueues) -> None:
    """Fail at once, naming the servers, when some do not answer (rather than a bare ConnectionLostError later)."""
    down = [f"{c.address} ({p})" for c, p in zip(pool.clients, pool.reachable_stats(), strict=True) if isinstance(p, Exception)]
    if down:
        raise ConnectionLostError(f"map: {len(down)} of {len(pool)} queue server(s) do not answer: {'; '.join(down)}")


def _abandon(pool: QueuePool, queue: str, error: BaseException, ephemeral: bool) -> None:
    """Clean up after a map that failed or was interrupted, and say what is left (a note on `error`).

    Its queue is dropped where the servers answer. What is left elsewhere is pointed at only on
    servers that outlive this program (a pool the user gave): servers it started stop with it (a
    Ctrl-C reaches them only through their stop), their queues gone with them unless they keep a
    data directory. An ephemeral pool's servers stop with the call, their data with them.
    """
    if ephemeral:
        _say(error, logging.INFO, "the servers started for this map stop with it: nothing is left behind")
        return
    up = pool.queues.health.answering()
    left = [c.address for c in pool.queues.clients if c not in up]
    for c in up:
        try:
            c.drop(queue)
        except (ConveyorError, OSError):
            left.append(c.address)
    if not left:
        _say(error, logging.INFO, f"dropped its queue {queue}: nothing is left behind")
    elif pool.servers is not None and pool.servers.data_dir is None:
        _say(error, logging.INFO, f"its queue {queue} goes with the servers this program started: nothing is left behind")
    elif pool.servers is not None:
        kept = f"its queue {queue} stays in {pool.servers.data_dir}: drop it (pool.drop) when servers run on it again"
        _say(error, logging.WARNING, kept)
    else:
        how = f"conveyor drop --connect {','.join(left)} {queue}"
        _say(error, logging.ERROR, f"could not drop its queue {queue} on {', '.join(left)}; drop it with: {how}")


def _say(error: BaseException, level: int, what: str) -> None:
    """Log what a failed map left behind and add it to its error (Python 3.11+: the log says it on 3.10)."""
    log.log(level, "map: %s", what)
    if hasattr(error, "add_note"):
        error.add_note(f"conveyor.spark.map: {what}")


def _ambient() -> QueuePool | None:
    """The default pool (`conveyor.local()`, `set_default_pool`), which must be a QueuePool."""
    pool = get_default_pool()
    if pool is not None and not isinstance(pool, QueuePool):
        raise ConveyorError(f"map: the default pool is a {type(pool).__name__}, not a QueuePool: pass pool=...")
    return pool


def _default_pool(stack: ExitStack, spark: Any) -> QueuePool:
    ambient = _ambient()
    if ambient is not None:
        return ambient
    if not is_local(spark):
        log.info("conveyor.spark.map: no pool given on a cluster: starting queue servers beside the driver for this call")
        return stack.enter_context(driver_pool(spark))
    log.info("conveyor.spark.map: no pool given and no conveyor.local(): starting local queue servers for this call")
    return stack.enter_context(QueuePool.local(n_servers=2))


def _output_schema(spark: Any, schema: str | StructType) -> StructType:
    from pyspark.sql.types import StructType

    st = schema if isinstance(schema, StructType) else spark.createDataFrame([], schema).schema
    clash = [f.name for f in st.fields if f.name in EXTRA_COLUMNS]
    if clash:
        raise ValueError(f"map: schema columns {clash} clash with the columns map adds ({', '.join(EXTRA_COLUMNS)})")
    return st


def _materialize(result: DataFrame, ephemeral: bool) -> DataFrame:
    """Compute the rows once and keep them in Spark, in one single-stage job.

    With servers that stop when `map` returns, the lineage is cut (a local checkpoint): the rows no
    longer need the servers. With servers that stay, the rows are persisted and the lineage (a read
    from the servers) kept, so that rows lost with an executor are read again; a write to Spark's
    "noop" sink computes (and so caches) them without a shuffle or a trip through Python.
    """
    from pyspark import StorageLevel

    if ephemeral:
        return result.localCheckpoint(eager=True)
    result = result.persist(StorageLevel.MEMORY_AND_DISK)
    result.write.format("noop").mode("overwrite").save()
    return result


# --- executor side --------------------------------------------------------------------------------
def _partitions(df: DataFrame) -> int:
    """The DataFrame's partitions (0 where it cannot be told without computing it: Spark Connect)."""
    try:
        return int(df.rdd.getNumPartitions())
    except Exception:
        return 0
