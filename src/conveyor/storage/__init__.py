"""Queue stores: one bytes-level interface (`Store`), a transient and a durable implementation.

Modules:
- `base`: `Store`, the operations that change a queue; `inspection`: the read-only ones and `Stats`;
  `hooks`: what an implementation fills in; `checks`: the checks of what callers pass.
- `state`: `QueueState`, a queue's scheduling state in typed columns; `schedule`: its ready FIFOs and
  time heaps; `ids`: helpers over batches of ids; `columns`: what a batch reads from the columns and
  writes to them, and records of a fixed layout read and written a field at a time.
- `memory`: `MemoryStore`. `durable`: `DurableStore`, on top of `segments` (the record log; verified
  on opening by `segment_scan`), `bodies` (what its records hold), `wal` (the index), `recovery`
  (opening), `losses` (what the index confirms and the segments lack), `compaction`, `reservation`
  (ids reserved across crashes), `space` (a disk's reserve)
  and `files` (file operations, shared with the server).
"""

from __future__ import annotations

from conveyor.storage.base import Store
from conveyor.storage.durable import DurableStore
from conveyor.storage.inspection import Stats
from conveyor.storage.memory import MemoryStore

__all__ = ["DurableStore", "MemoryStore", "Stats", "Store"]
