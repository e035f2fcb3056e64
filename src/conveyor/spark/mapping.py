"""`conveyor.spark.map`: a DataFrame mapped through the queue, row by row, back into a DataFrame.

1. Enqueue: each executor puts its own partitions' rows on the queue servers (a Spark job over the
   input; nothing is collected on the driver). A few rows in order make one message, a
   `RowRunner(func)` call as an ad-hoc task, with an idempotency key `job:partition:first row`, so
   a Spark task retried after a failure does not enqueue its rows twice.
2. Consume: a `SparkConsumerPool` runs consumers as long-lived Spark tasks until the queue is
   drained: work is balanced message by message, failing rows retried, and the messages held by a
   killed consumer come back when their leases end.
3. Read back: once the queue is drained, each consumer task reads the results (and dead letters)
   of its share of the queue servers into the output DataFrame, counting the rows and failures it
   yields; the output is materialized before `map` returns. When rows are put by the consumer
   tasks themselves (the usual case), steps 1 to 3 are one Spark job; else 2 and 3 are.

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
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

from conveyor.client.pool import QueuePool
from conveyor.client.progress import JoinProgress
from conveyor.constants import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_RETRIES,
    MAP_DEFAULT_LEASE_S,
    MAP_DEFAULT_ROWS_PER_MESSAGE,
)
from conveyor.errors import ConveyorError
from conveyor.spark.consumers import SparkConsumerPool, check_consumer_options, default_parallelism
from conveyor.spark.rows import EXTRA_COLUMNS, MAX_ROWS_PER_MESSAGE, RowRunner, put_partitions, putter, read_results, with_extra
from conveyor.spark.session import check_workers_python
from conveyor.tasks.envelope import adhoc_task_name, function_ref
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.policy import attempts_for, check_max_retries
from conveyor.tasks.publish import get_default_pool

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


log = logging.getLogger("conveyor.spark")


@dataclass(frozen=True)
class MapStats:
    """What a `map` did (`map(..., stats=True)`), for reports: rows in and out, failures, and the consumers' times."""

    rows: int
    failed: int
    enqueue_s: float
    consume_s: float
    read_s: float
    first_start: float  # the earliest consumer start (wall clock)
    consumers: list[dict[str, Any]]
    queue: str  # holds the results until dropped (`QueuePool.drop`, `conveyor drop`)


@overload
def map(df: DataFrame, func: Callable[[dict[str, Any]], Any], *, schema: str | StructType, pool: QueuePool | None = ...,
        n_consumers: int | None = ..., batch_size: int | None = ..., max_concurrency: int = ...,
        concurrency: Literal["thread", "process"] = ..., max_retries: int = ..., time_limit: float | None = ...,
        lease_s: float = ..., rows_per_message: int | None = ..., pin_core: bool = ..., progress: bool | None = ...,
        stats: Literal[False] = ...) -> DataFrame: ...  # fmt: skip
@overload
def map(df: DataFrame, func: Callable[[dict[str, Any]], Any], *, schema: str | StructType, pool: QueuePool | None = ...,
        n_consumers: int | None = ..., batch_size: int | None = ..., max_concurrency: int = ...,
        concurrency: Literal["thread", "process"] = ..., max_retries: int = ..., time_limit: float | None = ...,
        lease_s: float = ..., rows_per_message: int | None = ..., pin_core: bool = ..., progress: bool | None = ...,
        stats: Literal[True]) -> tuple[DataFrame, MapStats]: ...  # fmt: skip
