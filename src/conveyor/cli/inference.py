"""The demo's scene e: batch inference with a real model, by `map_batches` and by Spark's own batch UDF.

A scikit-learn classifier is trained on its bundled 8x8 digits; the images, repeated and jittered
to the scene's size, are predicted by `conveyor.spark.map_batches` with a model class (built once
per consumer process) and by `pyspark.ml.functions.predict_batch_udf` (the model in its closure),
on the same cached DataFrame. Each run is timed to its rows collected; the predictions are matched
row by row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from conveyor.client.pool import QueuePool
from conveyor.spark import batches

PIXELS = [f"p{i}" for i in range(64)]
INPUT_PARTITIONS = 4
JITTER = 0.5  # noise added to each pixel (of 0-16) so that the repeated images are not all the same


@dataclass(frozen=True)
class Throughput:
    """One system's run of the inference scene, measured."""

    system: str
    rows: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Inference:
    """How scene e went: both runs, the model's builds and the rows whose predictions differ."""

    images: int
    consumers: int
    model: str
    conveyor: Throughput
    plain: Throughput
    built: int  # model instances the timed map's consumers built (MapStats.instances; 0: kept from the warm-up)
    warm_built: int  # and the warm-up's
    failed: int  # rows the map reported failed
    mismatches: int  # rows whose prediction differs from plain Spark's, or that one run lacks


@dataclass(frozen=True)
class MapRun:
    """One run of the images through `map_batches`: timed, its predictions, its model builds and failures."""

    throughput: Throughput
    predictions: dict[int, int]  # image id -> digit
    built: int  # model instances the consumers built (MapStats.instances)
    failed: int  # rows the map reported failed


class DigitModel:
    """The model class `map_batches` builds once per consumer process: it loads the trained model."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, batch: Any) -> Any:
        import pandas as pd

        return pd.DataFrame({"id": batch["id"], "digit": self.model.predict(batch[PIXELS].to_numpy())})


def train() -> Any:
    """A logistic regression fitted on the bundled digits (about a second)."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    digits = load_digits()
    return LogisticRegression(max_iter=2000).fit(digits.data, digits.target)


def images(spark: Any, n: int) -> Any:
    """`n` digits (the bundled ones repeated, jittered) as a cached DataFrame: an id and 64 pixels."""
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_digits

    data = load_digits().data
    rng = np.random.default_rng(40)
    pixels = data[np.arange(n) % len(data)] + rng.uniform(-JITTER, JITTER, (n, 64))
    frame = pd.DataFrame(pixels, columns=PIXELS)
    frame.insert(0, "id", np.arange(n, dtype="int64"))
    df = spark.createDataFrame(frame).repartition(INPUT_PARTITIONS).cache()
    df.count()  # built before either timing
    return df


def run_map(df: Any, model: Any, pool: QueuePool, consumers: int, progress: bool) -> MapRun:
    """The images through `map_batches` with `DigitModel`; with the predictions, the builds and failures."""
    t0 = time.perf_counter()
    out, st = batches.map_batches(
        df,
        DigitModel,
        schema="id long, digit long",
        fn_args=(model,),
        queue_pool=pool,
        n_consumers=consumers,
        progress=progress,
        stats=True,
    )
    rows = out.select("id", "digit").collect()
    seconds = time.perf_counter() - t0
    out.unpersist()
    pool.drop(st.queue)
    got = {r[0]: r[1] for r in rows if r[0] is not None}
    return MapRun(Throughput("conveyor.spark.map_batches", len(got), seconds), got, st.instances, st.failed)


def run_plain(df: Any, model: Any) -> tuple[Throughput, dict[int, int]]:
    """The images through Spark's `predict_batch_udf`, the model in its closure."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    def make_predict() -> Any:
        return model.predict

    udf = predict_batch_udf(make_predict, return_type=LongType(), batch_size=1024, input_tensor_shapes=[[64]])
    t0 = time.perf_counter()
    rows = df.select("id", udf(F.array(*PIXELS)).alias("digit")).collect()
    seconds = time.perf_counter() - t0
    got = {r[0]: r[1] for r in rows}
    return Throughput("plain Spark predict_batch_udf", len(got), seconds), got


def run_inference(spark: Any, pool: QueuePool, n: int, consumers: int, progress: bool, warm_up: int) -> Inference:
    """Train the model, warm both ways up on `warm_up` images, then time both on `n`."""
    model = train()
    warm = images(spark, warm_up)
    warm_built = run_map(warm, model, pool, consumers, False).built
    run_plain(warm, model)
    warm.unpersist()
    df = images(spark, n)
    mine = run_map(df, model, pool, consumers, progress)
    theirs, want = run_plain(df, model)
    df.unpersist()
    got = mine.predictions
    mismatches = sum(1 for i in range(n) if i not in got or got[i] != want.get(i))
    return Inference(n, consumers, type(model).__name__, mine.throughput, theirs, mine.built, warm_built, mine.failed, mismatches)
