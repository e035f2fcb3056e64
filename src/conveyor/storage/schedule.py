"""The orders a queue's state keeps its ids in: FIFOs per priority, and heaps by time.

The orders a queue's state keeps its ids in: READY ids in one FIFO per priority (`Fifo`), delayed
ids and leases in heaps by time (`push_by_time`). Entries whose message moved on stay in place and
are skipped when popped (lazy deletion): the state checks each popped id's status.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

# a heap entry: (time, tie-breaker from a counter, the ids due then)
TimeHeap = list[tuple[float, int, np.ndarray]]


class Fifo:
    """An append-only array of ids with a moving head."""

    __slots__ = ("head", "ids", "tail")

    def __init__(self) -> None:
        self.ids = np.empty(256, np.int64)
        self.head = 0
        self.tail = 0

    def push(self, ids: np.ndarray) -> None:
        n = len(ids)
        if self.tail + n > len(self.ids):
            live = self.tail - self.head
            # reuse the array when dropping the consumed head makes enough room
            grown = self.ids if live + n <= len(self.ids) // 2 else np.empty(max(2 * (live + n), 256), np.int64)
            grown[:live] = self.ids[self.head : self.tail]
            self.ids, self.head, self.tail = grown, 0, live
        self.ids[self.tail : self.tail + n] = ids
        self.tail += n

    def push_front(self, ids: np.ndarray) -> None:
        """Put ids back at the head, in order (ids just popped that are not taken after all)."""
        n = len(ids)
        if n <= self.head:
            self.head -= n
            self.ids[self.head : self.head + n] = ids
        else:
            live = self.ids[self.head : self.tail]
            self.ids = np.concatenate([ids, live, np.empty(max(256, len(live)), np.int64)])
            self.head, self.tail = 0, n + len(live)

    def pop(self, n: int) -> np.ndarray:
        out = self.ids[self.head : min(self.head + n, self.tail)].copy()
        self.head += len(out)
        if self.head == self.tail:
            self.head = self.tail = 0
        return out

    def __len__(self) -> int:
        return self.tail - self.head


def push_by_time(heap: TimeHeap, seq: itertools.count[int], ids: np.ndarray, times: np.ndarray) -> None:
    """Push ids onto a time heap, one entry per distinct time (heap work per batch, not per id)."""
    if not len(ids):
        return
    order = np.argsort(times, kind="stable")
    ids, times = ids[order], times[order]
    cuts = np.flatnonzero(np.diff(times)) + 1
    for part, t in zip(np.split(ids, cuts), times[np.r_[0, cuts]].tolist(), strict=True):
        heapq.heappush(heap, (t, next(seq), part))
