"""Deprecated: the TaskGraph executors moved to `conveyor.graph` (the graph is independent of the queue)."""

from __future__ import annotations

from conveyor.lazy import lazy_attributes

_MOVED = ("Count", "Executor", "FilterProject", "HashAggregate", "HashJoin", "Limit", "Map", "Sort")
__getattr__ = lazy_attributes(__name__, {}, dict.fromkeys(_MOVED, "conveyor.graph"))
