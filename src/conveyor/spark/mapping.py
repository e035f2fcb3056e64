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

The queue job (the queue, the put, the consumers, the read-back, the stats, the cleanup) is
`conveyor.spark.job`'s; map supplies its form (`_row_form`): rows dealt to messages, each a
`RowRunner(func)` call, and the outcomes read back as rows (`conveyor.spark.rows`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

from conveyor.client.pool import QueuePool
from conveyor.constants import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_UNREACHABLE_S,
    MAP_DEFAULT_LEASE_S,
    MAP_DEFAULT_ROWS_PER_MESSAGE,
)
from conveyor.spark.form import JobForm, JobTask
from conveyor.spark.instances import Instances, check_fn
from conveyor.spark.job import JobOutcome, JobSettings, MapStats, check_seconds, module_of, queue_job
from conveyor.spark.resources import check_resources
from conveyor.spark.rows import MAX_ROWS_PER_MESSAGE, DealRows, ReadRows, output_schema, row_runner, with_extra
from conveyor.spark.watch import START_TIMEOUT_S
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.policy import attempts_for, check_max_retries
from conveyor.worker.options import ConsumerKeywords, ConsumerOptions, options_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType
    from typing_extensions import Unpack  # typing.Unpack is 3.11+; only the type checker reads it

log = logging.getLogger("conveyor.spark")

ASYNC_BACKSTOP_S = 5.0  # an async map's message may run this much past its rows' time limits (see _row_form)


