"""Conveyor on Apache Spark: consumers as Spark tasks, `map` and `map_batches`, `conveyor.local()`, the session.

Importing this package does not start Spark; its pieces load on first use. It needs the `spark` extra
(`pip install 'conveyor[spark]'`): without it, importing says so.
"""

from __future__ import annotations

from conveyor.extras import SPARK, require
from conveyor.lazy import lazy_attributes

require(SPARK, "conveyor.spark")

_LAZY = {
    "map": "conveyor.spark.mapping",
    "map_batches": "conveyor.spark.batches",
    "MapStats": "conveyor.spark.job",
    "SparkConsumerPool": "conveyor.spark.consumers",
    "local": "conveyor.spark.embedded",
    "cluster": "conveyor.spark.cluster",
    "preflight": "conveyor.spark.preflight",
    "get_or_create_session": "conveyor.spark.session",
    "task_resources": "conveyor.spark.resources",
}
__all__ = sorted(_LAZY)


__getattr__ = lazy_attributes(__name__, _LAZY)
