"""The Spark Connect client of tests/spark/test_spark_connect.py, run in its own process.

Usage: python tests/support/connect_job.py sc://HOST:PORT OUTPUT_JSON

A Connect session marks its process as "remote" for PySpark (an environment variable), which would
turn the classic session of the other tests into a Connect one: hence a process of its own. With
queue servers started here, it runs what Conveyor offers on Spark through the Connect session:
`conveyor.spark.map` (some rows failing), a `SparkConsumerPool` over published tasks, and a
TaskGraph, and writes what each gave to OUTPUT_JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROWS = 300
FAILING = {7, 107, 207}  # rows whose function raises every time
TASKS = 50
CSV_ROWS = 5000


def double(row: dict[str, int]) -> dict[str, int]:
    if row["id"] in FAILING:
        raise ValueError(f"row {row['id']} is bad")
    return {"y": row["x"] * 2}


def main(url: str, out: Path) -> None:
    from pyspark.sql import SparkSession

    import conveyor
    import conveyor.spark
    from conveyor import TaskGraph
    from conveyor.client.pool import QueuePool
    from conveyor.graph import Count
    from conveyor.tasks.envelope import decode_result
    from tests.support import worker_tasks

    spark = SparkSession.builder.remote(url).getOrCreate()
    result: dict[str, object] = {"session": type(spark).__module__}
    with QueuePool.local(2) as pool:
        df = spark.range(ROWS, numPartitions=4).selectExpr("id", "id + 1 as x")
        rows = conveyor.spark.map(df, double, schema="y long", queue_pool=pool, max_retries=1, progress=False).collect()
        result["map"] = [{"y": r["y"], "error": r["_error"], "input": r["_input"]} for r in rows]

        handles = worker_tasks.add.publish_many([(i, i) for i in range(TASKS)], _pool=pool)
        stats = conveyor.spark.SparkConsumerPool(
            spark, pool, 2, queues=["jobs"], task_modules=["tests.support.worker_tasks"]
        ).run()
        result["consumers"] = [s["processed"] for s in stats]
        results = {i: decode_result(r) for i, r in pool.queues.results("jobs")}
        result["tasks"] = sorted(results[h.id] for h in handles)

    # servers beside "the driver": under Connect there is none here to follow, so an address must be named
    try:
        with conveyor.cluster(spark):
            result["cluster_unnamed"] = "started"
    except conveyor.ConveyorError as e:
        result["cluster_unnamed"] = str(e)
    with conveyor.cluster(spark, host="127.0.0.1") as c:  # on this (the client's) machine, which the executors reach
        result["cluster_addresses"] = c.pool.addresses
        rows = conveyor.spark.map(
            spark.range(ROWS, numPartitions=2), lambda r: {"y": r["id"]}, schema="y long", progress=False
        ).collect()
        result["cluster_map"] = sorted(r["y"] for r in rows)

    csv = out.with_suffix(".csv")
    csv.write_text("".join(f"{i},w{i % 11}\n" for i in range(CSV_ROWS)))
    g = TaskGraph(spark)
    count = g.new_blocking_node({0: g.new_input_csv(csv, ["n", "word"], 2, name="numbers")}, Count(), 1, {0: None})
    g.run()
    result["graph_count"] = int(count.to_pandas()["count"].sum())
    count.unpersist()  # a local checkpoint under Connect: no JVM handle, the reference is dropped
    spark.stop()
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