@overload
def map(
    df: DataFrame,
    func: Callable[[dict[str, Any]], Any],
    *,
    schema: str | StructType,
    fn_args: tuple[Any, ...] = ...,
    fn_kwargs: dict[str, Any] | None = ...,
    queue_pool: QueuePool | None = ...,
    n_consumers: int | None = ...,
    max_retries: int = ...,
    time_limit: float | None = ...,
    lease_s: float = ...,
    rows_per_message: int | None = ...,
    unreachable_s: float = ...,
    start_timeout_s: float = ...,
    progress: bool | None = ...,
    job: str | None = ...,
    restart: bool = ...,
    resources: Mapping[str, float] | None = ...,
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
    fn_args: tuple[Any, ...] = ...,
    fn_kwargs: dict[str, Any] | None = ...,
    queue_pool: QueuePool | None = ...,
    n_consumers: int | None = ...,
    max_retries: int = ...,
    time_limit: float | None = ...,
    lease_s: float = ...,
    rows_per_message: int | None = ...,
    unreachable_s: float = ...,
    start_timeout_s: float = ...,
    progress: bool | None = ...,
    job: str | None = ...,
    restart: bool = ...,
    resources: Mapping[str, float] | None = ...,
    stats: Literal[True],
    options: ConsumerOptions | None = ...,
    **keywords: Unpack[ConsumerKeywords],
) -> tuple[DataFrame, MapStats]: ...
def map(
    df: DataFrame,
    func: Callable[[dict[str, Any]], Any],
    *,
    schema: str | StructType,
    fn_args: tuple[Any, ...] = (),
    fn_kwargs: dict[str, Any] | None = None,
    queue_pool: QueuePool | None = None,
    n_consumers: int | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    time_limit: float | None = None,
    lease_s: float = MAP_DEFAULT_LEASE_S,
    rows_per_message: int | None = None,
    unreachable_s: float = DEFAULT_UNREACHABLE_S,
    start_timeout_s: float = START_TIMEOUT_S,
    progress: bool | None = None,
    job: str | None = None,
    restart: bool = False,
    resources: Mapping[str, float] | None = None,
    stats: bool = False,
    options: ConsumerOptions | None = None,
    **keywords: Unpack[ConsumerKeywords],
) -> DataFrame | tuple[DataFrame, MapStats]:
    """Apply `func` to every row of `df` through the queue; returns the results as a DataFrame.

    func: called with each row as a dict; returns the output row as a dict (by column name), a
        tuple (in `schema` order) or, for a one-column schema, the value.
        Or a class whose instances are (built once per process where the rows run, with `fn_args`
        and `fn_kwargs`: `__init__` loads a model, `__call__(row)` uses it; see `map_batches`).
    fn_args, fn_kwargs: the arguments of a class's constructor (refused for a function).
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
        queue the same, so a few rows per message cut its overhead per row. Left out, a consumer
        whose rows take 20 ms or more on average (`SLOW_ROW_S`) splits the messages it gets from
        then on into one per row, where the queue's cost is nothing beside them (an async func's
        rows run together, so they are never split). Use 1 for rows that take seconds, more
        (up to 1,000) for tiny ones. A message delivered again (its worker
        died or stopped, or it ran over its time) is split into one message per row: the row at
        fault fails alone (with max_retries=0 there is no second delivery: all its rows fail).
    unreachable_s: a queue server out of reach for longer fails the map (`ServerUnreachableError`,
        naming the server and what it held); one back within it, and the map goes on.
    start_timeout_s: no Spark task of the map started within it (the cluster grants no slot) fails
        the map (`NoSlotsError`).
    progress: a progress bar while the rows are processed (default: when stderr is a terminal).
    job: a name that makes the map resumable: run again after it failed, was interrupted or its
        driver died, the same call reuses every result its earlier runs stored and runs only the
        rest (its results wait on the servers: long-lived ones, `conveyor serve --data-dir`, or
        `conveyor.local(data_dir=...)`, whose servers start again on the same data). Input other than the earlier runs' is refused
        (`JobInputChangedError`). A run that ends well drops what the job stored (its output
        checkpointed in Spark). See docs/spark.md, "Resumable jobs".
    restart: with `job`, drop what the job's earlier runs stored first, and run it anew.
    resources: Spark resources each consumer takes, e.g. {"gpu": 1}: the consumers run only on
        executors that hold them, each with its own addresses (`conveyor.spark.task_resources()`
        in func; `CUDA_VISIBLE_DEVICES` for a GPU). A Spark cluster with dynamic allocation off,
        whose executors hold them (`spark.executor.resource.<name>.amount`). See docs/spark.md,
        "GPUs and other resources".
    stats: also return what the call did (`MapStats`: rows, failures, times, the results queue):
        `out, st = map(..., stats=True)`.
    """
    import pyarrow  # noqa: F401 - fail early, here, if it is missing

    instances = check_fn("map", "func", func, fn_args, fn_kwargs, "each row as a dict")
    split_slow = rows_per_message is None  # (with a time_limit and no async func, rows go one to a message anyway)
    if rows_per_message is None:
        rows_per_message = MAP_DEFAULT_ROWS_PER_MESSAGE if time_limit is None or instances.awaits else 1
    if type(rows_per_message) is not int or not 1 <= rows_per_message <= MAX_ROWS_PER_MESSAGE:
        raise ValueError(f"map: rows_per_message must be an integer in 1..{MAX_ROWS_PER_MESSAGE}, got {rows_per_message!r}")
    settings = row_job_settings(
        "map",
        instances,
        options,
        keywords,
        max_retries=max_retries,
        time_limit=time_limit,
        n_consumers=n_consumers,
        lease_s=lease_s,
        unreachable_s=unreachable_s,
        start_timeout_s=start_timeout_s,
        progress=progress,
        job=job,
        restart=restart,
        resources=resources,
    )
    spark: SparkSession = df.sparkSession
    out_schema = output_schema(schema, "map")
    with queue_job(spark, queue_pool, settings, task_modules=module_of(func)) as queued:
        form = _row_form(instances, out_schema, queued.queue, max_retries, time_limit, rows_per_message, split_slow)
        outcome = queued.run(df, form)
    return rows_out("map", outcome, stats)


