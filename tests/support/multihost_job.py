"""The Spark driver of tests/test_multihost.py, run in the bed's `driver` namespace (one SparkContext per process).

Usage: python tests/support/multihost_job.py MASTER_URL DRIVER_IP SERVER_ADDRESSES TOKEN OUTPUT_JSON SCENARIO WORK_DIR

SERVER_ADDRESSES: comma-separated tcp://ip:port of the queue servers on their own hosts. Runs
`conveyor.spark.map` over ROWS rows on the standalone cluster once EXECUTORS executors are
registered; each output row says which host did it (the IP its executor sends from: every
namespace shares the machine's hostname) and, if it ran a second time, when (`rerun_t`: a file per
row in WORK_DIR, on the one disk every namespace shares, says it started before).

A driver thread watches the servers and prints one line `MARK {json}` at the moment the scenario
names (see `MARKS`): the test injects its fault then. For `reuse`, the job then waits for WORK_DIR/go
and reads the output again. Whatever happens ends in OUTPUT_JSON: the rows, or the error raised.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import conveyor.spark
from conveyor.client.pool import QueuePool
from conveyor.errors import ConveyorError
from conveyor.spark.session import get_or_create_session

ROWS = 400
PARTITIONS = 8
EXECUTORS = 2
MAX_CONCURRENCY = 2
EXECUTORS_TIMEOUT_S = 90.0
UNREACHABLE_S = 10.0  # the map's bound on a server out of reach, in the scenarios that lose one
START_TIMEOUT_S = 15.0  # the map's bound on getting a slot, in the scenario that never gets one
CLUSTER_PORTS = (17071, 17072)  # conveyor.cluster's servers on fixed ports (free: the hosts are namespaces of the test's)
GO_TIMEOUT_S = 60.0
POLL_S = 0.05
MARK = "MARK"
# per scenario: seconds a row takes, seconds each input partition takes to produce, and when to mark
ROW_S = {"put": 0.03, "parallelism": 0.01, "plain": 0.02, "reuse": 0.01, "driver-servers": 0.01}  # else ROW_S_FAULT
ROW_S_FAULT = 0.1  # 400 rows on 2 x 2 threads: ~10 s, for a fault to land mid-run
PRODUCE_MS = {"put": 40}  # each input row takes this long to produce (in the JVM)
MARKS = {
    "server-lost": "consuming",  # rows done and many left
    "server-back": "consuming",
    "worker-lost": "consuming",
    "put": "putting",  # rows on the queue, and no task has put all its rows yet
    "reuse": "mapped",  # map returned
}

T0 = time.monotonic()
MAP_CALLED: list[float] = []  # when conveyor.spark.map was called (wall clock)


def wait_for_executors(spark: Any, n: int, timeout: float) -> None:
    """Poll the driver's status tracker until `n` executors (besides the driver) are registered."""
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while (have := len(tracker.getExecutorInfos()) - 1) < n:  # the driver is listed too
        if time.monotonic() >= deadline:
            raise ConveyorError(f"only {have} of {n} executors registered within {timeout:.0f} s")
        time.sleep(POLL_S)


def note(what: str) -> None:
    """A timed line on stderr (the test shows the driver's log when it fails)."""
    print(f"multihost_job +{time.monotonic() - T0:.1f}s: {what}", file=sys.stderr, flush=True)


def mark(**info: Any) -> None:
    print(MARK, json.dumps({**info, "t": time.time()}), flush=True)


def conf(driver_ip: str, scenario: str) -> dict[str, str]:
    """The session's settings: the driver on its host's address (not the embedded session's loopback).

    `spark.network.timeout`: how long Spark takes to give up on an executor whose host went silent
    (120 s by default), lowered so that the `put` scenario (which needs Spark to run the lost task
    again) ends within the test's bound.
    """
    c = {
        "spark.driver.host": driver_ip,
        "spark.driver.bindAddress": driver_ip,
        "spark.driver.memory": "512m",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": str(EXECUTORS),
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.task.maxFailures": "8",
        "spark.network.timeout": "30s",
        "spark.network.timeoutInterval": "10s",  # how often it is checked (60 s by default: more than the timeout)
        "spark.executor.heartbeatInterval": "3s",
    }
    if scenario == "put":  # rows reach the putting task a few at a time, as they are produced
        c["spark.sql.execution.arrow.maxRecordsPerBatch"] = "25"
        c["spark.buffer.size"] = "1024"  # else the stream to the Python worker holds 64 KiB of rows back
    if scenario == "noslots":  # executors of 2 cores, on workers of 1: the master can place none
        c["spark.executor.cores"] = "2"
    if scenario == "gpu":  # one executor of 3 cores and 2 GPUs: only the GPU worker (tests/support/clusterbed.py) has them
        c.update({"spark.executor.cores": "3", "spark.cores.max": "3", "spark.executor.resource.gpu.amount": "2"})
    if scenario == "parallelism":  # Spark's tuning guide: 2-3 tasks per core; here only 2 slots exist
        c["spark.default.parallelism"] = "4"
    if scenario == "preflight":  # tests/support/preflight_tasks.py cannot be imported on worker1
        c["spark.executorEnv.CONVEYOR_TEST_NO_TASKS_ON"] = os.environ["CONVEYOR_TEST_NO_TASKS_ON"]
    return c


