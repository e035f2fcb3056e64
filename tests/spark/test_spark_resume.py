"""Resumable jobs: `conveyor.spark.map(..., job=...)` run again after its driver died reuses what it stored.

The driver of the first run is a program of its own (tests/support/resumable_job.py) SIGKILLed with
its Spark halfway; the servers (durable, `QueuePool.local` with a data directory) outlive it. The
second run is this process's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

import conveyor.spark as cs
from conveyor.client.pool import QueuePool
from conveyor.errors import ConveyorError, JobInputChangedError
from conveyor.spark.resume import ROW_HASH, ChunkedInput, chunk_rows_for, chunked_input, hashed_input, input_chunks

from ..support.docs import run_example, section_code
from ..support.graph_helpers import ROOT
from ..support.procs import kill_tree, process_tree
from ..support.resumable_job import JOB, ROWS, ROWS_PER_MESSAGE, job_input, run_job
from ..support.servers import wait_for

pytestmark = pytest.mark.timeout(300)
QUEUE = f"map-job-{JOB}"
MARKERS = f"map-chunks-{JOB}"
START_S = 120.0  # for the first run's driver to start Spark and run half the rows, on a busy machine


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=2, data_dir=tmp_path / "data") as p:
        yield p


def ids_in(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()]


def killed_halfway(pool: QueuePool, log: Path, tmp_path: Path) -> tuple[int, int]:
    """Run the job's first run in a driver of its own and SIGKILL it, with its Spark, once half the rows ran.

    Its processes are stopped first (SIGSTOP), so that what the servers say of the job then is what
    the kill finds. Returns how many rows had run by then, and how many messages were in flight
    (delivered and not yet settled: running, done but not yet acked, or fetched ahead).
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    err = tmp_path / "driver.err"
    with open(err, "wb") as stderr:
        driver = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "support" / "resumable_job.py"), ",".join(pool.addresses), str(log)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: (log.exists() and len(ids_in(log)) >= ROWS // 2) or driver.poll() is not None,
            START_S,
            "half the rows of the first run run",
        )
        assert driver.poll() is None, err.read_text(errors="replace")[-3000:]
        for pid in process_tree(driver.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        in_flight = pool.stats()[QUEUE].delivered
    finally:
        kill_tree(driver)
    return len(ids_in(log)), in_flight


def test_a_job_whose_driver_died_runs_only_the_rest_when_run_again(spark: SparkSession, pool: QueuePool, tmp_path: Path) -> None:
    log = tmp_path / "rows.log"
    before, in_flight = killed_halfway(pool, log, tmp_path)
    assert ROWS // 2 <= before < ROWS and QUEUE in pool.stats()  # the job's queue outlived its driver
    bound = in_flight * ROWS_PER_MESSAGE  # rows that may run again: those of messages in flight at the kill

    out = run_job(job_input(spark), pool, str(log)).collect()

    assert sorted((r["id"], r["y"], r["_error"]) for r in out) == [(i, 2 * i + 1, None) for i in range(ROWS)]
    runs = Counter(ids_in(log))
    assert set(runs) == set(range(ROWS))
    twice = sum(n - 1 for n in runs.values())
    assert twice <= bound, f"{twice} rows ran twice; {in_flight} messages of {ROWS_PER_MESSAGE} rows were in flight"
    assert sum(runs.values()) - before <= ROWS - before + bound  # the second run ran only the rest
    assert not {QUEUE, MARKERS} & set(pool.stats())  # a job that ended well leaves nothing behind


def test_a_changed_input_is_refused_and_restart_runs_the_job_anew(spark: SparkSession, pool: QueuePool, tmp_path: Path) -> None:
    log = tmp_path / "rows.log"
    killed_halfway(pool, log, tmp_path)

    held = pool.stats()[QUEUE]
    with pytest.raises(JobInputChangedError, match=r"1 of the \d+ chunks .* Nothing was put.*restart=True") as caught:
        run_job(job_input(spark, changed=True), pool, str(log))
    assert any(QUEUE in note and "run the same call again" in note for note in caught.value.__notes__)
    now = pool.stats()[QUEUE]  # kept: the error changed nothing the next run needs
    assert {q.fsync for c in pool.queues.clients for q in c.queues() if q.name == QUEUE} == {"batch"}  # the servers'
    assert (now.ready + now.delivered + now.acked, now.failed) == (held.ready + held.delivered + held.acked, held.failed)

    out = run_job(job_input(spark, changed=True), pool, str(log), restart=True).collect()
    expected = [(i, 0 if i == 7 else 2 * i + 1) for i in range(ROWS)]
    assert sorted((r["id"], r["y"]) for r in out) == expected and all(r["_error"] is None for r in out)
    assert not {QUEUE, MARKERS} & set(pool.stats())


def test_a_finished_job_leaves_nothing_and_runs_anew_when_called_again(
    spark: SparkSession, pool: QueuePool, tmp_path: Path
) -> None:
    log = tmp_path / "rows.log"
    df = job_input(spark).limit(40)
    for _ in range(2):
        out = run_job(df, pool, str(log)).collect()
        assert sorted(r["y"] for r in out) == [2 * i + 1 for i in range(40)]
        assert QUEUE not in pool.stats()
    assert Counter(ids_in(log)) == dict.fromkeys(range(40), 2)


def test_a_job_run_again_with_other_settings_says_so(spark: SparkSession, pool: QueuePool, tmp_path: Path) -> None:
    pool.queues.declare(QUEUE, lease_s=99.0)  # as an earlier run with lease_s=99 left it
    with pytest.raises(ConveyorError, match=r"was run before with other settings .*lease_s.*restart=True"):
        run_job(job_input(spark).limit(10), pool, str(tmp_path / "rows.log"))


def test_a_job_needs_servers_that_outlive_the_call_and_a_name(spark: SparkSession) -> None:
    df = spark.range(3)
    with pytest.raises(ValueError, match=r"job='nightly' needs queue servers that outlive the call"):
        cs.map(df, lambda r: r["id"], schema="y long", job="nightly", progress=False)
    for bad in ("", "-x", "a/b", "x" * 65, 7):
        with pytest.raises(ValueError, match="job must be a name"):
            cs.map(df, lambda r: r["id"], schema="y long", job=bad, progress=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="restart=True is for a resumable job"):
        cs.map(df, lambda r: r["id"], schema="y long", restart=True, progress=False)


def chunk_keys_put(hashed: DataFrame, chunked: ChunkedInput) -> list[tuple[str, int]]:
    """(key, rows) of each chunk as the put's tasks make them, from the rows they get."""

    def keys(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()  # type: ignore[union-attr]
        for key, chunk in chunked.chunks(batches, part):
            assert ROW_HASH not in chunk.schema.names
            yield pa.RecordBatch.from_pylist([{"key": key, "rows": chunk.num_rows}])

    return sorted((r["key"], r["rows"]) for r in hashed.mapInArrow(keys, "key string, rows long").collect())


def test_the_put_and_the_jvm_name_the_same_chunks_whatever_batches_the_rows_come_in(spark: SparkSession) -> None:
    rows = [(i, None if i % 7 == 0 else str(i), {"k": [i]}) for i in range(1000)]
    ddl = "id long, s string, m map<string, array<long>>"  # a map: Spark's hash refuses one, so it is hashed as JSON

    def chunks(data: list[tuple[Any, ...]], schema: str = ddl) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        df = spark.createDataFrame(data, schema).repartition(3)
        chunked = ChunkedInput("j", 150, chunked_input(df, "j", 10, "m").schema_tag, "m")
        hashed = hashed_input(df)
        return chunk_keys_put(hashed, chunked), sorted((c.key, c.rows) for c in input_chunks(hashed, chunked))

    batch = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(batch)
    try:
        spark.conf.set(batch, "37")
        put, jvm = chunks(rows)
        spark.conf.set(batch, "10000")
        assert chunks(rows) == (put, put) == (jvm, jvm)
    finally:
        spark.conf.set(batch, before)
    assert sum(n for _, n in put) == 1000 and {n for _, n in put} <= {150, *range(1, 150)}
    assert all(k.startswith("j:") and k.split(":")[2] in {"0", "150", "300"} for k, _ in put)
    changed, _ = chunks([*rows[:-1], (999, "x", {"k": [999]})])
    assert 0 < len(set(changed) - set(put)) < len(put)  # one row changed: its chunk's key (and those it moved rows of)
    swapped, _ = chunks([(i, s, {"k": [i + 1]}) for i, s, _ in rows])
    assert not set(swapped) & set(put)
    renamed, _ = chunks(rows, ddl.replace("s string", "t string"))
    assert not set(renamed) & set(put)  # other columns: other keys
    assert chunk_rows_for(8) == 8192 and chunk_rows_for(1000) == 8000 and chunk_rows_for(20_000) == 20_000


def test_the_resumable_jobs_example_runs_as_written(tmp_path: Path) -> None:
    """docs/spark.md's example, run twice as a user would: each run ends well, so each runs the job anew."""
    for _ in range(2):
        done = run_example(section_code("spark.md", "### Resumable jobs"), tmp_path, timeout=300)
        assert done.returncode == 0 and "10000 rows" in done.stdout, done.stderr[-3000:]
    assert (tmp_path / "conveyor-data").is_dir()  # its servers' data, where the job's queue would wait
