"""The orders a queue's state keeps its ids in: FIFOs per priority, and heaps by time.

The orders a queue's state keeps its ids in: READY ids in one FIFO per priority (`Fifo`), delayed
ids and leases in heaps by time (`push_by_time`). Entries whose message moved on stay in place and
are skipped when popped (lazy deletion): the state checks each popped id's status.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections import deque
from collections.abc import Sequence
from operator import eq

from conveyor.storage.columns import NOT

# a heap entry: (time, tie-breaker from a counter, the ids due then)
TimeHeap = list[tuple[float, int, Sequence[int]]]


class Fifo:
    """Ids in order, kept in chunks: a range for ids that run consecutively (put together), else an array.

    A put's ids stay one range however many they are, and a pop of them is a range too, so that the
    state reads and writes the messages taken as slices of its columns.
    """

    __slots__ = ("chunks", "head", "size")

    def __init__(self) -> None:
        self.chunks: deque[Sequence[int]] = deque()
        self.head = 0  # ids of the first chunk already popped
        self.size = 0

    def push(self, ids: Sequence[int]) -> None:
        if not len(ids):
            return
        self.size += len(ids)
        last = self.chunks[-1] if len(self.chunks) > 1 else None  # not the first: it may be popped from
        if type(ids) is range:
            if type(last) is range and last.stop == ids.start:
                self.chunks[-1] = range(last.start, ids.stop)
            else:
                self.chunks.append(ids)
        elif isinstance(last, array):  # the fifo's own: ids pushed one batch after another
            last.extend(ids if isinstance(ids, array) and ids.typecode == "q" else array("q", ids))
        else:
            self.chunks.append(array("q", ids))

    def push_front(self, ids: Sequence[int]) -> None:
        """Put ids back at the head, in order (ids just popped that are not taken after all)."""
        if not len(ids):
            return
        if self.head:
            self.chunks[0] = self.chunks[0][self.head :]
            self.head = 0
        self.chunks.appendleft(ids if type(ids) is range else array("q", ids))
        self.size += len(ids)

    def pop(self, n: int) -> Sequence[int]:
        """The first `n` ids (or all there are), in order: a range when they run consecutively."""
        parts: list[Sequence[int]] = []
        while n and self.chunks:
            first = self.chunks[0]
            part = first[self.head : self.head + n]
            parts.append(part)
            n -= len(part)
            self.size -= len(part)
            self.head += len(part)
            if self.head == len(first):
                self.chunks.popleft()
                self.head = 0
        if len(parts) == 1:
            return parts[0]
        if all(type(p) is range for p in parts) and all(a[-1] + 1 == b[0] for a, b in itertools.pairwise(parts)):
            return range(parts[0][0], parts[-1][-1] + 1)
        return array("q", itertools.chain.from_iterable(parts))

    def __len__(self) -> int:
        return self.size


def push_by_time(heap: TimeHeap, seq: itertools.count[int], ids: Sequence[int], times: Sequence[float]) -> None:
    """Push ids onto a time heap, an entry per run of ids due at the same time (heap work per batch, not per id)."""
    n = len(ids)
    if not n:
        return
    if times.count(times[0]) == n:  # the usual case: a batch's deadline
        heapq.heappush(heap, (times[0], next(seq), ids))
        return
    same = bytes(map(eq, itertools.islice(times, 1, None), times))  # 1 where the next id is due at the same time
    if same.count(0) * 8 < n:  # runs, as a recovery finds batches delivered together
        cuts = [0, *(k + 1 for k in itertools.compress(range(n - 1), same.translate(NOT))), n]
        for a, b in itertools.pairwise(cuts):
            heapq.heappush(heap, (times[a], next(seq), ids[a:b]))
        return
    order = sorted(range(n), key=times.__getitem__)
    for t, group in itertools.groupby(order, key=times.__getitem__):
        heapq.heappush(heap, (t, next(seq), array("q", [ids[k] for k in group])))
