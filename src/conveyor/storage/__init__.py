"""Queue stores: one bytes-level interface (`Store`), a transient and a durable implementation."""

from __future__ import annotations

from conveyor.storage.base import DeadLetter, Stats, Store
from conveyor.storage.durable import DurableStore
from conveyor.storage.memory import MemoryStore

__all__ = ["DeadLetter", "DurableStore", "MemoryStore", "Stats", "Store"]
