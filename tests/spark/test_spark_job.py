"""The queue job under the Spark entry points (`conveyor.spark.job`), through a form of its own.

The form here is not map's: one message per Arrow batch, a task that squares a list of ids, and a
read-back of its own, as a second entry point would supply. Everything else (the queue, the put,
the consumers, the read-back job, the records, the stats, the cleanup) is the job's. Real local
Spark and real queue servers.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Generator, Iterator

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from conveyor.client.pool import QueuePool
from conveyor.spark.form import JobForm, JobTask, MakeParcels, Parcel, ReadShard, ServerOutcomes
from conveyor.spark.job import JobSettings, queue_job
from conveyor.spark.records import ReadCounts, RowsPut, TaskRecords, drop_where_answering
from conveyor.tasks.envelope import decode_result
from conveyor.tasks.options import TaskOptions
from conveyor.worker.options import ConsumerOptions

OUTPUT = StructType([StructField("id", LongType(), False), StructField("square", LongType(), False)])
ARROW_OUTPUT = pa.schema([("id", pa.int64(), False), ("square", pa.int64(), False)])
JOB_QUEUE_PREFIXES = ("squares-", "conveyor-fed-", "conveyor-read-")


@pytest.fixture(scope="module")
def pool() -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=2) as p:
        yield p


def squares(ids: list[int]) -> list[list[int]]:
    """The task of one message: each id with its square."""
    return [[i, i * i] for i in ids]


def one_message_per_batch(batch: pa.RecordBatch) -> list[Parcel]:
    ids = batch.column("id").to_pylist()
    return [Parcel((ids,), len(ids))] if ids else []


def square_and_negative(ids: list[int]) -> list[list[list[int]]]:
    """A task whose every input row gives two output rows: the id with its square, and with minus it."""
    return [[[i, i * i], [i, -i * i]] for i in ids]


def read_per_input(server: ServerOutcomes) -> Generator[pa.RecordBatch, None, ReadCounts]:
    """The read-back of a task giving a list of output rows per input row: it counts the inputs and the rows apart."""
    per_input = [rows for _, r in server.results() for rows in decode_result(r)]
    rows = [{"id": i, "square": sq} for out in per_input for i, sq in out]
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=ARROW_OUTPUT)
    return ReadCounts(len(per_input), len(rows), 0)


def failing_parcels(batch: pa.RecordBatch) -> list[Parcel]:
    raise ValueError("no parcel for this batch")


def read_squares(server: ServerOutcomes) -> Generator[pa.RecordBatch, None, ReadCounts]:
    rows = [{"id": i, "square": sq} for _, r in server.results() for i, sq in decode_result(r)]
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=ARROW_OUTPUT)
    return ReadCounts(len(rows), len(rows), 0)


def read_losing_a_message(server: ServerOutcomes) -> Generator[pa.RecordBatch, None, ReadCounts]:
    """A read-back that misses the first message each server holds, as a bug would."""
    rows = [{"id": i, "square": sq} for _, r in list(server.results())[1:] for i, sq in decode_result(r)]
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=ARROW_OUTPUT)
    return ReadCounts(len(rows), len(rows), 0)


def failing_read(server: ServerOutcomes) -> Generator[pa.RecordBatch, None, ReadCounts]:
    raise ValueError(f"server {server.shard} cannot be read")
    yield  # a generator, as a form's read is


def squares_form(queue: str, parcels: MakeParcels = one_message_per_batch, read: ReadShard = read_squares) -> JobForm:
    return JobForm(
        task=JobTask(squares, TaskOptions(queue=queue, max_retries=0)),
        parcels=parcels,
        read=read,
        output=OUTPUT,
        message_rows=1000,
    )


def job_queues(pool: QueuePool) -> set[str]:
    return {name for name in pool.stats() if name.startswith(JOB_QUEUE_PREFIXES)}


def settings() -> JobSettings:
    return JobSettings("squares", ConsumerOptions(), n_consumers=2, progress=False)


@pytest.mark.parametrize("partitions", [1, 4], ids=["put-first", "fed"])
def test_a_job_puts_consumes_reads_back_and_leaves_only_its_results_queue(
    spark: SparkSession, pool: QueuePool, partitions: int
) -> None:
    """One partition, two consumers: the rows are put by a job of their own; four: each consumer task puts its share."""
    df = spark.range(200, numPartitions=partitions)
    with queue_job(spark, pool, settings(), task_modules=[]) as job:
        outcome = job.run(df, squares_form(job.queue))
    rows = outcome.frame.collect()
    assert sorted((r["id"], r["square"]) for r in rows) == [(i, i * i) for i in range(200)]
    st = outcome.stats
    assert (st.rows, st.failed, st.queue) == (200, 0, job.queue) and job.queue.startswith("squares-")
    assert len(st.consumers) == 2 and sum(c["processed"] for c in st.consumers) == pool.stats()[job.queue].acked > 0
    assert sorted(c["rows"] for c in st.consumers) == ([0, 0] if partitions == 1 else [100, 100])
    assert job_queues(pool) == {job.queue}  # the records queues (rows put, rows read) are gone
    # it lives as long as the call: its writes are left to the OS (the servers' own policy is "batch")
    assert {q.fsync for c in pool.queues.clients for q in c.queues() if q.name == job.queue} == {"never"}
    outcome.frame.unpersist()
    assert pool.drop(job.queue) and job_queues(pool) == set()


def test_a_job_whose_output_rows_differ_from_its_input_rows_reports_its_output(spark: SparkSession, pool: QueuePool) -> None:
    """Two output rows per input row: the job checks that every input came back once, and reports the rows out."""
    df = spark.range(100, numPartitions=2)
    with queue_job(spark, pool, settings(), task_modules=[]) as job:
        form = JobForm(
            task=JobTask(square_and_negative, TaskOptions(queue=job.queue, max_retries=0)),
            parcels=one_message_per_batch,
            read=read_per_input,
            output=OUTPUT,
            message_rows=1000,
        )
        outcome = job.run(df, form)
    rows = sorted((r["id"], r["square"]) for r in outcome.frame.collect())
    assert rows == sorted([(i, i * i) for i in range(100)] + [(i, -i * i) for i in range(100)])
    assert (outcome.stats.rows, outcome.stats.failed) == (200, 0)
    outcome.frame.unpersist()
    assert pool.drop(job.queue) and job_queues(pool) == set()


FAILING_FORMS: dict[str, tuple[MakeParcels, ReadShard, str]] = {
    "put": (failing_parcels, read_squares, "no parcel for this batch"),
    "read": (one_message_per_batch, failing_read, "cannot be read"),
    "lost": (one_message_per_batch, read_losing_a_message, r"20 rows went in but the read-back accounts for \d+ of them"),
}


@pytest.mark.parametrize("failing", list(FAILING_FORMS))
def test_a_failed_job_leaves_nothing_behind(spark: SparkSession, pool: QueuePool, failing: str) -> None:
    """A job whose put or read-back fails, or whose read-back misses input rows, drops its queue and its records, and says so."""
    df = spark.range(20, numPartitions=2)
    parcels, read, error = FAILING_FORMS[failing]
    with queue_job(spark, pool, settings(), task_modules=[]) as job, pytest.raises(Exception, match=error) as e:
        job.run(df, squares_form(job.queue, parcels=parcels, read=read))
    assert job_queues(pool) == set()
    if sys.version_info >= (3, 11):  # notes on exceptions are 3.11+; the log says it on 3.10
        assert f"conveyor.spark.squares: dropped its queue {job.queue}: nothing is left behind" in e.value.__notes__


def test_a_job_refuses_a_task_bound_for_another_queue(spark: SparkSession, pool: QueuePool) -> None:
    with (
        queue_job(spark, pool, settings(), task_modules=[]) as job,
        pytest.raises(ValueError, match=f"not the job's own '{job.queue}'"),
    ):
        job.run(spark.range(3), squares_form("elsewhere"))
    assert job_queues(pool) == set()


def test_job_settings_are_checked_once() -> None:
    options = ConsumerOptions()
    with pytest.raises(ValueError, match=r"squares: lease_s must be a number of seconds > 0"):
        JobSettings("squares", options, lease_s=0)
    with pytest.raises(ValueError, match=r"squares: unreachable_s must be a number of seconds > 0"):
        JobSettings("squares", options, unreachable_s=-1)
    with pytest.raises(ValueError, match=r"n_consumers must be an integer >= 1"):
        JobSettings("squares", options, n_consumers=0)
    with pytest.raises(ValueError, match=r"squares: early_ack is not for squares"):
        JobSettings("squares", ConsumerOptions(early_ack=True))


def test_task_records_count_each_task_once_whatever_its_attempts(pool: QueuePool) -> None:
    """A task run again (a retried Spark task) records once: its record is keyed by the task."""
    records = TaskRecords("conveyor-fed-records-test", RowsPut)
    records.declare(pool.queues)
    try:
        # it lives as long as its job: its writes are left to the OS, as the job's queue's are
        assert {q.fsync for c in pool.queues.clients for q in c.queues() if q.name == records.queue} == {"never"}
        for task, rows in [(0, 5), (1, 7), (0, 5), (2, 0), (1, 7)]:
            records.record(pool.queues, task, RowsPut(rows))
        assert records.count(pool.queues) == 3
        assert records.read(pool.queues) == {0: RowsPut(5), 1: RowsPut(7), 2: RowsPut(0)}
    finally:
        records.drop(pool.queues)
    assert records.queue not in pool.stats()


@pytest.mark.timeout(60)
def test_a_drop_where_servers_answer_names_a_lost_server_and_drops_on_the_others() -> None:
    """A server killed mid-job: the drop ends (no wait on it), drops the queue on the live one, and names the lost one."""
    with QueuePool.local(n_servers=2) as pool:
        pool.queues.declare("left-behind")
        lost = pool.addresses[1]
        pool.servers.processes[1].kill()  # SIGKILL: it never answers again
        pool.servers.processes[1].wait(30)
        t0 = time.monotonic()
        assert drop_where_answering(pool.queues, "left-behind") == [lost]
        assert time.monotonic() - t0 < 30, "the drop waited on the lost server"
        assert "left-behind" not in {q.name for q in pool.queues.clients[0].queues()}
        # known lost now: the next drop does not ask it at all
        assert drop_where_answering(pool.queues, "left-behind") == [lost]
