"""Queue stores: one bytes-level interface (`Store`), a transient and a durable implementation."""

from __future__ import annotations

from .base import DeadLetter, Stats, Store
from .durable import DurableStore
from .memory import MemoryStore

__all__ = ["DeadLetter", "DurableStore", "MemoryStore", "Stats", "Store"]
