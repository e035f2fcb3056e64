"""The store contract (`conveyor.testing.StoreContract`), run against every store in the tree.

Each store runs on a queue's state (`conveyor.storage.state`, its orders
`conveyor.storage.schedule`), with the argument checks of `conveyor.storage.checks` and the hooks of
`conveyor.storage.hooks`.
"""

from __future__ import annotations

from pathlib import Path

from conveyor.constants import DEFAULT_MAX_ATTEMPTS
from conveyor.storage import DurableStore, MemoryStore, Store
from conveyor.testing import StoreContract


class TestMemoryStore(StoreContract):
    def make(self, directory: Path, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Store:
        return MemoryStore("q", max_attempts=max_attempts)


class TestDurableStore(StoreContract):
    def make(self, directory: Path, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Store:
        return DurableStore(directory / "store", queue="q", fsync="never", max_attempts=max_attempts)


class TestDurableStoreBatchFsync(StoreContract):
    """The same contract with small segments and fsync per operation: rolling and syncing must not change behaviour."""

    def make(self, directory: Path, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Store:
        return DurableStore(directory / "store", queue="q", fsync="batch", segment_bytes=4096, max_attempts=max_attempts)
