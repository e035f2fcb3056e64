"""Scheduling state of one queue, kept in typed columns rather than an object per message.

Ids are assigned sequentially, so per-message state lives in columns indexed by `id - base`: the
status a byte each in a `bytearray`, numbers in typed arrays (`conveyor.storage.columns`). Ids
below `low` are all finished (acked, failed or absent); the window slides past them, so memory
follows the number of live messages, not the number ever put. Below the window, the absent ids
(purged, skipped, or never stored because a crash tore their put) are kept as ranges, so that they
still read as absent rather than finished. Ready messages wait in one FIFO per priority, delayed
ones in a heap by time, deliveries in a heap by lease deadline; entries whose message moved on are
skipped when popped (lazy deletion), never searched for (those orders are in
`conveyor.storage.schedule`).

A batch of ids is any sequence of ints (an `array("q")`, a list, a `range`), a mask over it bytes
of 0 or 1 (one a message). Batches that run consecutively, the usual case, are slices of every
column; whole-column scans are bytes methods, never a Python loop per message.

This module owns the transitions and nothing else: stores persist what it decides.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate, compress
from operator import eq, ge, itemgetter
from typing import Any

from conveyor.constants import ST_ACKED, ST_DELAYED, ST_DELIVERED, ST_FAILED, ST_NONE, ST_READY
from conveyor.storage.columns import NOT, add, fill, gather, mask_and, put, table, where
from conveyor.storage.ids import extend_ranges, first_occurrences, runs, span
from conveyor.storage.schedule import Fifo, TimeHeap, push_by_time

_FINISHED = (ST_ACKED, ST_FAILED, ST_NONE)
_UNFINISHED = (ST_READY, ST_DELIVERED, ST_DELAYED)  # every other status
_IS_UNFINISHED = table(_UNFINISHED)
_IS_READY = table((ST_READY,))
_IS_DELIVERED = table((ST_DELIVERED,))
_IS_DELAYED = table((ST_DELAYED,))
_DELAYED_OR_READY = bytes(ST_DELAYED if b else ST_READY for b in range(256))  # a mask of delayed ones, as statuses
_COLUMNS = {
    "priority": "i",
    "attempts": "H",
    "max_attempts": "H",
    "until": "d",
    "deliveries": "I",  # counted at every delivery, never given back (unlike an attempt): names one
}
_MIN_CAP = 1024
_NEAR = 64  # advance_low's first look


class QueueState:
    """Per-message status, priority, attempts and deadlines, plus the ready/delay/lease orders.

    `extra` names additional per-message number columns (an `array` type code per name) and
    `objects` columns of objects (lists) that a store keeps in the same window, such as where a
    message's bytes are. Every column holds one entry per id from `base` to `next_id`.
    """

    def __init__(self, first_id: int = 1, extra: Mapping[str, str] | None = None, objects: Sequence[str] = ()) -> None:
        self.base = first_id  # id at column index 0
        self.low = first_id  # every id below is finished
        self.next_id = first_id
        self.first_id = first_id  # below it: ids this state never assigned
        self.gaps: list[tuple[int, int]] = []  # [start, end) ranges below base that hold no message
        self.finished_below_base = {ST_ACKED: 0, ST_FAILED: 0}
        self.status = bytearray()
        self.cols: dict[str, array[Any]] = {name: array(code) for name, code in {**_COLUMNS, **(extra or {})}.items()}
        self.objects: dict[str, list[Any]] = {name: [] for name in objects}
        # the columns are changed in place, never replaced: these stay theirs
        self.priority: array[int] = self.cols["priority"]
        self.attempts: array[int] = self.cols["attempts"]
        self.max_attempts: array[int] = self.cols["max_attempts"]
        self.until: array[float] = self.cols["until"]
        self.deliveries: array[int] = self.cols["deliveries"]
        self._cap = _MIN_CAP  # the window drops its finished head before it grows past this
        self._fifos: dict[int, Fifo] = {}
        self._prios: list[int] = []  # descending
        self._delays: TimeHeap = []
        self._leases: TimeHeap = []
        self._seq = itertools.count()

    # --- window ---------------------------------------------------------------------------
    def _reserve(self, n: int) -> None:
        """Make room for `n` more ids: past the window's bound, its finished head is dropped first."""
        used = self.next_id - self.base
        if used + n <= self._cap:
            return
        self.advance_low()
        drop = self.low - self.base
        live = used - drop
        if live + n > self._cap * 3 // 4:
            self._cap = max(int((live + n) * 1.5), _MIN_CAP)
        if drop:
            head = self.status[:drop]
            for st in (ST_ACKED, ST_FAILED):
                self.finished_below_base[st] += head.count(st)
            self.add_gaps(runs(head, ST_NONE, self.base))
            for col in (self.status, *self.cols.values(), *self.objects.values()):
                del col[:drop]
            self.base = self.low

    def _extend(self, n: int, status: int) -> None:
        """Add `n` ids to the window, of this status, zero in every other column."""
        self.status += bytearray((status,)) * n
        for col in self.cols.values():
            col.frombytes(bytes(n * col.itemsize))
        for objects in self.objects.values():
            objects += [None] * n
        self.next_id += n

    def advance_low(self) -> int:
        """Move `low` past finished ids; returns it."""
        end = self.next_id - self.base
        i = self.low - self.base
        status = self.status
        if i < end and status[i] not in _FINISHED:  # the usual case: the oldest message still runs
            return self.low
        step = _NEAR
        while i < end:  # in growing steps: low mostly moves a little, and each status is looked for in turn
            j = min(i + step, end)
            found = [k for k in (status.find(st, i, j) for st in _UNFINISHED) if k >= 0]
            if found:
                i = min(found)
                break
            i, step = j, step * 64
        self.low = self.base + i
        return self.low

    def inside(self, ids: Sequence[int]) -> bool:
        """Whether every one of `ids` is in the window (cheap when they run consecutively)."""
        first = span(ids)
        if first is not None:
            return first >= self.base and first + len(ids) <= self.next_id
        return min(ids, default=self.base) >= self.base and max(ids, default=0) < self.next_id

    def codes(self, ids: Sequence[int]) -> bytes:
        """The status of each of `ids`, ST_NONE for those outside the window."""
        first = span(ids)
        if first is not None and first >= self.base and first + len(ids) <= self.next_id:
            i = first - self.base
            return bytes(self.status[i : i + len(ids)])
        base, end, status = self.base, self.next_id, self.status
        return bytes([status[i - base] if base <= i < end else ST_NONE for i in ids])

    def column_of(self, name: str, ids: Sequence[int], default: Any = 0) -> list[Any]:
        """A number column's value for each of `ids`, `default` for those outside the window."""
        col = self.cols[name]
        if self.inside(ids):
            return gather(col, where(ids, self.base))
        base, end = self.base, self.next_id
        return [col[i - base] if base <= i < end else default for i in ids]

    def status_of(self, msg_id: int) -> int:
        if msg_id >= self.next_id or msg_id < self.first_id:
            return ST_NONE
        if msg_id < self.base:
            k = bisect.bisect_right(self.gaps, msg_id, key=itemgetter(0)) - 1
            if k >= 0 and self.gaps[k][0] <= msg_id < self.gaps[k][1]:
                return ST_NONE
            return ST_ACKED  # finished; the caller knows which ids failed
        return self.status[msg_id - self.base]

    def add_gaps(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Record ranges of absent ids below the window (ascending, above the ones recorded)."""
        extend_ranges(self.gaps, ranges)

    def gaps_below(self, end: int) -> list[tuple[int, int]]:
        """The ranges of absent ids below `end` (at most `low`): those below the window and those in it."""
        out = list(self.gaps)
        extend_ranges(out, runs(self.status[: end - self.base], ST_NONE, self.base))
        return out

    # --- transitions ----------------------------------------------------------------------
    def add(self, priority: array[int], not_before: array[float], max_attempts: array[int], now: float) -> range:
        """Append new READY (or DELAYED) messages; returns their ids."""
        n = len(priority)
        self._reserve(n)
        first = self.next_id
        self._extend(n, ST_READY)
        a = first - self.base
        self.priority[a:] = priority
        self.max_attempts[a:] = max_attempts
        self.until[a:] = not_before
        ids = range(first, first + n)
        delayed = self._later(not_before, now)
        if delayed is not None:
            self.status[a:] = delayed.translate(_DELAYED_OR_READY)
        self._schedule(ids, delayed, priority, not_before)
        return ids

    @staticmethod
    def _later(times: Sequence[float], now: float) -> bytes | None:
        """The mask of `times` after `now`; None when none is (the usual case, at C speed)."""
        if not times or max(times) <= now:
            return None
        return bytes(map(now.__lt__, times))

    def load(
        self,
        status: bytearray,
        priority: array[int],
        attempts: array[int],
        max_attempts: array[int],
        until: array[float],
        now: float,
        extra: Mapping[str, array[Any]] | None = None,
    ) -> None:
        """Install recovered messages as the ids from `next_id` on, one entry each (ST_NONE: absent).

        A READY one whose `until` is later than `now` is DELAYED until then; a DELIVERED one's lease
        ends at its `until`. `extra`: the store's own number columns, as long (others are zeros).
        """
        n = len(status)
        if not n:
            return
        self._reserve(n)
        first = self.next_id
        self._extend(n, ST_NONE)
        a = first - self.base
        self.status[a:] = status
        self.priority[a:] = priority
        self.attempts[a:] = attempts
        self.max_attempts[a:] = max_attempts
        self.until[a:] = until
        for name, col in (extra or {}).items():
            self.cols[name][a:] = col
        window = range(first, first + n)
        ready = status.translate(_IS_READY)
        if 0 not in ready:  # all of them (a store of pending messages): the window itself, no copies
            self._schedule_ready(window, priority, until, now)
        elif 1 in ready:
            times = array("d", compress(until, ready))
            self._schedule_ready(array("q", compress(window, ready)), array("i", compress(priority, ready)), times, now)
        delivered = status.translate(_IS_DELIVERED)
        if 0 not in delivered:
            push_by_time(self._leases, self._seq, window, until)
        elif 1 in delivered:
            push_by_time(self._leases, self._seq, array("q", compress(window, delivered)), array("d", compress(until, delivered)))

    def _schedule_ready(self, ids: Sequence[int], priority: Sequence[int], until: Sequence[float], now: float) -> None:
        """Schedule recovered READY ids: DELAYED those whose `until` is after `now`."""
        delayed = self._later(until, now)
        if delayed is not None:
            for i in compress(ids, delayed):
                self.status[i - self.base] = ST_DELAYED
        self._schedule(ids, delayed, priority, until)

    def skip_to(self, next_id: int) -> None:
        """Make sure ids below `next_id` are never assigned again."""
        if next_id <= self.next_id:
            return
        if self.next_id == self.first_id:  # none assigned yet: start later rather than grow over the gap
            self.base = self.low = self.next_id = self.first_id = next_id
        else:
            self._reserve(next_id - self.next_id)
            self._extend(next_id - self.next_id, ST_NONE)

    def _schedule(
        self,
        ids: Sequence[int],
        delayed: bytes | None,
        priority: Sequence[int],
        until: Sequence[float],
        front: bool = False,
    ) -> None:
        """Ready ids to the back of their priority's FIFO (`front`: to its head), delayed ones to the heap.

        `delayed`: the mask of those delayed, None if none is.
        """
        if delayed is not None and 1 in delayed:
            push_by_time(self._delays, self._seq, array("q", compress(ids, delayed)), list(compress(until, delayed)))
            ready = delayed.translate(NOT)
            ids, priority = array("q", compress(ids, ready)), list(compress(priority, ready))
        if not len(ids):
            return
        p0 = priority[0]
        if priority.count(p0) == len(priority):
            groups: Iterable[tuple[int, Sequence[int]]] = [(p0, ids)]
        else:
            groups = [(p, array("q", compress(ids, map(p.__eq__, priority)))) for p in set(priority)]
        for p, part in groups:
            fifo = self._fifo(p)
            if front:
                fifo.push_front(part)
            else:
                fifo.push(part)

    def _fifo(self, priority: int) -> Fifo:
        fifo = self._fifos.get(priority)
        if fifo is None:
            fifo = self._fifos[priority] = Fifo()
            self._prios = sorted(self._fifos, reverse=True)
        return fifo

    def promote(self, now: float) -> None:
        """Move delayed messages whose time has come into their ready FIFOs."""
        while self._delays and self._delays[0][0] <= now:
            _, _, ids = heapq.heappop(self._delays)
            live = self.codes(ids).translate(_IS_DELAYED)
            if 0 in live:
                ids = array("q", compress(ids, live))
            if not len(ids):
                continue
            at = where(ids, self.base)
            fill(self.status, at, ST_READY)
            self._schedule(ids, None, gather(self.priority, at), ())

    def take(
        self,
        n: int,
        lease_s: float,
        now: float,
        budget: tuple[Callable[[Sequence[int]], Sequence[int]], int] | None = None,
    ) -> tuple[Sequence[int], list[float]]:
        """Deliver up to n ready messages, highest priority first.

        Deliver up to n ready messages, highest priority first; returns their ids and their `until`
        before (for `untake`). budget: (sizes of ids, most bytes in all): stop before the messages
        taken would exceed it (the first one is taken whatever its size).
        """
        self.promote(now)
        taken: list[Sequence[int]] = []
        want, got = n, 0
        room = budget[1] if budget is not None else 0
        for p in self._prios:
            fifo = self._fifos[p]
            while want and len(fifo):
                ids: Sequence[int] = fifo.pop(want)
                ok = self.codes(ids).translate(_IS_READY)  # skip messages acked meanwhile
                if 0 in ok:
                    ids = array("q", compress(ids, ok))
                if budget is not None and len(ids):
                    used = list(accumulate(budget[0](ids)))
                    fit = max(bisect.bisect_right(used, room), 0 if got else 1)
                    if fit < len(ids):  # the budget is spent: the rest stay first in line
                        fifo.push_front(ids[fit:])
                        ids = ids[:fit]
                        want = len(ids)
                    if len(ids):
                        room -= used[len(ids) - 1]
                taken.append(ids)
                got += len(ids)
                want -= len(ids)
            if not want:
                break
        if not taken:
            return array("q"), []
        ids = taken[0] if len(taken) == 1 else array("q", itertools.chain.from_iterable(taken))
        if not len(ids):
            return ids, []
        at = where(ids, self.base)
        before = gather(self.until, at)
        fill(self.status, at, ST_DELIVERED)
        add(self.attempts, at, 1)
        add(self.deliveries, at, 1)
        deadline = now + lease_s
        fill(self.until, at, deadline)
        heapq.heappush(self._leases, (deadline, next(self._seq), ids))
        return ids, before

    def untake(self, ids: Sequence[int], until: Sequence[float]) -> None:
        """Undo the `take` that returned ids and until: READY again, the attempt not counted.

        Undo the `take` that returned ids and until (nothing else changed them since): READY again,
        at the head of their queues, the attempt not counted.
        """
        at = where(ids, self.base)
        fill(self.status, at, ST_READY)
        add(self.attempts, at, -1)
        put(self.until, at, until)
        self._schedule(ids, None, gather(self.priority, at), (), front=True)

    def relist(self, ids: Sequence[int], at: float) -> None:
        """Watch the leases of delivered ids again, from `at`.

        Watch the leases of delivered ids again, from `at` (`expired` handed them out, and they stay
        delivered: their leases ended, but they could not be settled yet).
        """
        push_by_time(self._leases, self._seq, ids, [at] * len(ids))

    def finishable(self, ids: Sequence[int]) -> bytes:
        """Mask of the ids `finish` would finish: not finished yet, first occurrences."""
        return mask_and(self.codes(ids).translate(_IS_UNFINISHED), first_occurrences(ids))

    def finish(self, ids: Sequence[int], status: int) -> bytes:
        """Mark messages ACKED, FAILED or absent (ST_NONE) where they are not finished yet; returns that mask."""
        ok = self.finishable(ids)
        self.mark(ids if 0 not in ok else array("q", compress(ids, ok)), status)
        return ok

    def mark(self, ids: Sequence[int], status: int) -> None:
        """Finish ids that `finishable` passed (distinct, in the window, not finished)."""
        fill(self.status, where(ids, self.base), status)

    def delivered(self, ids: Sequence[int]) -> bytes:
        """Mask of ids currently DELIVERED."""
        return self.codes(ids).translate(_IS_DELIVERED)

    def holds(self, ids: Sequence[int], deliveries: Sequence[int]) -> bytes:
        """Mask of ids still DELIVERED in the delivery given (its `deliveries` count then)."""
        now = self.column_of("deliveries", ids, -1)
        same = b"\x01" * len(ids) if now == list(deliveries) else bytes(map(eq, now, deliveries))
        return mask_and(self.delivered(ids), same)

    def lapse(self, ids: Sequence[int], now: float) -> None:
        """End the leases of delivered ids at `now`, so that `expired` hands them out once relisted.

        End the leases of delivered ids at `now`, so that `expired` hands them out once they are
        relisted (as a lease end that could not be settled is).
        """
        fill(self.until, where(ids, self.base), now)

    def out_of_attempts(self, ids: Sequence[int]) -> bytes:
        """Mask of delivered ids that used their last attempt."""
        at = where(ids, self.base)
        return bytes(map(ge, gather(self.attempts, at), gather(self.max_attempts, at)))

    def requeue(self, ids: Sequence[int], not_before: float, now: float, front: bool = False) -> None:
        """Return delivered messages to READY (or DELAYED until `not_before`).

        Return delivered messages to READY (or DELAYED until `not_before`): behind those waiting, or
        (`front`) ahead of them.
        """
        at = where(ids, self.base)
        fill(self.until, at, not_before)
        later = not_before > now
        fill(self.status, at, ST_DELAYED if later else ST_READY)
        delayed = b"\x01" * len(ids) if later else None
        self._schedule(ids, delayed, gather(self.priority, at), [not_before] * len(ids), front)

    def extend(self, ids: Sequence[int], lease_s: float, now: float) -> bytes:
        """Push the lease deadline of delivered messages; returns the mask of extended ids."""
        ok = self.delivered(ids)
        if 1 in ok:
            ids = ids if 0 not in ok else array("q", compress(ids, ok))
            deadline = now + lease_s
            fill(self.until, where(ids, self.base), deadline)
            heapq.heappush(self._leases, (deadline, next(self._seq), ids))
        return ok

    def expired(self, now: float) -> Sequence[int]:
        """Ids whose lease ran out by `now` (still DELIVERED), ascending; the caller requeues or fails them."""
        out: list[Sequence[int]] = []
        while self._leases and self._leases[0][0] <= now:
            _, _, ids = heapq.heappop(self._leases)
            # an extended lease has a later entry of its own: skip this one
            live = self.delivered(ids)
            if 1 in live:
                ids = ids if 0 not in live else array("q", compress(ids, live))
                until = gather(self.until, where(ids, self.base))
                if max(until) > now:
                    ids = array("q", compress(ids, map(now.__ge__, until)))
                out.append(ids)
        if not out:
            return array("q")
        if len(out) == 1 and span(out[0]) is not None:
            return out[0]
        return array("q", sorted(set(itertools.chain.from_iterable(out))))

    # --- inspection -----------------------------------------------------------------------
    def ready_left(self) -> int:
        """READY messages waiting, or a few more: one finished while ready counts until it is popped."""
        return sum(len(f) for f in self._fifos.values())

    def next_wakeup(self) -> float | None:
        """The earliest time a delayed message may become due or a lease may run out (or None).

        Entries are deleted lazily, so this may be early (a harmless spurious wake-up), never late.
        """
        times = [h[0][0] for h in (self._delays, self._leases) if h]
        return min(times) if times else None

    def counts(self, now: float) -> dict[int, int]:
        """Messages per status code; DELAYED ones that are due count as READY."""
        end = self.next_id - self.base
        out = {st: self.status.count(st, 0, end) for st in (ST_READY, ST_DELIVERED, ST_ACKED, ST_FAILED, ST_DELAYED)}
        for st, below in self.finished_below_base.items():
            out[st] += below
        if out[ST_DELAYED]:
            due = self._due_delayed(now)
            out[ST_DELAYED] -= due
            out[ST_READY] += due
        return out

    def _due_delayed(self, now: float) -> int:
        """How many DELAYED messages are due by `now` (not promoted yet).

        Every DELAYED message has one entry in the delay heap, at its `until`: only the entries due
        are looked at (a heap's entries past `now` have none due below them).
        """
        heap, due, seen = self._delays, 0, set()
        stack = [0]
        while stack:
            k = stack.pop()
            if k >= len(heap) or heap[k][0] > now:
                continue
            stack += (2 * k + 1, 2 * k + 2)
            ids = heap[k][2]
            live = self.codes(ids).translate(_IS_DELAYED)
            for i in compress(ids, live):
                if i not in seen and self.until[i - self.base] <= now:
                    seen.add(i)
                    due += 1
        return due

    def live_ids(self, statuses: Iterable[int]) -> list[int]:
        """Ids in the window (>= low) whose status is one of `statuses`."""
        a, b = self.low - self.base, self.next_id - self.base
        return list(compress(range(self.low, self.next_id), self.status[a:b].translate(table(tuple(statuses)))))
