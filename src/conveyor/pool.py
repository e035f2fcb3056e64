"""Deprecated: `QueuePool` moved to `conveyor.client.pool` (and is `conveyor.QueuePool`)."""

from __future__ import annotations

from conveyor.lazy import lazy_attributes

__getattr__ = lazy_attributes(__name__, {}, {"QueuePool": "conveyor.client.pool"})