def row_job_settings(
    entry: str,
    fn: Instances,
    options: ConsumerOptions | None,
    keywords: ConsumerKeywords,
    *,
    max_retries: int,
    time_limit: float | None,
    n_consumers: int | None,
    lease_s: float,
    unreachable_s: float,
    start_timeout_s: float,
    progress: bool | None,
    job: str | None = None,
    restart: bool = False,
    resources: Mapping[str, float] | None = None,
    default_concurrency: int | None = None,
) -> JobSettings:
    """The job settings of an entry point giving one output row per input row (map, map_batches), checked.

    Both refuse `middleware`: it would take the place of the Retries and TimeLimits that serve
    their own `max_retries=` and `time_limit=`. An async `fn` runs on `pool="async"` consumers
    unless `options=` or `pool=` say otherwise (where its calls still run, each message on a loop
    of its own: said in the log).
    """
    check_max_retries(max_retries, f"{entry}: ")
    check_seconds(entry, "time_limit", time_limit)
    if fn.awaits and options is None and "pool" not in keywords:
        keywords = {**keywords, "pool": "async"}
    consumer_options = options_of(entry, options, keywords)
    if fn.awaits and consumer_options.pool != "async":
        log.warning(
            "%s: the function is async, and the consumers' pool is %r: each message's calls run on an event loop of "
            "its own, %s messages at a time; pool='async' runs them all on one loop, many at once",
            entry,
            consumer_options.pool,
            consumer_options.concurrency or "the default number of",
        )
    if consumer_options.middleware is not None:
        raise ValueError(
            f"{entry}: middleware is not for {entry}: its rows' retries and time limit are {entry}'s own "
            "max_retries= and time_limit="
        )
    return JobSettings(
        entry,
        consumer_options,
        n_consumers=n_consumers,
        lease_s=lease_s,
        unreachable_s=unreachable_s,
        start_timeout_s=start_timeout_s,
        progress=progress,
        job=job,
        restart=restart,
        resources=check_resources(entry, resources),
        default_concurrency=default_concurrency,
    )


def rows_out(entry: str, outcome: JobOutcome, stats: bool) -> DataFrame | tuple[DataFrame, MapStats]:
    """What map and map_batches return: the output (with its stats if asked), failed rows warned of."""
    if outcome.stats.failed:
        log.warning("%s: %d of %d rows failed; see the _error column", entry, outcome.stats.failed, outcome.stats.rows)
    return (outcome.frame, outcome.stats) if stats else outcome.frame


def _row_form(
    func: Instances,
    schema: StructType,
    queue: str,
    max_retries: int,
    time_limit: float | None,
    rows_per_message: int,
    split_slow: bool,
) -> JobForm:
    """Map's form of the queue job: rows dealt to messages, each a `RowRunner(func)` call, read back as rows."""
    from pyspark.sql.pandas.types import to_arrow_schema

    # a message is delivered again only when its worker died or it ran over its time limit
    message_limit: float | None = None
    row_limit: float | None = None  # of a row split off (RowRunner)
    if time_limit is not None and func.awaits:
        # the runner holds each call to time_limit (the rows run together); the messages' limit is a
        # backstop, for a call that blocks the loop
        message_limit = row_limit = time_limit * attempts_for(max_retries) + ASYNC_BACKSTOP_S
    elif time_limit is not None:  # the rows run in turn
        message_limit, row_limit = time_limit * rows_per_message, time_limit
    row_options = TaskOptions(queue=queue, time_limit=row_limit, max_retries=max_retries)
    return JobForm(
        task=JobTask(
            row_runner(func, max_retries, to_arrow_schema(schema), row_options, time_limit, split_slow),
            TaskOptions(queue=queue, time_limit=message_limit, max_retries=max_retries),
        ),
        parcels=DealRows(rows_per_message),
        read=ReadRows(schema),
        output=with_extra(schema),
        message_rows=rows_per_message,
    )
