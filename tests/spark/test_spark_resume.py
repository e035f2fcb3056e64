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

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

import conveyor.spark as cs
from conveyor.client.pool import QueuePool
from conveyor.errors import ConveyorError, JobInputChangedError
from conveyor.spark.job import chunk_rows_for, fixed_chunks, rows_digest

from ..support.docs import run_example, section_code
from ..support.graph_helpers import ROOT
from ..support.procs import kill_tree, process_tree
from ..support.resumable_job import JOB, ROWS, ROWS_PER_MESSAGE, job_input, run_job
from ..support.servers import wait_for

pytestmark = pytest.mark.timeout(300)
QUEUE = f"map-job-{JOB}"
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
    assert QUEUE not in pool.stats()  # a job that ended well leaves nothing behind


def test_a_changed_input_is_refused_and_restart_runs_the_job_anew(spark: SparkSession, pool: QueuePool, tmp_path: Path) -> None:
    log = tmp_path / "rows.log"
    killed_halfway(pool, log, tmp_path)

    with pytest.raises(JobInputChangedError, match="restart=True") as caught:
        run_job(job_input(spark, changed=True), pool, str(log))
    assert any(QUEUE in note and "run the same call again" in note for note in caught.value.__notes__)
    assert QUEUE in pool.stats()  # kept: the error changed nothing the next run needs

    out = run_job(job_input(spark, changed=True), pool, str(log), restart=True).collect()
    expected = [(i, 0 if i == 7 else 2 * i + 1) for i in range(ROWS)]
    assert sorted((r["id"], r["y"]) for r in out) == expected and all(r["_error"] is None for r in out)
    assert QUEUE not in pool.stats()


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


def test_chunks_and_their_digests_do_not_depend_on_the_batches_the_rows_came_in() -> None:
    table = pa.table({"id": list(range(1000)), "s": [None if i % 7 == 0 else str(i) for i in range(1000)]})
    one = list(fixed_chunks(iter(table.to_batches()), 300))
    many = list(fixed_chunks(iter(table.to_batches(max_chunksize=77)), 300))
    assert [b.num_rows for b in one] == [300, 300, 300, 100] == [b.num_rows for b in many]
    assert [rows_digest(b) for b in one] == [rows_digest(b) for b in many]
    changed = table.set_column(0, "id", pa.array([*range(999), -1]))
    assert [rows_digest(b) for b in fixed_chunks(iter(changed.to_batches()), 300)][-1] != rows_digest(one[-1])
    renamed = table.rename_columns(["id", "t"])
    assert rows_digest(next(fixed_chunks(iter(renamed.to_batches()), 300))) != rows_digest(one[0])
    assert chunk_rows_for(8) == 8192 and chunk_rows_for(1000) == 8000 and chunk_rows_for(20_000) == 20_000


def test_the_resumable_jobs_example_runs_as_written(tmp_path: Path) -> None:
    """docs/spark.md's example, run twice as a user would: each run ends well, so each runs the job anew."""
    for _ in range(2):
        done = run_example(section_code("spark.md", "### Resumable jobs"), tmp_path, timeout=300)
        assert done.returncode == 0 and "10000 rows" in done.stdout, done.stderr[-3000:]
    assert (tmp_path / "conveyor-data").is_dir()  # its servers' data, where the job's queue would wait
