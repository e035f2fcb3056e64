"""Async functions through `conveyor.spark.map` and `map_batches` (local[2], real queue servers).

An `async def` function, or a class whose `__call__` is one, is awaited on each consumer's event
loop (`pool="async"` by default), a message's rows together (`conveyor.spark.rows.AsyncRowRunner`),
many messages at once; each call held to `time_limit` (`conveyor.spark.instances.Instances.call`),
retried as a plain function's rows are, its message's lease extended while it waits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession

import conveyor.spark as cs
from conveyor.client.pool import QueuePool
from conveyor.spark.job import MapStats

from ..support.docs import run_example, section_code

pytestmark = pytest.mark.timeout(240)

N = 1000
SLEEP_S = 0.5  # each call of the in-flight test waits this long: 500 s in turn, a few seconds together


@pytest.fixture(scope="module")
def pool() -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=2) as p:
        yield p


@pytest.fixture(scope="module")
def df(spark: SparkSession) -> DataFrame:
    return spark.range(N, numPartitions=2)


def run(df: DataFrame, fn: Any, servers: QueuePool, entry: str = "map", **kwargs: Any) -> tuple[pd.DataFrame, MapStats]:
    out, stats = getattr(cs, entry)(df, fn, queue_pool=servers, stats=True, progress=False, **kwargs)
    rows = out.toPandas()
    rows = rows.sort_values("id" if "id" in rows else "_id").reset_index(drop=True)
    out.unpersist()
    assert servers.drop(stats.queue)
    return rows, stats


_in_flight = 0  # calls of `waiting` running now in this process (the consumer's), and the most seen
_peak = 0


async def waiting(row: dict[str, Any]) -> dict[str, Any]:
    """Waits SLEEP_S; returns how many calls this process had in flight at most, so far."""
    global _in_flight, _peak
    _in_flight += 1
    _peak = max(_peak, _in_flight)
    try:
        await asyncio.sleep(SLEEP_S)
    finally:
        _in_flight -= 1
    return {"id": row["id"], "peak": _peak}


def test_an_async_function_runs_its_rows_many_at_once(df: DataFrame, pool: QueuePool) -> None:
    rows, stats = run(df, waiting, pool, schema="id long, peak long")
    assert rows["id"].tolist() == list(range(N)) and rows["_error"].isna().all()
    # 1,000 calls of 0.5 s on two consumers: in turn 500 s; here hundreds wait at once
    assert rows["peak"].max() >= 300, rows["peak"].describe()
    assert stats.consume_s < 60, stats


_tries: dict[int, int] = {}


async def flaky(row: dict[str, Any]) -> int:
    """Row 3 fails once, then works; row 4 always fails; row 5 waits past any time limit here."""
    i = int(row["id"])
    _tries[i] = _tries.get(i, 0) + 1
    await asyncio.sleep(0.01)
    if i == 3 and _tries[i] == 1:
        raise ConnectionError("row 3: the first try fails")
    if i == 4:
        raise ValueError(f"row 4 fails every time (try {_tries[i]})")
    if i == 5:
        await asyncio.sleep(120)
    return i * 10


def test_failing_and_slow_calls_fail_alone_after_their_retries(spark: SparkSession, pool: QueuePool) -> None:
    small = spark.range(40, numPartitions=2)
    rows, stats = run(small, flaky, pool, schema="v long", max_retries=2, time_limit=2.0, rows_per_message=8)
    failed = rows[rows["_error"].notna()]
    assert sorted(failed["_input"].tolist()) == ['{"id": 4}', '{"id": 5}']
    errors = dict(zip(failed["_input"], failed["_error"], strict=True))
    assert "ValueError: row 4 fails every time (try 3)" in errors['{"id": 4}']  # 1 + max_retries tries
    assert "TimeLimitExceededError: the call ran over its time limit of 2 s" in errors['{"id": 5}']
    good = rows[rows["_error"].isna()]
    assert sorted(good["v"].tolist()) == [i * 10 for i in range(40) if i not in (4, 5)]  # row 3 on its second try
    # the slow row's three tries of 2 s each, not its 120 s: the limit holds each call
    assert stats.consume_s < 60 and stats.failed == 2, stats


class AsyncModel:
    """A client class: built once per consumer process (its pid to the side file), awaited per row, closed at the end."""

    def __init__(self, side_file: str, *, offset: int) -> None:
        self.offset, self.side_file = offset, side_file
        with open(side_file, "a") as f:
            f.write(f"built {os.getpid()}\n")

    async def __call__(self, row: dict[str, Any]) -> tuple[int, int]:
        await asyncio.sleep(0.001)
        return row["id"], row["id"] + self.offset

    async def aclose(self) -> None:
        await asyncio.sleep(0)  # on the consumer's loop, still running
        with open(self.side_file, "a") as f:
            f.write(f"closed {os.getpid()}\n")


def test_a_class_with_an_async_call_is_built_once_per_consumer_process_and_closed_there(
    df: DataFrame, pool: QueuePool, tmp_path: Path
) -> None:
    side = tmp_path / "built"
    rows, stats = run(df, AsyncModel, pool, schema="id long, v long", fn_args=(str(side),), fn_kwargs={"offset": 7})
    assert rows["_error"].isna().all() and (rows["v"] == rows["id"] + 7).all()
    lines = side.read_text().splitlines()
    built = [line.split()[1] for line in lines if line.startswith("built")]
    assert len(built) == len(set(built)) == stats.instances and 1 <= stats.instances <= 2, (lines, stats)
    # each instance's aclose awaited as its consumer ended (the map's consumers end before it returns)
    assert sorted(line.split()[1] for line in lines if line.startswith("closed")) == sorted(built), lines


async def long_call(row: dict[str, Any]) -> int:
    """Waits past the queue's lease (several times over): each run noted in a side file."""
    with open(row["side"], "a") as f:
        f.write(f"{row['id']}\n")
    await asyncio.sleep(4.0)
    return int(row["id"])