def host_ip(peer: str) -> str:
    """The address this process sends to `peer` from: its host's, in the bed (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return str(s.getsockname()[0])


def make_func(peer: str, work: str, row_s: float) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def func(row: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        try:
            os.close(os.open(os.path.join(work, f"row-{row['id']}"), os.O_CREAT | os.O_EXCL))
            rerun = None
        except FileExistsError:
            rerun = started
        time.sleep(row_s)
        return {"id": row["id"], "host": host_ip(peer), "rerun_t": rerun, "started": started}

    return func


def watch(pool: QueuePool, scenario: str, before: set[str], done: threading.Event) -> None:
    """Print the scenario's MARK once, at its moment (see MARKS); `before`: queues that are not this map's."""
    want = MARKS.get(scenario)
    while want in ("consuming", "putting") and not done.wait(POLL_S):
        try:
            stats = pool.stats()
            consumers = {w: c for w, c in pool.queues.workers().items() if w.startswith("spark:")}
        except ConveyorError as e:
            note(f"watch: {e}")
            continue
        maps = {q: s for q, s in stats.items() if q.startswith("map-") and q not in before}
        fed = sum(s.pending for q, s in stats.items() if q.startswith("conveyor-fed-") and q not in before)
        if len(maps) != 1:
            continue
        ((queue, st),) = maps.items()
        busy = len(consumers) >= EXECUTORS and all(float(c["processed"]) >= 1 for c in consumers.values())
        if want == "consuming" and busy and st.pending >= ROWS // 4:
            return mark(queue=queue, acked=st.acked, pending=st.pending)
        if want == "putting" and fed == 0 and st.acked + st.pending >= 20:
            return mark(queue=queue, acked=st.acked, pending=st.pending)


SCHEMA = "id long, host string, rerun_t double, started double"


def first_row_s(rows: list[dict[str, Any]], called: float) -> float:
    return min(r["started"] for r in rows) - called


def warm_up(batches: Any) -> Any:
    import conveyor.spark.consumers  # what a consumer task imports
    import conveyor.spark.rows  # noqa: F401

    return batches


def beside_the_driver(spark: Any, driver_ip: str, work: str) -> dict[str, Any]:
    """map and SparkConsumerPool with no pool, on queue servers beside the driver (TLS, a token).

    Then the same map with servers started beforehand (conveyor.cluster), for the time to the first
    row.
    """
    from conveyor.spark.consumers import SparkConsumerPool

    logging.getLogger("conveyor.spark").setLevel(logging.INFO)  # the servers' start and the pre-flight, timed
    df = spark.range(ROWS, numPartitions=PARTITIONS)
    func = make_func(driver_ip, work, ROW_S["driver-servers"])
    opts: dict[str, Any] = {"schema": SCHEMA, "concurrency": MAX_CONCURRENCY, "rows_per_message": 1, "progress": False}
    # both maps below find the executors' Python workers started, conveyor imported (a first map pays for that
    # with servers or without): what differs is the servers' start and the pre-flight
    spark.range(EXECUTORS * 4, numPartitions=EXECUTORS * 4).mapInArrow(warm_up, "id long").collect()
    note("executors' Python workers started")
    called = time.time()
    rows = [r.asDict() for r in conveyor.spark.map(df, func, **opts).collect()]
    result: dict[str, Any] = {"rows": rows, "first_row_s": first_row_s(rows, called)}
    note(f"map with no pool: first row {result['first_row_s']:.2f} s after the call")
    for f in os.listdir(work):  # each row's marker again: the next maps run the same ids
        os.remove(os.path.join(work, f))
    with conveyor.cluster(spark, ports=CLUSTER_PORTS) as c:
        result["cluster_addresses"] = c.pool.addresses
        called = time.time()
        again = [r.asDict() for r in conveyor.spark.map(df, func, queue_pool=c.pool, **opts).collect()]
        result["first_row_started_s"] = first_row_s(again, called)
        result["rows_started"] = again
    note(f"map with servers started before: first row {result['first_row_started_s']:.2f} s after the call")
    with SparkConsumerPool(spark, concurrency=MAX_CONCURRENCY) as consumers:
        result["consumer_addresses"] = consumers.pool.addresses
        handles = [consumers.pool.submit(pow, i, 2) for i in range(ROWS)]
        consumers.run()
        result["squares"] = consumers.pool.gather(handles, timeout=60)
    return result


def on_gpus(driver_ip: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def func(row: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.02)
        given = conveyor.spark.task_resources()
        return {
            "id": row["id"],
            "host": host_ip(driver_ip),
            "gpus": ",".join(given.get("gpu", ())),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pid": os.getpid(),
            "parent": os.getppid(),
        }

    return func


def gpus(spark: Any, pool: QueuePool, driver_ip: str) -> dict[str, Any]:
    """map with resources={"gpu": 1}, in thread and in process mode: where each row ran, and the GPU it saw."""
    df = spark.range(ROWS, numPartitions=PARTITIONS)
    result: dict[str, Any] = {}
    for mode in ("thread", "process"):
        out, stats = conveyor.spark.map(
            df,
            on_gpus(driver_ip),
            schema="id long, host string, gpus string, cuda string, pid long, parent long",
            queue_pool=pool,
            resources={"gpu": 1},
            pool=mode,
            concurrency=2,
            rows_per_message=1,
            progress=False,
            stats=True,
        )
        result[mode] = {"rows": [r.asDict() for r in out.collect()], "consumers": len(stats.consumers)}
        pool.drop(stats.queue)
    return result


def run(spark: Any, pool: QueuePool, driver_ip: str, scenario: str, work: str) -> dict[str, Any]:
    if scenario == "driver-servers":
        return beside_the_driver(spark, driver_ip, work)
    if scenario == "gpu":
        return gpus(spark, pool, driver_ip)
    df = spark.range(ROWS, numPartitions=PARTITIONS)
    if scenario in PRODUCE_MS:  # a slow upstream stage (in the JVM: chained Python stages would run in turn)
        df = df.selectExpr("id", f"reflect('java.lang.Thread', 'sleep', cast({PRODUCE_MS[scenario]} as bigint)) as slow")
    func = make_func(driver_ip, work, ROW_S.get(scenario, ROW_S_FAULT))
    if scenario == "preflight":
        from tests.support import preflight_tasks

        func = preflight_tasks.double
    done = threading.Event()
    watcher = threading.Thread(target=watch, args=(pool, scenario, set(pool.stats()), done), name="mark", daemon=True)
    watcher.start()
    unreachable = UNREACHABLE_S if scenario == "server-lost" else 30.0
    start_timeout = START_TIMEOUT_S if scenario == "noslots" else 120.0
    MAP_CALLED.append(time.time())
    try:
        out, stats = conveyor.spark.map(
            df,
            func,
            schema=SCHEMA,
            queue_pool=pool,
            concurrency=MAX_CONCURRENCY,
            rows_per_message=1,
            progress=False,
            unreachable_s=unreachable,
            start_timeout_s=start_timeout,
            stats=True,
        )
    finally:
        done.set()
        watcher.join()
    ended = time.time()
    rows = [r.asDict() for r in out.select("id", "host", "rerun_t", "_error").collect()]
    result: dict[str, Any] = {"rows": rows, "ended": ended, "consumers": len(stats.consumers), "queue": stats.queue}
    if scenario == "reuse":
        tracker = spark.sparkContext._jsc.sc().statusTracker()
        executors = {(e.host(), e.port()) for e in tracker.getExecutorInfos()}
        mark(queue=stats.queue)
        go = Path(work) / "go"
        deadline = time.monotonic() + GO_TIMEOUT_S
        while not go.exists():
            if time.monotonic() > deadline:
                raise ConveyorError(f"no {go} within {GO_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)
        while executors <= {(e.host(), e.port()) for e in tracker.getExecutorInfos()}:  # the loss is known
            if time.monotonic() > deadline:
                raise ConveyorError(f"the driver still lists every executor {GO_TIMEOUT_S:.0f} s after the kill")
            time.sleep(POLL_S)
        note("the output again, after the executor was lost")
        t = time.monotonic()
        result["again"] = [r.asDict() for r in out.select("id", "host", "rerun_t", "_error").collect()]
        result["again_s"] = time.monotonic() - t
    out.unpersist()
    pool.drop(stats.queue)  # the output is read (again, too): its results can go
    return result


def main(master: str, driver_ip: str, servers: str, token: str, out_path: str, scenario: str, work: str) -> None:
    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s [+%(relativeCreated).0f ms]", stream=sys.stdout
    )
    spark = get_or_create_session(master, app_name=f"conveyor-multihost-{scenario}", conf=conf(driver_ip, scenario))
    note("session started")
    try:
        if scenario != "noslots":
            wait_for_executors(spark, 1 if scenario == "gpu" else EXECUTORS, EXECUTORS_TIMEOUT_S)
        executors = sorted(e.host() for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos())
        note(f"executors: {executors}")
        with QueuePool.connect(servers, token=token, connect_timeout=2.0) as pool:
            try:
                result = run(spark, pool, driver_ip, scenario, work)
            except ConveyorError as e:
                note(f"map failed: {type(e).__name__}: {e}")
                result = {
                    "error": str(e),
                    "error_type": type(e).__name__,
                    "ended": time.time(),
                    "notes": list(getattr(e, "__notes__", [])),
                    "problems": getattr(e, "problems", None),
                }
        result["executors"], result["map_called"] = executors, MAP_CALLED[0] if MAP_CALLED else None
        with open(out_path, "w") as f:
            json.dump(result, f)
        note("result written")
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:8])
