"""The Spark driver of tests/test_multihost.py, run in the bed's `driver` namespace (one SparkContext per process).

Usage: python tests/multihost_job.py SPARK_MASTER_URL DRIVER_IP SERVER_ADDRESSES TOKEN OUTPUT_JSON

SERVER_ADDRESSES: comma-separated tcp://ip:port of the queue servers on their own hosts. Runs
`conveyor.spark.map` over ROWS rows on the standalone cluster once EXECUTORS executors are
registered; each output row says which host did it (the IP its executor sends from: every
namespace shares the machine's hostname). The output rows go to OUTPUT_JSON.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import conveyor.spark
from conveyor.client.pool import QueuePool
from conveyor.spark.session import get_or_create_session
from tests.cluster_job import wait_for_executors

ROWS = 400
PARTITIONS = 8
EXECUTORS = 2
ROW_SLEEP_S = 0.02  # a few seconds of work in all: both consumers get rows, though one may start later
MAX_CONCURRENCY = 2
EXECUTORS_TIMEOUT_S = 90.0

T0 = time.monotonic()


def note(what: str) -> None:
    """A timed line on stderr (the test shows the driver's log when it fails)."""
    print(f"multihost_job +{time.monotonic() - T0:.1f}s: {what}", file=sys.stderr, flush=True)


def conf(driver_ip: str) -> dict[str, str]:
    """The session's settings: the driver on its host's address (not the embedded session's loopback)."""
    return {
        "spark.driver.host": driver_ip,
        "spark.driver.bindAddress": driver_ip,
        "spark.driver.memory": "512m",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": str(EXECUTORS),
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.task.maxFailures": "8",
    }


def host_ip(peer: str) -> str:
    """The address this process sends to `peer` from: its host's, in the bed (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return str(s.getsockname()[0])


def make_func(peer: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def func(row: dict[str, Any]) -> dict[str, Any]:
        time.sleep(ROW_SLEEP_S)
        return {"id": row["id"], "host": host_ip(peer)}

    return func


def main(master: str, driver_ip: str, servers: str, token: str, out_path: str) -> None:
    spark = get_or_create_session(master, app_name="conveyor-multihost-test", conf=conf(driver_ip))
    note("session started")
    try:
        wait_for_executors(spark, EXECUTORS, EXECUTORS_TIMEOUT_S)
        executors = sorted(e.host() for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos())
        note(f"executors: {executors}")
        with QueuePool.connect(servers, token=token) as pool:
            df = spark.range(ROWS, numPartitions=PARTITIONS)
            out = conveyor.spark.map(df, make_func(driver_ip), schema="id long, host string", pool=pool,
                                     max_concurrency=MAX_CONCURRENCY, progress=False)  # fmt: skip
            rows = [r.asDict() for r in out.select("id", "host", "_error").collect()]
        note(f"{len(rows)} rows")
        with open(out_path, "w") as f:
            json.dump({"rows": rows, "executors": executors}, f)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
