"""Spark's byte bound on Arrow batches, lifted for jobs whose rows cannot reach it (`conveyor.spark.arrow_batches`).

Real local Spark: the session's settings as Spark holds them, and a real map_batches job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

import conveyor.spark as cs
from conveyor.client.pool import QueuePool
from conveyor.spark.arrow_batches import MAX_BYTES_KEY, MAX_RECORDS_KEY, UNBOUNDED, ByteBoundLift

FIXED = "a long, b double, c struct<d: int, e: date>, f boolean, g decimal(20, 2), h timestamp"


@pytest.fixture
def own_bound(spark: SparkSession) -> Iterator[None]:
    """The test's session settings of the bounds put back after it, whatever it leaves."""
    yield
    spark.conf.unset(MAX_BYTES_KEY)
    spark.conf.unset(MAX_RECORDS_KEY)


def schema(ddl: str) -> StructType:
    return StructType.fromDDL(ddl)


def test_the_byte_bound_is_lifted_only_for_rows_that_cannot_reach_it(spark: SparkSession, own_bound: None) -> None:
    with ByteBoundLift(spark, schema(FIXED)):
        assert spark.conf.get(MAX_BYTES_KEY) == UNBOUNDED
    assert spark.conf.get(MAX_BYTES_KEY, None) is None  # unset again, as the user had it

    for ddl in ("a long, s string", "a long, b binary", "a array<double>", "m map<string, int>", "t struct<s: string>"):
        with ByteBoundLift(spark, schema(ddl)):
            assert spark.conf.get(MAX_BYTES_KEY, None) is None, ddl
    with ByteBoundLift(spark, None):
        assert spark.conf.get(MAX_BYTES_KEY, None) is None

    spark.conf.set(MAX_BYTES_KEY, "4k")  # 10,000 rows of FIXED would reach it: the bound stays
    with ByteBoundLift(spark, schema(FIXED)):
        assert spark.conf.get(MAX_BYTES_KEY) == "4k"
    spark.conf.set(MAX_BYTES_KEY, "64m")
    spark.conf.set(MAX_RECORDS_KEY, "0")  # rows not bounded: neither are the bytes the rows make
    with ByteBoundLift(spark, schema(FIXED)):
        assert spark.conf.get(MAX_BYTES_KEY) == "64m"


def test_overlapping_lifts_share_one_window_and_the_last_puts_the_users_bound_back(spark: SparkSession, own_bound: None) -> None:
    spark.conf.set(MAX_BYTES_KEY, "32m")
    first, second = ByteBoundLift(spark, schema(FIXED)), ByteBoundLift(spark, schema("x int"))
    with first:
        with second:
            first.release()
            first.release()  # idempotent: it does not end the other's hold
            assert spark.conf.get(MAX_BYTES_KEY) == UNBOUNDED
        assert spark.conf.get(MAX_BYTES_KEY) == "32m"
    assert spark.conf.get(MAX_BYTES_KEY) == "32m"


class Gate:
    """map_batches' fn: waits (at most 60 s) for the test to open the gate, a file, then passes the batch on."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        deadline = time.monotonic() + 60  # the test opens it within seconds; past this the map fails, not hangs
        while not self.path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.path} never appeared")
            time.sleep(0.01)
        return pd.DataFrame({"y": batch["x"] * 2})


def wait_for(what: str, check: Any, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds:.0f} s for {what}"
        time.sleep(0.005)


@pytest.mark.timeout(180)
def test_a_map_lifts_the_bound_while_its_job_starts_and_puts_it_back_once_a_task_runs(
    spark: SparkSession, own_bound: None, tmp_path: Path
) -> None:
    spark.conf.set(MAX_BYTES_KEY, "48m")
    df = spark.range(2000, numPartitions=2).selectExpr("id", "CAST(id AS DOUBLE) AS x")
    gate = tmp_path / "open"
    got: dict[str, Any] = {}
    with QueuePool.local(n_servers=1) as pool:

        def run() -> None:
            try:
                got["out"] = cs.map_batches(df, Gate(str(gate)), schema="y double", queue_pool=pool, progress=False)
            except BaseException as e:
                got["error"] = e

        mapping = threading.Thread(target=run, name="map")
        mapping.start()
        try:
            wait_for("the lift as the job starts", lambda: spark.conf.get(MAX_BYTES_KEY) == UNBOUNDED)
            # every task of the job waits at the gate, so the bound is back while the job still runs
            wait_for("the user's bound back once a task runs", lambda: spark.conf.get(MAX_BYTES_KEY) == "48m")
            assert mapping.is_alive()
        finally:
            gate.touch()
            mapping.join(120)
    assert not mapping.is_alive() and "error" not in got, got
    assert sorted(r["y"] for r in got["out"].collect()) == [2.0 * i for i in range(2000)]
    assert spark.conf.get(MAX_BYTES_KEY) == "48m"
