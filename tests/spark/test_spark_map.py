"""conveyor.spark: DataFrames mapped through the queue, and consumers running as Spark tasks (local[2,4]).

Also `conveyor.local()` (`conveyor.spark.embedded`).

`conveyor.spark.map` is `conveyor.spark.mapping`.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

import conveyor
import conveyor.spark as cs
from conveyor.client.pool import QueuePool
from conveyor.constants import SHARD_SHIFT
from conveyor.message import Status
from conveyor.worker.middleware import Retries

from ..support import worker_tasks as wt
from ..support.servers import wait_for


@pytest.fixture(scope="module")
def pool() -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=2) as p:
        yield p


def double(row: dict[str, Any]) -> dict[str, Any]:
    if row["id"] % 100 == 42:
        raise ValueError(f"row {row['id']} is bad")
    return {"id": row["id"], "twice": row["id"] * 2, "label": f"n{row['id']}"}


def test_map_gives_one_row_per_input_row_and_reports_failures(spark: SparkSession, pool: QueuePool) -> None:
    df = spark.range(1000, numPartitions=4)
    out, stats = cs.map(
        df,
        double,
        schema="id long, twice long, label string",
        queue_pool=pool,
        max_retries=1,
        rows_per_message=4,
        progress=False,
        stats=True,
    )
    rows = out.collect()
    # 2 consumer tasks each put their half (2 input partitions, coalesced), up to 4 rows to a
    # message, dealt from each Arrow batch: no message holds two neighbouring rows
    groups: dict[int, list[int]] = {}
    for r in rows:
        groups.setdefault(r["_id"], []).append(r["id"] if r["id"] is not None else json.loads(r["_input"])["id"])
    assert len(rows) == 1000 and 250 <= len(groups) <= 260 and all(len(g) <= 4 for g in groups.values())
    assert all(b - a > 1 for g in groups.values() for a, b in itertools.pairwise(sorted(g)))
    ok = [r for r in rows if r["_error"] is None]
    bad = sorted((r for r in rows if r["_error"] is not None), key=lambda r: r["_input"])
    assert sorted(r["id"] for r in ok) == [i for i in range(1000) if i % 100 != 42]
    assert all(r["twice"] == 2 * r["id"] and r["label"] == f"n{r['id']}" for r in ok)
    assert len(bad) == 10 and all(r["id"] is None and "ValueError: row" in r["_error"] for r in bad)
    assert bad[0]["_input"] == '{"id": 142}'
    assert out.schema.simpleString().startswith("struct<id:bigint,twice:bigint,label:string,_id:bigint")
    assert stats.rows == 1000 and stats.failed == 10
    assert sum(c["processed"] for c in stats.consumers) == len(groups)  # a failing row does not fail its message
    assert sorted(c["rows"] for c in stats.consumers) == [500, 500]
    names = set(pool.stats())  # the results stay in the map's queue until dropped; its bookkeeping is gone
    assert stats.queue in names and not any(n.startswith(("conveyor-fed-", "conveyor-read-")) for n in names), names
    out.unpersist()
    assert out.count() == 1000  # read again from the servers: the read-back leaves no bookkeeping behind this time either
    assert not any(n.startswith("conveyor-read-") for n in pool.stats())
    assert pool.drop(stats.queue) and stats.queue not in pool.stats()


def slow_row(row: dict[str, Any]) -> int:
    time.sleep(0.03)  # over SLOW_ROW_S
    return int(row["id"])


@pytest.mark.parametrize("given", [None, 8])
def test_slow_rows_travel_one_to_a_message_unless_rows_per_message_is_given(
    spark: SparkSession, pool: QueuePool, given: int | None
) -> None:
    """Rows of 30 ms: once a consumer has run a message's worth, the messages it gets are split, a row to each.

    The first message each of a consumer's 8 threads takes runs whole (nothing was measured yet):
    2 x 8 messages of 8 rows at most, so the 200 rows come from 16 + 72 messages at least. Given
    rows_per_message, the messages run as they are: each partition's 100 rows in 13.
    """
    out, stats = cs.map(
        spark.range(200, numPartitions=2),
        slow_row,
        schema="v long",
        queue_pool=pool,
        rows_per_message=given,
        progress=False,
        stats=True,
    )
    rows = out.collect()
    assert sorted(r["v"] for r in rows) == list(range(200)) and all(r["_error"] is None for r in rows)
    messages = len({r["_id"] for r in rows})  # a row split off its message has an id of its own
    if given is None:
        assert messages >= 16 + 72, messages
    else:
        assert messages == 26, messages
    assert pool.drop(stats.queue)


def cores_of(row: dict[str, Any]) -> dict[str, Any]:
    import os

    return {"id": row["id"], "pid": os.getpid(), "cores": ",".join(map(str, sorted(os.sched_getaffinity(0))))}


def test_pinned_consumers_run_rows_on_cores_of_their_own(spark: SparkSession, pool: QueuePool) -> None:
    import os

    df = spark.range(200, numPartitions=2)
    rows = cs.map(
        df, cores_of, schema="id long, pid long, cores string", queue_pool=pool, pin_core=True, progress=False
    ).collect()
    assert sorted(r["id"] for r in rows) == list(range(200)) and all(r["_error"] is None for r in rows)
    by_pid: dict[int, set[str]] = {}
    for r in rows:
        by_pid.setdefault(r["pid"], set()).add(r["cores"])
    masks = [m for ms in by_pid.values() for m in ms]
    assert all("," not in m for m in masks)  # each consumer on one core
    if len(by_pid) == 2 and len(os.sched_getaffinity(0)) >= 2:
        assert len(set(masks)) == 2  # and not the same one
    # the Python workers got their cores back: a plain job after it runs anywhere
    after = (
        spark.range(2, numPartitions=2)
        .mapInPandas(lambda frames: (f.assign(n=len(__import__("os").sched_getaffinity(0))) for f in frames), "id long, n long")
        .collect()
    )
    assert all(r["n"] == len(os.sched_getaffinity(0)) for r in after)


def test_results_as_tuples_values_and_the_wrong_shape(spark: SparkSession, pool: QueuePool) -> None:
    df = spark.createDataFrame([(i, f"w{i}") for i in range(20)], "n long, word string")
    out = cs.map(df, lambda r: (r["word"].upper(), r["n"] + 1), schema="word string, n long", queue_pool=pool, progress=False)
    assert sorted((r["word"], r["n"]) for r in out.collect()) == sorted((f"W{i}", i + 1) for i in range(20))
    one = cs.map(df, lambda r: len(r["word"]), schema="length int", queue_pool=pool, progress=False)
    assert sorted(r["length"] for r in one.collect()) == sorted(len(f"w{i}") for i in range(20))
    wrong = cs.map(df, lambda r: "not a number" if r["n"] == 3 else r["n"], schema="n long", queue_pool=pool, progress=False)
    rows = wrong.collect()
    assert len(rows) == 20
    [bad] = [r for r in rows if r["_error"] is not None]
    assert "does not fit the schema" in bad["_error"] and bad["n"] is None
    assert json.loads(bad["_input"]) == {"n": 3, "word": "w3"}  # which input row it was


def test_schema_columns_may_not_clash(spark: SparkSession, pool: QueuePool) -> None:
    with pytest.raises(ValueError, match=r"clash with the columns map adds"):
        cs.map(spark.range(3), lambda r: r, schema="_id long", queue_pool=pool)


def test_dict_results_must_have_the_schema_keys(spark: SparkSession, pool: QueuePool) -> None:
    df = spark.createDataFrame([(i,) for i in range(6)], "n long")
    out = cs.map(
        df,
        lambda r: {"n": r["n"], "W": 1} if r["n"] == 1 else {"n": r["n"]} if r["n"] == 2 else {"n": r["n"], "w": 2},
        schema="n long, w long",
        queue_pool=pool,
        progress=False,
    )
    rows = {r["_input"] and json.loads(r["_input"])["n"]: r for r in out.collect() if r["_error"]}
    assert sorted(rows) == [1, 2]
    assert "unknown keys ['W']" in rows[1]["_error"] and "no value for ['w']" in rows[1]["_error"]
    assert "no value for ['w']" in rows[2]["_error"] and rows[2]["w"] is None


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"func": 42}, r"func must be callable"),
        ({"fn_args": (1,)}, r"map: fn_args and fn_kwargs are the constructor's arguments of a class"),
        ({"max_retries": -1}, r"map: max_retries must be an int in 0\.\."),
        ({"n_consumers": 0}, r"n_consumers must be an integer >= 1"),
        ({"concurrency": 0}, r"concurrency must be an integer >= 1"),
        ({"max_concurrency": 0}, r"map\(\) got an unexpected keyword argument 'max_concurrency'"),
        ({"early_ack": True}, r"map: early_ack is not for map"),
        ({"middleware": [Retries()]}, r"map: middleware is not for map: .* max_retries= and time_limit="),
        ({"time_limit": 0}, r"time_limit must be a number of seconds > 0"),
        ({"pool": "fibers"}, r"pool must be 'thread', 'process' or 'async'"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(spark: SparkSession, pool: QueuePool, kw: dict[str, Any], error: str) -> None:
    before = set(pool.stats())
    args: dict[str, Any] = {"func": lambda r: r["id"], "schema": "id long", "queue_pool": pool, **kw}
    with pytest.raises((TypeError, ValueError), match=error):
        cs.map(spark.range(3), args.pop("func"), **args)
    assert set(pool.stats()) == before  # no queue declared


def test_more_consumers_than_task_slots_still_ends(
    spark: SparkSession, pool: QueuePool, caplog: pytest.LogCaptureFixture
) -> None:
    """No task waits for another: the tasks without a slot run as others end, consuming their own rows."""
    n = spark.sparkContext.defaultParallelism + 1
    out = cs.map(
        spark.range(40, numPartitions=8), lambda r: r["id"], schema="id long", queue_pool=pool, n_consumers=n, progress=False
    )
    assert sorted(r["id"] for r in out.collect()) == list(range(40))
    assert any(f"{n} consumers but {n - 1} Spark task slots" in r.getMessage() for r in caplog.records)


def test_a_model_bigger_than_a_frame_kept_in_the_closure_runs(spark: SparkSession, pool: QueuePool) -> None:
    """An 80 MiB model in the function's closure: stored on the servers in chunks, once, and every row computed."""
    model = os.urandom(80 * 2**20)
    out, st = cs.map(
        spark.range(30),
        lambda r: (r["id"], model[r["id"]]),
        schema="id long, b int",
        queue_pool=pool,
        progress=False,
        stats=True,
    )
    assert sorted((r["id"], r["b"]) for r in out.collect()) == [(i, model[i]) for i in range(30)]
    assert st.failed == 0


