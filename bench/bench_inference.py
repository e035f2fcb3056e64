"""Batch inference over a DataFrame: `conveyor.spark.map_batches` with a model class against Spark's `predict_batch_udf`.

W1 of issue 40: a scikit-learn model trained at the start on its bundled digits set predicts the
digit of 200,000 8x8 images (64 float columns, drawn from the set), local[2]. Each variant runs
on the same cached DataFrame, in the same session, once to warm up (Python workers started, the
model cached in them), then `--runs` times; the script prints the medians
of items/s (input rows over the end-to-end call: for Spark, the predictions written to the
`noop` sink; for map_batches, the call, which computes and keeps its output before it returns).

  (a) Spark's predict_batch_udf (batches of 1,024 rows; the model in its closure, cached per
      Python worker by Spark)
  (b) map_batches with a model class, its defaults (1,024 rows a batch, 8 threads per consumer)
  (c) map_batches as (b), concurrency=1 (one batch at a time per consumer: no threads contend)

Needs scikit-learn (the `bench` extra).

    python bench/bench_inference.py [--rows 200000] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchlib import progress

COLUMNS = [f"p{i}" for i in range(64)]


class Predictor:
    """The model class map_batches builds once per consumer process."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, batch: Any) -> Any:
        import pandas as pd

        return pd.DataFrame({"digit": self.model.predict(batch[COLUMNS].to_numpy())})


def train() -> tuple[Any, Any]:
    """A logistic regression fitted on the digits set, and the set's images as rows of 64 floats."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    digits = load_digits()
    model = LogisticRegression(max_iter=5000).fit(digits.data, digits.target)
    return model, digits.data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    import pandas as pd
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    import conveyor.spark as cs
    from conveyor.client.pool import QueuePool
    from conveyor.spark.session import get_or_create_session

    model, images = train()
    rng = np.random.default_rng(40)
    frame = pd.DataFrame(images[rng.integers(0, len(images), args.rows)], columns=COLUMNS)
    spark = get_or_create_session("local[2]", app_name="bench-inference")
    df = spark.createDataFrame(frame).repartition(4).cache()
    progress(f"{df.count():,} rows of {len(COLUMNS)} columns cached; model: {type(model).__name__}")
    want = model.predict(frame.to_numpy())

    def make_predict_fn() -> Callable[[Any], Any]:
        def predict(inputs: Any) -> Any:
            return model.predict(inputs)

        return predict

    spark_udf = predict_batch_udf(make_predict_fn, return_type=LongType(), batch_size=1024, input_tensor_shapes=[[64]])

    def spark_run() -> Callable[[], None]:
        df.select(spark_udf(F.array(*COLUMNS)).alias("digit")).write.format("noop").mode("overwrite").save()
        return lambda: None

    with QueuePool.local(n_servers=2) as pool:

        def conveyor_run(**options: Any) -> Callable[[], Callable[[], None]]:
            def run() -> Callable[[], None]:
                out, stats = cs.map_batches(
                    df, Predictor, schema="digit long", fn_args=(model,), queue_pool=pool, progress=False, stats=True, **options
                )

                def check() -> None:  # after the clock: the output checked against the model's own predictions
                    # instances: 0 once the Python workers hold the model from an earlier call with the same class and arguments
                    assert stats.failed == 0 and stats.rows == args.rows and stats.instances <= 2, stats
                    assert sorted(r["digit"] for r in out.select("digit").collect()) == sorted(want.tolist())
                    progress(f"  map_batches: consume {stats.consume_s:.2f} s, read back {stats.read_s:.2f} s")
                    out.unpersist()
                    pool.drop(stats.queue)

                return check

            return run

        variants: dict[str, Callable[[], Callable[[], None]]] = {
            "(a) Spark predict_batch_udf": spark_run,
            "(b) map_batches, model class, defaults": conveyor_run(),
            "(c) map_batches, model class, concurrency=1": conveyor_run(concurrency=1),
        }
        for name, variant in variants.items():  # Python workers started, the model cached in them: not measured
            variant()()
            progress(f"warm-up: {name}")
        rates: dict[str, list[float]] = {name: [] for name in variants}
        for run in range(args.runs):
            for name, variant in variants.items():
                t0 = time.perf_counter()
                check = variant()
                seconds = time.perf_counter() - t0
                check()
                rates[name].append(args.rows / seconds)
                progress(f"run {run + 1}: {name}: {seconds:.2f} s, {args.rows / seconds:,.0f} items/s")
    spark.stop()
    print(f"\nW1: {args.rows:,} digits predicted, local[2], medians of {args.runs}")
    best = statistics.median(rates["(a) Spark predict_batch_udf"])
    for name, got in rates.items():
        median = statistics.median(got)
        runs = ", ".join(f"{r:,.0f}" for r in got)
        print(f"  {name:46s} {median:>10,.0f} items/s  ({median / best:.2f}x predict_batch_udf; runs {runs})")


if __name__ == "__main__":
    main()
