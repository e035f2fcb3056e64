"""A resumable `conveyor.spark.map` job, run by tests/spark/test_spark_resume.py in a driver of its own.

Usage: python tests/support/resumable_job.py ADDRESSES LOG

The job `JOB` over `ROWS` rows (`job_input`) on the servers at ADDRESSES (comma-separated), each row
appending its id to LOG as it runs (`RecordRow`), so that the test sees how far it got, kills this
driver with its Spark (SIGKILL to its process group), and counts the rows run twice.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from conveyor.client.pool import QueuePool

JOB = "resume-test"
ROWS = 1200
PARTITIONS = 4
ROW_S = 0.02  # each row's work
ROWS_PER_MESSAGE = 4
CONCURRENCY = 2  # threads per consumer: with 2 consumers, at most 16 rows run at once


def job_input(spark: SparkSession, changed: bool = False) -> DataFrame:
    """The job's input: ids and a value; `changed` gives row 7 another value."""
    value = "CASE WHEN id = 7 THEN -1 ELSE id * 2 END" if changed else "id * 2"
    return spark.range(ROWS, numPartitions=PARTITIONS).selectExpr("id", f"{value} AS x")


class RecordRow:
    """A row's work: its id appended to the log `log` as it starts, then ROW_S of sleep."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{row['id']}\n".encode())
        finally:
            os.close(fd)
        time.sleep(ROW_S)
        return {"id": row["id"], "y": row["x"] + 1}


def run_job(df: DataFrame, pool: QueuePool, log: str, **kwargs: Any) -> DataFrame:
    """The job's map call, as every run of it makes it."""
    import conveyor.spark as cs

    return cs.map(
        df,
        RecordRow,
        fn_args=(log,),
        schema="id long, y long",
        queue_pool=pool,
        job=JOB,
        rows_per_message=ROWS_PER_MESSAGE,
        n_consumers=2,
        concurrency=CONCURRENCY,
        progress=False,
        **kwargs,
    )


def main(addresses: str, log: str) -> None:
    from conveyor.client.pool import QueuePool
    from conveyor.spark.session import get_or_create_session

    spark = get_or_create_session("local[2]", app_name="resumable-job")
    with QueuePool.connect(addresses) as pool:
        run_job(job_input(spark), pool, log).count()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
