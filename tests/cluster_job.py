"""The Spark driver of tests/test_spark_cluster.py, run in its own process (one SparkContext per process).

Usage: python tests/cluster_job.py SPARK_MASTER_URL OUTPUT_JSON

Starts queue servers here, on the driver side, and runs `conveyor.spark.map` over ROWS rows on the
standalone cluster. A driver thread watches the queue servers and prints one line
`CONSUMING {json}` once both consumers (Spark tasks) have reported rows done and many rows are
left: the test kills a Spark worker then. At the end the output rows go to OUTPUT_JSON.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import conveyor.spark
from conveyor.client.pool import QueuePool
from conveyor.errors import ConveyorError
from conveyor.spark.session import get_or_create_session

ROWS = 400
PARTITIONS = 8
EXECUTORS = 2
ROW_SLEEP_S = 0.1
MAX_CONCURRENCY = 2  # per consumer: 2 consumers x 2 threads x 100 ms: ~40 rows/s, ~10 s for all rows
LEASE_S = 5.0  # rows held by the killed consumer come back after this long
# the marker: each consumer has reported rows done (reports come every 2 s, and one consumer may
# start seconds after the other) and at least this many rows are still to do
MARK_MIN_PENDING = ROWS // 4
EXECUTORS_TIMEOUT_S = 60.0
WATCH_POLL_S = 0.05
MARKER = "CONSUMING"

CONF = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": str(EXECUTORS),
    # start scheduling only once both executors are registered (Spark polls for this itself)
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.task.maxFailures": "8",
    "spark.driver.memory": "1g",
}


T0 = time.monotonic()


def note(what: str) -> None:
    """A timed line on stderr (the test shows the driver's stderr when it fails)."""
    print(f"cluster_job +{time.monotonic() - T0:.1f}s: {what}", file=sys.stderr, flush=True)


def func(row: dict[str, Any]) -> dict[str, Any]:
    time.sleep(ROW_SLEEP_S)
    return {"id": row["id"], "pid": os.getpid(), "t": time.time()}  # t: when the row was done


def wait_for_executors(spark: Any, n: int, timeout: float) -> None:
    """Poll the driver's status tracker until `n` executors (besides the driver) are registered."""
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while True:
        have = len(tracker.getExecutorInfos()) - 1  # the driver is listed too
        if have >= n:
            return
        if time.monotonic() >= deadline:
            raise ConveyorError(f"only {have} of {n} executors registered within {timeout:.0f} s")
        time.sleep(0.1)


def watch(pool: QueuePool, done: threading.Event) -> None:
    """Print the marker once, when both consumers have done rows and the map's queue is part done."""
    while not done.wait(WATCH_POLL_S):
        try:
            stats = {q: s for q, s in pool.stats().items() if q.startswith("map-")}
            consumers = {w: c for w, c in pool.workers().items() if w.startswith("spark:")}
        except ConveyorError:
            continue
        if len(stats) != 1 or len(consumers) < EXECUTORS or any(c["processed"] < 1 for c in consumers.values()):
            continue
        ((queue, st),) = stats.items()
        if st.pending >= MARK_MIN_PENDING:
            pids = sorted(int(c["pid"]) for c in consumers.values())
            info = {"queue": queue, "acked": st.acked, "pending": st.pending, "consumer_pids": pids}
            print(MARKER, json.dumps(info), flush=True)
            note(f"consumers running: {info}")
            return


def main(master: str, out_path: str) -> None:
    spark = get_or_create_session(master, app_name="conveyor-cluster-test", conf=CONF)
    note("session started")
    try:
        wait_for_executors(spark, EXECUTORS, EXECUTORS_TIMEOUT_S)
        note(f"{EXECUTORS} executors registered")
        with QueuePool.local(n_servers=2) as pool:
            note(f"queue servers at {pool.addresses}")
            df = spark.range(ROWS, numPartitions=PARTITIONS)
            done = threading.Event()
            watcher = threading.Thread(target=watch, args=(pool, done), name="marker", daemon=True)
            watcher.start()
            try:
                result, stats = conveyor.spark.map(df, func, schema="id long, pid long, t double", pool=pool,
                                                   max_concurrency=MAX_CONCURRENCY, lease_s=LEASE_S, rows_per_message=1,
                                                   progress=False, stats=True)  # fmt: skip
                note("map returned")
                rows = [r.asDict() for r in result.select("id", "pid", "t", "_error").collect()]
            finally:
                done.set()
                watcher.join()
        out = {"rows": rows, "errors": sum(r["_error"] is not None for r in rows),
               "consumers": stats.consumers}  # fmt: skip
        with open(out_path, "w") as f:
            json.dump(out, f)
        note(f"{len(rows)} rows written")
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