def test_a_time_limit_sends_rows_one_to_a_message(spark: SparkSession, pool: QueuePool) -> None:
    out, stats = cs.map(
        spark.range(12), lambda r: r["id"], schema="id long", queue_pool=pool, time_limit=30, progress=False, stats=True
    )
    assert len({r["_id"] for r in out.collect()}) == 12
    assert pool.drop(stats.queue)


def test_workers_python_that_cannot_import_conveyor_is_named_with_the_remedy(tmp_path: Path) -> None:
    import sys

    from conveyor.spark.session import workers_python_error

    assert workers_python_error(sys.executable) is None
    bare = tmp_path / "python-without-site"  # the interpreter without its site-packages: no conveyor
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    error = workers_python_error(str(bare))
    assert error is not None and "cannot import conveyor" in error and f"PYSPARK_PYTHON={sys.executable}" in error


def test_the_embedded_jvm_runs_the_parallel_collector_unless_something_chooses_one(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conveyor.spark.session import COLLECTOR_OPTION, driver_java_options

    jvm: Any = spark.sparkContext._jvm
    names = {b.getName() for b in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()}
    given = spark.sparkContext.getConf().get("spark.driver.defaultJavaOptions", "")
    assert ({"PS Scavenge", "PS MarkSweep"} == names) == (COLLECTOR_OPTION in given)  # the tests' own session
    for var in ("PYSPARK_SUBMIT_ARGS", "SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert driver_java_options({"spark.executor.cores": 2}) == COLLECTOR_OPTION
    # a collector chosen anywhere the JVM's launch reads wins (two chosen: the JVM refuses to start)
    assert driver_java_options({"spark.driver.extraJavaOptions": "-Xss4m -XX:+UseG1GC"}) is None
    for name in ("spark-defaults.conf", "java-opts", "spark-env.sh"):
        (tmp_path / name).write_text("spark.driver.extraJavaOptions -XX:+UseZGC\n")
        assert driver_java_options({}) is None, name
        (tmp_path / name).unlink()
    props = tmp_path / "elsewhere.properties"
    props.write_text("spark.driver.extraJavaOptions=-XX:+UseSerialGC\n")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", f"--properties-file {props} pyspark-shell")
    assert driver_java_options({}) is None
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-XX:+UseSerialGC")
    assert driver_java_options({}) is None
    monkeypatch.delenv("SPARK_SUBMIT_OPTS")
    # default options set in spark-defaults.conf are the user's: left as they are
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.defaultJavaOptions -Xss8m\n")
    assert driver_java_options({}) is None


def test_the_embedded_session_talks_to_its_python_workers_over_unix_sockets(spark: SparkSession) -> None:
    import pyarrow as pa

    def seen(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import os

        for _ in batches:
            pass
        # the JVM starts its Python workers with this set when they connect back over a Unix socket
        yield pa.RecordBatch.from_pydict({"unix": [os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "").lower()]})

    assert spark.sparkContext.getConf().get("spark.python.unix.domain.socket.enabled") == "true"
    assert [r["unix"] for r in spark.range(0, 2, 1, 2).mapInArrow(seen, "unix string").collect()] == ["true", "true"]


def killer(marker: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A func that kills its Python worker (a consumer's Spark task) the first time it meets row 77."""

    def kill_once(row: dict[str, Any]) -> dict[str, Any]:
        import os
        import time

        if row["id"] == 77 and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write("killed")
            os._exit(9)
        time.sleep(0.002)
        return {"id": row["id"]}

    return kill_once


def test_a_killed_consumer_loses_no_row_and_duplicates_none(spark: SparkSession, pool: QueuePool, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    df = spark.range(600, numPartitions=3)
    t0 = time.monotonic()
    # a lease never waited out: the dead consumer's connections closed, which ends its leases at once
    out = cs.map(df, killer(str(marker)), schema="id long", queue_pool=pool, lease_s=600.0, progress=False)
    rows = out.collect()
    assert time.monotonic() - t0 < 120
    assert marker.exists(), "the consumer was never killed: the test did not test anything"
    assert sorted(r["id"] for r in rows) == list(range(600))
    assert all(r["_error"] is None for r in rows)


def crashes_on_13(row: dict[str, Any]) -> dict[str, Any]:
    """A func whose row 13 always kills the process running it (a crash in native code, say)."""
    import os

    if row["id"] == 13:
        os._exit(9)
    return {"id": row["id"]}


def test_a_row_that_crashes_its_process_fails_alone(spark: SparkSession, pool: QueuePool) -> None:
    """A row that crashes its process fails alone.

    Its message of 4 rows is split after the first crash: the 3 neighbours come back, and the row at
    fault ends failed after its own attempts.
    """
    df = spark.range(40, numPartitions=2)
    out, stats = cs.map(
        df,
        crashes_on_13,
        schema="id long",
        queue_pool=pool,
        pool="process",
        rows_per_message=4,
        max_retries=1,
        progress=False,
        stats=True,
    )
    rows = out.collect()
    ok = sorted(r["id"] for r in rows if r["_error"] is None)
    [bad] = [r for r in rows if r["_error"] is not None]
    assert len(rows) == 40 and ok == [i for i in range(40) if i != 13] and stats.failed == 1
    assert json.loads(bad["_input"]) == {"id": 13} and "exit" in bad["_error"].lower(), bad["_error"]
    assert sum(c["processed"] for c in stats.consumers) == 10 + 4 - 1  # 10 messages, 4 more split off, 1 dead letter


def test_the_read_back_takes_each_row_of_a_split_message_once(pool: QueuePool) -> None:
    """However a split ended, each row comes back once.

    Message A's late ack of its own rows wins over its split rows; message B ended as a dead letter
    after its split, so its rows come from the split rows (one of which is a dead letter too);
    message C's split was cut short, so its row with no split row comes from C's dead letter.
    """
    from pyspark.sql.types import LongType, StructField, StructType

    from conveyor.spark.form import ServerOutcomes
    from conveyor.spark.rows import RowOutcome, RowsResult, read_results
    from conveyor.tasks.envelope import encode_result
    from conveyor.tasks.options import TaskOptions
    from conveyor.tasks.publish import build_message

    queue, c, opts = "split-read", pool.queues.clients[1], TaskOptions(queue="split-read")
    base = 1 << SHARD_SHIFT  # ids as consumers see them: the shard in the high bits
    pool.queues.declare(queue)

    def put(rows: list[int], key: str) -> int:
        [i] = c.put(queue, [build_message("t", opts, ([{"id": r} for r in rows],), {}, key=key)])
        return i

    a, b, cut = put([0, 1], "a"), put([2, 3], "b"), put([4, 5], "c")
    assert [m.id for m in c.get(queue, 3)] == [a, b, cut]
    first = {a: 0, b: 2, cut: 4}  # the message's first row
    # C's split was cut short: only its first row was put back before C ended as a dead letter
    kids = {(m, j): put([first[m] + j], f"split:{base | m}:{j}") for m in (a, b, cut) for j in (0, 1) if (m, j) != (cut, 1)}
    assert len(c.get(queue, 5)) == 5
    late = RowsResult([RowOutcome(True, {"id": 0}), RowOutcome(True, {"id": 1})], 0)
    c.ack(queue, [a], [encode_result(late.to_wire())])  # an earlier attempt's late ack
    c.nack(queue, [b, cut], ["WorkerDied: lost"] * 2, final=True)
    done = [k for k in kids if k != (b, 1)]
    c.ack(
        queue,
        [kids[k] for k in done],
        [
            encode_result(
                RowsResult([RowOutcome(True, {"id": first[k[0]] + k[1]}, key=f"split:{base | k[0]}:{k[1]}")], 0).to_wire()
            )
            for k in done
        ],
    )
    c.nack(queue, [kids[b, 1]], ["WorkerDied: crashed"], final=True)
    batches = list(read_results(ServerOutcomes(c, queue, 1), StructType([StructField("id", LongType())])))
    rows = sorted(
        (r["id"] if r["id"] is not None else json.loads(r["_input"])["id"], r["_id"], r["_error"])
        for batch in batches
        for r in batch.to_pylist()
    )
    assert rows == [
        (0, base | a, None),
        (1, base | a, None),
        (2, base | kids[b, 0], None),
        (3, base | kids[b, 1], "WorkerDied: crashed"),
        (4, base | kids[cut, 0], None),
        (5, base | cut, "WorkerDied: lost"),
    ]
    pool.drop(queue)


def test_spark_consumer_pool_runs_tasks_until_stopped(spark: SparkSession, pool: QueuePool) -> None:
    pool.queues.declare("spark-jobs")
    handles = [pool.submit(pow, i, 2, _queue="spark-jobs") for i in range(50)]
    sp = cs.SparkConsumerPool(spark, pool, 2, queues=["spark-jobs"], until_empty=False, description="test consumers")
    sp.start()
    assert pool.gather(handles, timeout=120) == [i * i for i in range(50)]
    late = pool.submit(pow, 3, 3, _queue="spark-jobs")  # still running: it takes new work
    assert pool.gather([late], timeout=60) == [27]
    sp.stop(timeout=60)
    stats = sp.join()
    assert len(stats) == 2 and sum(s["processed"] for s in stats) == 51
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(f"conveyor-{sp.job}")
    assert jobs, "the consumers' Spark job is named by its job group"


def test_spark_consumers_run_registered_tasks_until_drained(spark: SparkSession, pool: QueuePool) -> None:
    handles = wt.add.publish_many([(i, 1) for i in range(100)], _pool=pool)
    stats = cs.SparkConsumerPool(spark, pool, queues=["jobs"], task_modules=["tests.support.worker_tasks"]).run()
    assert sum(s["processed"] for s in stats) == 100
    assert pool.gather(handles) == [i + 1 for i in range(100)]


def test_local_gives_the_embedded_default(spark: SparkSession) -> None:
    with conveyor.local() as env:
        assert env.spark is spark  # an active session is reused, not replaced
        assert cs.local is conveyor.local
        out = cs.map(spark.range(10), lambda r: r["id"] + 1, schema="n long", progress=False)  # no pool: env's
        assert sorted(r["n"] for r in out.collect()) == list(range(1, 11))
        assert any(q.name.startswith("map-") for q in env.pool.queues.clients[0].queues())
        # the one ambient pool: a task published with no pool goes to env's, and its handle reads from it
        assert conveyor.get_default_pool() is env.pool
        handle = wt.add.publish(2, 3)
        assert handle.pool is env.pool and handle.status() is Status.READY
        with conveyor.ConsumerPool(env.pool, 1, queues=["jobs"], task_modules=["tests.support.worker_tasks"]):
            assert handle.result(timeout=60) == 5
    assert conveyor.get_default_pool() is None  # restored on exit
    assert SparkSession.getActiveSession() is spark  # the session the block did not start stays


def test_map_without_a_pool_starts_and_stops_its_own_servers(spark: SparkSession) -> None:
    before = threading.active_count()
    out = cs.map(spark.range(5), lambda r: r["id"] * 10, schema="n long", progress=False)
    assert sorted(r["n"] for r in out.collect()) == [0, 10, 20, 30, 40]  # readable after the servers stopped
    wait_for(lambda: threading.active_count() <= before + 1, what="map's own pool closed")


def test_map_over_fewer_partitions_than_consumers_puts_rows_first(spark: SparkSession, pool: QueuePool) -> None:
    df = spark.range(100, numPartitions=1)  # one partition, two consumers: rows are put by a job of their own
    out, stats = cs.map(
        df, lambda r: r["id"] // (r["id"] % 10), schema="n long", queue_pool=pool, max_retries=0, progress=False, stats=True
    )
    rows = out.collect()
    assert sorted(r["n"] for r in rows if r["_error"] is None) == sorted(i // (i % 10) for i in range(100) if i % 10)
    assert sorted(r["_input"] for r in rows if r["_error"] is not None) == sorted(f'{{"id": {i}}}' for i in range(0, 100, 10))
    assert len(stats.consumers) == 2 and stats.enqueue_s > 0
    assert stats.rows == 100 and stats.failed == 10  # counted as the consumers read the results back