def map(df: DataFrame, func: Callable[[dict[str, Any]], Any], *, schema: str | StructType,
        pool: QueuePool | None = None, n_consumers: int | None = None, batch_size: int | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY, concurrency: Literal["thread", "process"] = "thread",
        max_retries: int = DEFAULT_MAX_RETRIES, time_limit: float | None = None, lease_s: float = MAP_DEFAULT_LEASE_S,
        rows_per_message: int | None = None,
        pin_core: bool = False, progress: bool | None = None,
        stats: bool = False) -> DataFrame | tuple[DataFrame, MapStats]:  # fmt: skip
    """Apply `func` to every row of `df` through the queue; returns the results as a DataFrame.

    func: called with each row as a dict; returns the output row as a dict (by column name), a
        tuple (in `schema` order) or, for a one-column schema, the value.
    schema: the output columns (DDL string or StructType), without `_id`, `_error`, `_input`.
    pool: the queue servers; None: the default pool (`conveyor.local()`'s, or `set_default_pool`'s,
        which must be a QueuePool), or else local servers started for this call (on the driver's
        host: for local Spark only) and stopped after it.
    n_consumers, batch_size, max_concurrency, concurrency, pin_core: the consumers (see
        `SparkConsumerPool` and `Consumer`).
    max_retries: a row that raises is run again, up to this many times, then reported.
    time_limit: seconds a row may take; a row over it fails (and is retried). The limit holds a
        message, so with it rows travel one to a message unless `rows_per_message` is given: then
        a message of k rows gets k * time_limit, and running over fails all its rows.
    lease_s: the queue's lease (extended while a message runs): rows held by a consumer that died
        come back after at most this long.
    rows_per_message: at most this many rows travel and run together (default 8; 1 with a
        `time_limit`). They run on one worker; an Arrow batch is dealt out over its messages like
        cards, so costly neighbours spread out. Balancing is at this grain; each message costs the
        queue the same, so a few rows per message cut its overhead per row. Use 1 for rows that
        take seconds, more (up to 1,000) for tiny ones.
    progress: a progress bar while the rows are processed (default: when stderr is a terminal).
    stats: also return what the call did (`MapStats`: rows, failures, times, the results queue):
        `out, st = map(..., stats=True)`.
    """
    import pyarrow as pa  # noqa: F401 - fail early, here, if it is missing
    from pyspark.sql import SparkSession
    from pyspark.sql.pandas.types import to_arrow_schema

    if not callable(func):
        raise TypeError(f"map: func must be callable (it gets each row as a dict), got {type(func).__name__}")
    if rows_per_message is None:
        rows_per_message = MAP_DEFAULT_ROWS_PER_MESSAGE if time_limit is None else 1
    if type(rows_per_message) is not int or not 1 <= rows_per_message <= MAX_ROWS_PER_MESSAGE:
        raise ValueError(f"map: rows_per_message must be an integer in 1..{MAX_ROWS_PER_MESSAGE}, got {rows_per_message!r}")
    check_max_retries(max_retries, "map: ")
    for name, value in (("time_limit", time_limit), ("lease_s", lease_s)):
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"map: {name} must be a number of seconds > 0, got {value!r}")
    check_consumer_options(n_consumers, max_concurrency, batch_size, concurrency, pin_core)
    spark: SparkSession = df.sparkSession
    out_schema = _output_schema(spark, schema)
    check_workers_python(spark)
    with ExitStack() as stack:
        ephemeral = pool is None and _ambient() is None  # servers that stop when map returns
        if pool is None:
            pool = _default_pool(stack, spark)
        job = uuid.uuid4().hex[:12]
        queue = f"map-{job}"
        pool.declare(queue, lease_s=lease_s, max_attempts=attempts_for(max_retries))
        # a message is delivered again only when its worker died or it ran over its time limit
        opts = TaskOptions(queue=queue, time_limit=None if time_limit is None else time_limit * rows_per_message,
                           max_retries=max_retries)  # fmt: skip
        ref = function_ref(RowRunner(func, max_retries, to_arrow_schema(out_schema)))
        pool.put_blob(ref.data)

        t0 = time.time()
        put_rows = putter(pool, queue, job, adhoc_task_name(ref.digest), opts, rows_per_message)
        slots = default_parallelism(spark)
        n = slots if n_consumers is None else n_consumers
        if n > slots:
            log.warning("map: %d consumers but %d Spark task slots: the consumers beyond them start only as others end",
                        n, slots)  # fmt: skip
        options: dict[str, Any] = {"queues": [queue], "batch_size": batch_size, "max_concurrency": max_concurrency,
                                   "concurrency": concurrency, "pin_core": pin_core}  # fmt: skip
        # once drained, each consumer task reads back the results of its share of the servers
        shards = len(pool)
        then = (with_extra(out_schema), lambda task: read_results(pool, queue, out_schema, range(task, shards, n)))
        # in one job, a consumer waits for every task to have put its rows: all n must run at once
        rows, t1 = 0, t0  # rows put before consuming, and when that ended (in one job: none, at once)
        if n <= _partitions(df) and n <= slots:  # each of n tasks puts its share of the rows, then consumes
            consumers = SparkConsumerPool(spark, pool, n, feed=(df, put_rows), then=then, **options,
                                          description=f"conveyor.spark.map through {queue}")  # fmt: skip
        else:  # fewer partitions than consumers: put the rows first (a job of its own), then consume
            counts = df.mapInArrow(put_partitions(pool, put_rows), "partition long, rows long")
            rows = sum(r["rows"] for r in counts.collect())
            t1 = time.time()
            consumers = SparkConsumerPool(spark, pool, n, then=then, **options,
                                          description=f"conveyor.spark.map: {rows:,} rows through {queue}")  # fmt: skip
        with _Progress(pool, queue, progress), consumers.job_group():
            result = _materialize(consumers.dataframe(), ephemeral)
        done = consumers.consumer_stats()
        rows += sum(s["rows"] for s in done)  # what each consumer task put itself
        got, failed = sum(s["out_rows"] for s in done), sum(s["out_failed"] for s in done)
        t2 = min(max((s["finished"] for s in done), default=t1), time.time())
        t3 = time.time()
        if got != rows:
            raise ConveyorError(f"map: {rows:,} rows went in but {got:,} came out (queue {queue}); please report this")
        first = min((s["started"] for s in done), default=t1)
        if failed:
            log.warning("map: %d of %d rows failed; see the _error column", failed, rows)
        return (result, MapStats(rows, failed, t1 - t0, t2 - t1, t3 - t2, first, done, queue)) if stats else result


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
    master = spark.conf.get("spark.master", "")
    if not master.startswith("local"):
        raise ConveyorError(f"map: no pool given, and Spark runs on {master!r}: servers started here on 127.0.0.1 would be "
                            "out of the executors' reach. Start queue servers they can reach (conveyor serve --host ... "
                            "--token ...) and pass pool=QueuePool.connect([...], token=...)")  # fmt: skip
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
    """Compute the rows once and keep them in Spark.

    With servers that stop when `map` returns, the lineage is cut (a local checkpoint): the rows no
    longer need the servers. With servers that stay, the rows are persisted and the lineage kept,
    so that rows lost with an executor are read again from the servers.
    """
    from pyspark import StorageLevel

    if ephemeral:
        return result.localCheckpoint(eager=True)
    result = result.persist(StorageLevel.MEMORY_AND_DISK)
    # the cheapest action that computes (and so caches) every row: no aggregate, nothing returned
    result.write.format("noop").mode("overwrite").save()
    return result


# --- executor side --------------------------------------------------------------------------------
def _partitions(df: DataFrame) -> int:
    """The DataFrame's partitions (0 where it cannot be told without computing it: Spark Connect)."""
    try:
        return int(df.rdd.getNumPartitions())
    except Exception:
        return 0


class _Progress:
    """A progress bar over the map's queue while its consumers run (a driver thread polls the stats)."""

    def __init__(self, pool: QueuePool, queue: str, enabled: bool | None) -> None:
        self.pool, self.queue = pool, queue
        self.bar = JoinProgress(enabled=enabled, description="rows")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="conveyor-map-progress", daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(ConveyorError):  # a glitch in the display must not fail the job
                self.bar.update(self.pool.stats(self.queue))

    def __enter__(self) -> _Progress:
        self.bar.__enter__()
        if self.bar.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.bar.__exit__(None, None, None)
