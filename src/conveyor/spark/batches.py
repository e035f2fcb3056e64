"""`conveyor.spark.map_batches`: a DataFrame through the queue in batches, fn called once per batch of rows.

For vectorised work (a model's `predict` over a few hundred rows at once, a batched API call),
where `map`'s call per row would cost more than the work. Each message carries up to
`rows_per_batch` consecutive rows as Arrow; balancing is at that grain, by the same queue job as
`map`'s (`conveyor.spark.job`: the put, the consumers, the read-back, the stats, the cleanup). fn
gets the batch as a pandas DataFrame, a pyarrow Table or a dict of numpy arrays, and returns as
many rows; the output has one row per input row with `_id`, `_error` and `_input`, as `map`'s.
A batch that raises runs again in parts so that only the rows at fault fail (`conveyor.spark.batch_form`).

fn may be a class: built once per process where it runs, with `fn_args`/`fn_kwargs`, then called
per batch (`conveyor.spark.instances`); `MapStats.instances` says how many were built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

from conveyor.client.pool import QueuePool
from conveyor.constants import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_UNREACHABLE_S,
    MAP_BATCHES_DEFAULT_ROWS,
    MAP_BATCHES_MAX_BYTES,
    MAP_DEFAULT_LEASE_S,
)
from conveyor.spark.batch_form import BATCH_FORMATS, BatchFormat, ReadBatches, SliceRows, batch_runner
from conveyor.spark.form import JobForm, JobTask
from conveyor.spark.instances import Instances, check_fn
from conveyor.spark.job import MapStats, module_of, queue_job
from conveyor.spark.mapping import row_job_settings, rows_out
from conveyor.spark.rows import output_schema, with_extra
from conveyor.spark.watch import START_TIMEOUT_S
from conveyor.tasks.options import TaskOptions
from conveyor.worker.options import ConsumerKeywords, ConsumerOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType
    from typing_extensions import Unpack  # typing.Unpack is 3.11+; only the type checker reads it


@overload
def map_batches(
    df: DataFrame,
    fn: Any,
    *,
    schema: str | StructType,
    rows_per_batch: int = ...,
    batch_format: BatchFormat = ...,
    fn_args: tuple[Any, ...] = ...,
    fn_kwargs: dict[str, Any] | None = ...,
    queue_pool: QueuePool | None = ...,
    n_consumers: int | None = ...,
    max_retries: int = ...,
    time_limit: float | None = ...,
    lease_s: float = ...,
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
def map_batches(
    df: DataFrame,
    fn: Any,
    *,
    schema: str | StructType,
    rows_per_batch: int = ...,
    batch_format: BatchFormat = ...,
    fn_args: tuple[Any, ...] = ...,
    fn_kwargs: dict[str, Any] | None = ...,
    queue_pool: QueuePool | None = ...,
    n_consumers: int | None = ...,
    max_retries: int = ...,
    time_limit: float | None = ...,
    lease_s: float = ...,
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
def map_batches(
    df: DataFrame,
    fn: Any,
    *,
    schema: str | StructType,
    rows_per_batch: int = MAP_BATCHES_DEFAULT_ROWS,
    batch_format: BatchFormat = "pandas",
    fn_args: tuple[Any, ...] = (),
    fn_kwargs: dict[str, Any] | None = None,
    queue_pool: QueuePool | None = None,
    n_consumers: int | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    time_limit: float | None = None,
    lease_s: float = MAP_DEFAULT_LEASE_S,
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
    """Apply `fn` to batches of `df`'s rows through the queue; returns one output row per input row.

    fn: a function of a batch, or a class whose instances are (built once per process where the
        batches run, with `fn_args` and `fn_kwargs`: `__init__` loads the model, `__call__` runs
        it; the instance is shared by the consumer's threads, so `__call__` must be thread-safe,
        or the class sets `per_thread = True` for one instance per thread, or pass
        `concurrency=1`; with `pool="process"`, one per task process). A consumer runs one batch
        at a time unless `concurrency` is given (batches that wait on a remote model want more,
        or an async fn). It returns a batch of as
        many rows, in order, with the `schema` columns: a pandas DataFrame, a pyarrow Table or
        RecordBatch, or a dict of column name -> array (whatever `batch_format`).
    schema: the output columns (DDL string or StructType), without `_id`, `_error`, `_input`.
    rows_per_batch: the most rows fn gets at once (one message each; a Spark Arrow batch of input
        is cut into runs of consecutive rows). Balancing is at this grain. (The consumers'
        `batch_size`, messages per fetch, is `options=ConsumerOptions(batch_size=...)`.)
    batch_format: what fn gets: "pandas" (a DataFrame), "pyarrow" (a Table) or "numpy" (a dict of
        column name -> ndarray).
    fn_args, fn_kwargs: the arguments of a class's constructor (refused for a function: bind them
        with functools.partial).
    max_retries: a batch that raises runs again in parts, so that only the rows at fault fail,
        each row running at most max_retries + 1 times per delivery (its runs in the batches it
        was part of counted: `conveyor.spark.batch_form`); a row with no run left is reported in
        `_error`, and its neighbours are computed (a row whose last run was in a batch with
        others runs once more, alone: with max_retries=0 too). A message that fails whole (over
        its time limit, its worker lost) is delivered again up to this many times, then each of
        its rows is reported.
    time_limit: seconds one batch's message may take, its splits included.
    The rest are `map`'s: `queue_pool`, `n_consumers`, `lease_s`, `unreachable_s`,
    `start_timeout_s`, `progress`, `job`, `restart`, `resources`, `stats` (`MapStats`, with `instances`: how many instances of
    fn's class were built), and the consumer options (`options=` or keywords; not `middleware`).
    """
    import pyarrow  # noqa: F401 - fail early, here, if it is missing

    instances = check_fn("map_batches", "fn", fn, fn_args, fn_kwargs, "a batch")
    if "batch_size" in keywords:  # a consumer option's name, and Ray Data's for the rows of a batch: said which
        raise TypeError(
            "map_batches: the rows fn gets at once are rows_per_batch=; batch_size= is the consumers' messages per "
            "fetch: give it as options=ConsumerOptions(batch_size=...)"
        )
    if type(rows_per_batch) is not int or rows_per_batch < 1:
        raise ValueError(f"map_batches: rows_per_batch must be an integer >= 1, got {rows_per_batch!r}")
    if batch_format not in BATCH_FORMATS:
        raise ValueError(f"map_batches: batch_format must be one of {', '.join(BATCH_FORMATS)}, got {batch_format!r}")
    settings = row_job_settings(
        "map_batches",
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
        default_concurrency=None if instances.awaits else 1,  # a batch computes on arrays: threads beside it contend
    )
    spark: SparkSession = df.sparkSession
    out_schema = output_schema(schema, "map_batches")
    with queue_job(spark, queue_pool, settings, task_modules=module_of(fn)) as queued:
        form = _batch_form(instances, out_schema, queued.queue, max_retries, time_limit, rows_per_batch, batch_format)
        outcome = queued.run(df, form)
    return rows_out("map_batches", outcome, stats)


def _batch_form(
    fn: Instances,
    schema: StructType,
    queue: str,
    max_retries: int,
    time_limit: float | None,
    rows: int,
    batch_format: BatchFormat,
) -> JobForm:
    """map_batches' form of the queue job: runs of rows to messages, each a `BatchRunner` call, read back as rows."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    nullable = pa.schema([f.with_nullable(True) for f in to_arrow_schema(schema)])  # a failed row's columns are null
    return JobForm(
        task=JobTask(
            batch_runner(fn, batch_format, nullable, max_retries),
            TaskOptions(queue=queue, time_limit=time_limit, max_retries=max_retries),
        ),
        parcels=SliceRows(rows, MAP_BATCHES_MAX_BYTES),
        read=ReadBatches(schema),
        output=with_extra(schema),
        message_rows=rows,
    )