def test_a_call_waiting_past_the_lease_runs_once(spark: SparkSession, pool: QueuePool, tmp_path: Path) -> None:
    """The lease (1 s) is extended while the calls wait: no row is delivered again, none runs twice."""
    side = tmp_path / "runs"
    small = spark.createDataFrame([(i, str(side)) for i in range(6)], "id long, side string")
    rows, _ = run(small, long_call, pool, schema="v long", lease_s=1.0)
    assert rows["_error"].isna().all() and sorted(rows["v"]) == list(range(6))
    assert sorted(int(x) for x in side.read_text().split()) == list(range(6))


async def async_batch(batch: pd.DataFrame) -> pd.DataFrame:
    await asyncio.sleep(0.01)
    if (batch["id"] == 5).any():
        raise ValueError("row 5 is bad")
    return pd.DataFrame({"id": batch["id"], "v": batch["id"] * 3})


def test_map_batches_awaits_an_async_function_and_splits_a_failing_batch(df: DataFrame, pool: QueuePool) -> None:
    rows, _ = run(df, async_batch, pool, entry="map_batches", schema="id long, v long", rows_per_batch=64)
    bad = rows[rows["_error"].notna()]
    assert bad["_input"].tolist() == ['{"id": 5}'] and "ValueError: row 5 is bad" in bad["_error"].iloc[0]
    good = rows[rows["_error"].isna()]
    assert len(good) == N - 1 and (good["v"] == good["id"] * 3).all()


def test_an_async_function_on_thread_consumers_runs_and_says_so(
    spark: SparkSession, pool: QueuePool, caplog: pytest.LogCaptureFixture
) -> None:
    """Given pool="thread", an async function still runs (each message on a loop of its own), and the log says so."""

    async def double(row: dict[str, Any]) -> int:
        await asyncio.sleep(0)
        return int(row["id"]) * 2

    with caplog.at_level(logging.WARNING, logger="conveyor.spark"):
        rows, _ = run(spark.range(50, numPartitions=2), double, pool, schema="v long", pool="thread")
    assert rows["_error"].isna().all() and sorted(rows["v"]) == [i * 2 for i in range(50)]
    assert any("the function is async, and the consumers' pool is 'thread'" in r.getMessage() for r in caplog.records)


def test_the_api_calls_page_example_runs_as_written(tmp_path: Path) -> None:
    """docs/api-calls.md's example, run as a user's script: its own API stand-in, embedded Spark and servers."""
    done = run_example(section_code("api-calls.md", "## An async client"), tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.fullmatch(r"2,000 calls in \d+\.\d s, 0 failed", done.stdout.strip()), done.stdout
    assert "Unclosed" not in done.stderr, done.stderr[-3000:]  # each consumer's session closed by aclose
