"""Conveyor on Apache Spark: consumers as Spark tasks, `map` over DataFrames, and the TaskGraph runtime.

Importing this package does not start Spark; its pieces load on first use.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "map": "conveyor.spark.mapping",
    "MapStats": "conveyor.spark.mapping",
    "SparkConsumerPool": "conveyor.spark.consumers",
    "local": "conveyor.spark.embedded",
    "get_or_create_session": "conveyor.spark.session",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'conveyor.spark' has no attribute {name!r}")
