"""Queue stores: one bytes-level interface (`Store`), a transient and a durable implementation."""

from __future__ import annotations

from conveyor.storage.base import Stats, Store
from conveyor.storage.durable import DurableStore
from conveyor.storage.memory import MemoryStore

__all__ = ["DurableStore", "MemoryStore", "Stats", "Store"]
