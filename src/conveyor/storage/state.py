"""Scheduling state of one queue, kept in numpy columns rather than an object per message.

Ids are assigned sequentially, so per-message state lives in arrays indexed by `id - base`.
Ids below `low` are all finished (acked, failed or absent); the window slides past them, so
memory follows the number of live messages, not the number ever put. Below the window, the
absent ids (purged, skipped, or never stored because a crash tore their put) are kept as ranges,
so that they still read as absent rather than finished. Ready messages wait in
one FIFO per priority, delayed ones in a heap by time, deliveries in a heap by lease deadline;
entries whose message moved on are skipped when popped (lazy deletion), never searched for
(those orders are in `conveyor.storage.schedule`).

This module owns the transitions and nothing else: stores persist what it decides.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import cast

import numpy as np

from conveyor.constants import ST_ACKED, ST_DELAYED, ST_DELIVERED, ST_FAILED, ST_NONE, ST_READY
from conveyor.storage.ids import extend_ranges, first_occurrences, runs
from conveyor.storage.schedule import Fifo, TimeHeap, push_by_time

_FINISHED = (ST_ACKED, ST_FAILED, ST_NONE)
_SCAN = 4096
_NEAR = 64  # advance_low's first look: low mostly moves a little


class QueueState:
    """Per-message status, priority, attempts and deadlines, plus the ready/delay/lease orders.

    `extra` names additional per-message columns (dtype per name) that a store keeps in the
    same window, such as where a message's bytes are.
    """

    def __init__(self, first_id: int = 1, extra: dict[str, object] | None = None) -> None:
        self.base = first_id  # id at array index 0
        self.low = first_id  # every id below is finished
        self.next_id = first_id
        self.first_id = first_id  # below it: ids this state never assigned
        self.gaps: list[tuple[int, int]] = []  # [start, end) ranges below base that hold no message
        self.finished_below_base = {ST_ACKED: 0, ST_FAILED: 0}
        dtypes: dict[str, object] = {
            "status": np.uint8,
            "priority": np.int32,
            "attempts": np.uint16,
            "max_attempts": np.uint16,
            "until": np.float64,
            "deliveries": np.uint32,  # counted at every delivery, never given back (unlike an attempt): names one
        }
        dtypes.update(extra or {})
        self.cols = {name: np.zeros(1024, dt) for name, dt in dtypes.items()}
        self.status = self.cols["status"]
        self._fifos: dict[int, Fifo] = {}
        self._prios: list[int] = []  # descending
        self._delays: TimeHeap = []
        self._leases: TimeHeap = []
        self._seq = itertools.count()

    # --- window ---------------------------------------------------------------------------
    def _reserve(self, n: int) -> None:
        cap = len(self.status)
        used = self.next_id - self.base
        if used + n <= cap:
            return
        self.advance_low()
        drop = self.low - self.base
        live = used - drop
        new_cap = cap if live + n <= cap * 3 // 4 else max(int((live + n) * 1.5), 1024)
        if drop:
            head = self.status[:drop]
            for st in (ST_ACKED, ST_FAILED):
                self.finished_below_base[st] += int(np.count_nonzero(head == st))
            self.add_gaps(runs(head == ST_NONE, self.base))
        for name, col in self.cols.items():
            grown = col if new_cap == cap else np.zeros(new_cap, col.dtype)
            grown[:live] = col[drop:used]
            if grown is col:
                grown[live:] = 0
            self.cols[name] = grown
        self.status = self.cols["status"]
        self.base = self.low

    def advance_low(self) -> int:
        """Move `low` past finished ids; returns it."""
        end = self.next_id - self.base
        i = self.low - self.base
        status = self.status
        if i < end and status.item(i) not in _FINISHED:  # the usual case: the oldest message still runs
            return self.low
        step = _NEAR
        while i < end:
            chunk = status[i : min(i + step, end)]
            unfinished = np.flatnonzero((chunk != ST_ACKED) & (chunk != ST_FAILED) & (chunk != ST_NONE))
            if len(unfinished):
                i += int(unfinished[0])
                break
            i += len(chunk)
            step = _SCAN
        self.low = self.base + i
        return self.low

    def index(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map ids to array indices; returns (indices, mask of ids inside the window)."""
        idx = ids - self.base
        inside = (ids >= self.base) & (ids < self.next_id)
        return np.where(inside, idx, 0), inside

    def status_of(self, msg_id: int) -> int:
        if msg_id >= self.next_id or msg_id < self.first_id:
            return ST_NONE
        if msg_id < self.base:
            k = bisect.bisect_right(self.gaps, (msg_id, np.iinfo(np.int64).max)) - 1
            if k >= 0 and self.gaps[k][0] <= msg_id < self.gaps[k][1]:
                return ST_NONE
            return ST_ACKED  # finished; the caller knows which ids failed
        return int(self.status[msg_id - self.base])

    def add_gaps(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Record ranges of absent ids below the window (ascending, above the ones recorded)."""
        extend_ranges(self.gaps, ranges)

    def gaps_below(self, end: int) -> list[tuple[int, int]]:
        """The ranges of absent ids below `end` (at most `low`): those below the window and those in it."""
        out = list(self.gaps)
        extend_ranges(out, runs(self.status[: end - self.base] == ST_NONE, self.base))
        return out

    # --- transitions ----------------------------------------------------------------------
    def add(self, priority: np.ndarray, not_before: np.ndarray, max_attempts: np.ndarray, now: float) -> np.ndarray:
        """Append new READY (or DELAYED) messages; returns their ids."""
        n = len(priority)
        self._reserve(n)
        first = self.next_id
        a, b = first - self.base, first - self.base + n
        self.next_id += n
        ids = np.arange(first, first + n, dtype=np.int64)
        c = self.cols
        c["priority"][a:b] = priority
        c["max_attempts"][a:b] = max_attempts
        c["attempts"][a:b] = 0
        c["until"][a:b] = not_before
        delayed = not_before > now
        self.status[a:b] = np.where(delayed, ST_DELAYED, ST_READY)
        self._schedule(ids, delayed, priority, not_before)
        return ids

    def load(
        self,
        ids: np.ndarray,
        status: np.ndarray,
        priority: np.ndarray,
        attempts: np.ndarray,
        max_attempts: np.ndarray,
        until: np.ndarray,
        now: float,
    ) -> np.ndarray:
        """Install recovered messages (ids ascending, >= next_id); ids not given stay absent.

        Returns the array indices of the loaded ids, for the caller's extra columns.
        """
        if not len(ids):
            return np.empty(0, np.int64)
        top = int(ids[-1]) + 1
        self._reserve(top - self.next_id)
        self.status[self.next_id - self.base : top - self.base] = ST_NONE
        self.next_id = top
        idx = ids - self.base
        c = self.cols
        c["priority"][idx] = priority
        c["attempts"][idx] = attempts
        c["max_attempts"][idx] = max_attempts
        c["until"][idx] = until
        ready = status == ST_READY
        delayed = ready & (until > now)
        status = np.where(delayed, ST_DELAYED, status)
        self.status[idx] = status
        self._schedule(ids[ready], delayed[ready], priority[ready], until[ready])
        delivered = status == ST_DELIVERED
        push_by_time(self._leases, self._seq, ids[delivered], until[delivered])
        return idx

    def skip_to(self, next_id: int) -> None:
        """Make sure ids below `next_id` are never assigned again."""
        if next_id <= self.next_id:
            return
        if self.next_id == self.first_id:  # none assigned yet: start later rather than grow over the gap
            self.base = self.low = self.next_id = self.first_id = next_id
        else:
            self._reserve(next_id - self.next_id)
            self.status[self.next_id - self.base : next_id - self.base] = ST_NONE
            self.next_id = next_id

    def _schedule(
        self, ids: np.ndarray, delayed: np.ndarray, priority: np.ndarray, until: np.ndarray, front: bool = False
    ) -> None:
        """Ready ids to the back of their priority's FIFO (`front`: to its head), delayed ones to the heap."""
        if delayed.any():
            push_by_time(self._delays, self._seq, ids[delayed], until[delayed])
            ids, priority = ids[~delayed], priority[~delayed]
        if not len(ids):
            return
        same = (priority == priority[0]).all()
        groups = [(priority[0], ids)] if same else [(p, ids[priority == p]) for p in np.unique(priority)]
        for p, part in groups:
            fifo = self._fifo(int(p))
            fifo.push_front(part) if front else fifo.push(part)

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
            idx, inside = self.index(ids)
            live = inside & (self.status[idx] == ST_DELAYED)
            ids, idx = ids[live], idx[live]
            self.status[idx] = ST_READY
            self._schedule(ids, np.zeros(len(ids), bool), self.cols["priority"][idx], self.cols["until"][idx])

    def take(
        self, n: int, lease_s: float, now: float, budget: tuple[Callable[[np.ndarray], np.ndarray], int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Deliver up to n ready messages, highest priority first.

        Deliver up to n ready messages, highest priority first; returns their ids and their `until`
        before (for `untake`). budget: (sizes of ids, most bytes in all): stop before the messages
        taken would exceed it (the first one is taken whatever its size).
        """
        self.promote(now)
        taken: list[np.ndarray] = []
        want, got = n, 0
        room = budget[1] if budget is not None else 0
        for p in self._prios:
            fifo = self._fifos[p]
            while want and len(fifo):
                ids = fifo.pop(want)
                idx, inside = self.index(ids)
                ok = inside & (self.status[idx] == ST_READY)  # skip messages acked meanwhile
                if not ok.all():
                    ids = ids[ok]
                if budget is not None and len(ids):
                    used = np.cumsum(budget[0](ids))
                    fit = max(int(np.searchsorted(used, room, side="right")), 0 if got else 1)
                    if fit < len(ids):  # the budget is spent: the rest stay first in line
                        fifo.push_front(ids[fit:])
                        ids = ids[:fit]
                        want = len(ids)
                    if len(ids):
                        room -= int(used[len(ids) - 1])
                taken.append(ids)
                got += len(ids)
                want -= len(ids)
            if not want:
                break
        if not taken:
            return np.empty(0, np.int64), np.empty(0, np.float64)
        ids = np.concatenate(taken) if len(taken) > 1 else taken[0]
        if not len(ids):
            return ids, np.empty(0, np.float64)
        idx = ids - self.base
        before = self.cols["until"][idx]
        self.status[idx] = ST_DELIVERED
        self.cols["attempts"][idx] += 1
        self.cols["deliveries"][idx] += 1
        deadline = now + lease_s
        self.cols["until"][idx] = deadline
        heapq.heappush(self._leases, (deadline, next(self._seq), ids))
        return ids, before

    def untake(self, ids: np.ndarray, until: np.ndarray) -> None:
        """Undo the `take` that returned ids and until: READY again, the attempt not counted.

        Undo the `take` that returned ids and until (nothing else changed them since): READY again,
        at the head of their queues, the attempt not counted.
        """
        idx = ids - self.base
        self.status[idx] = ST_READY
        self.cols["attempts"][idx] -= 1
        self.cols["until"][idx] = until
        prio = self.cols["priority"][idx]
        for p in np.unique(prio):
            self._fifo(int(p)).push_front(ids[prio == p])

    def relist(self, ids: np.ndarray, at: float) -> None:
        """Watch the leases of delivered ids again, from `at`.

        Watch the leases of delivered ids again, from `at` (`expired` handed them out, and they stay
        delivered: their leases ended, but they could not be settled yet).
        """
        push_by_time(self._leases, self._seq, ids, np.full(len(ids), at))

    def finishable(self, ids: np.ndarray) -> np.ndarray:
        """Mask of the ids `finish` would finish: not finished yet, first occurrences."""
        idx, inside = self.index(ids)
        st = self.status[idx]
        return cast(np.ndarray, inside & (st != ST_ACKED) & (st != ST_FAILED) & (st != ST_NONE) & first_occurrences(ids))

    def finish(self, ids: np.ndarray, status: int) -> np.ndarray:
        """Mark messages ACKED, FAILED or absent (ST_NONE) where they are not finished yet; returns that mask."""
        ok = self.finishable(ids)
        self.mark(ids[ok], status)
        return ok

    def mark(self, ids: np.ndarray, status: int) -> None:
        """Finish ids that `finishable` passed (distinct, in the window, not finished)."""
        self.status[ids - self.base] = status

    def delivered(self, ids: np.ndarray) -> np.ndarray:
        """Mask of ids currently DELIVERED."""
        idx, inside = self.index(ids)
        return cast(np.ndarray, inside & (self.status[idx] == ST_DELIVERED))

    def holds(self, ids: np.ndarray, deliveries: np.ndarray) -> np.ndarray:
        """Mask of ids still DELIVERED in the delivery given (its `deliveries` count then)."""
        idx, inside = self.index(ids)
        return cast(np.ndarray, inside & (self.status[idx] == ST_DELIVERED) & (self.cols["deliveries"][idx] == deliveries))

    def lapse(self, ids: np.ndarray, now: float) -> None:
        """End the leases of delivered ids at `now`, so that `expired` hands them out once relisted.

        End the leases of delivered ids at `now`, so that `expired` hands them out once they are
        relisted (as a lease end that could not be settled is).
        """
        self.cols["until"][ids - self.base] = now

    def out_of_attempts(self, ids: np.ndarray) -> np.ndarray:
        idx = ids - self.base
        return cast(np.ndarray, self.cols["attempts"][idx] >= self.cols["max_attempts"][idx])

    def requeue(self, ids: np.ndarray, not_before: np.ndarray, now: float, front: bool = False) -> None:
        """Return delivered messages to READY (or DELAYED until `not_before`).

        Return delivered messages to READY (or DELAYED until `not_before`): behind those waiting, or
        (`front`) ahead of them.
        """
        idx = ids - self.base
        self.cols["until"][idx] = not_before
        delayed = not_before > now
        self.status[idx] = np.where(delayed, ST_DELAYED, ST_READY)
        self._schedule(ids, delayed, self.cols["priority"][idx], not_before, front)

    def extend(self, ids: np.ndarray, lease_s: float, now: float) -> np.ndarray:
        """Push the lease deadline of delivered messages; returns the mask of extended ids."""
        ok = self.delivered(ids)
        if ok.any():
            ids = ids[ok]
            deadline = now + lease_s
            self.cols["until"][ids - self.base] = deadline
            heapq.heappush(self._leases, (deadline, next(self._seq), ids))
        return ok

    def expired(self, now: float) -> np.ndarray:
        """Ids whose lease ran out by `now` (still DELIVERED); the caller requeues or fails them."""
        out: list[np.ndarray] = []
        while self._leases and self._leases[0][0] <= now:
            _, _, ids = heapq.heappop(self._leases)
            idx, inside = self.index(ids)
            # an extended lease has a later entry of its own: skip this one
            live = inside & (self.status[idx] == ST_DELIVERED) & (self.cols["until"][idx] <= now)
            if live.any():
                out.append(ids[live])
        if not out:
            return np.empty(0, np.int64)
        return np.unique(np.concatenate(out))

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
        live = self.status[: self.next_id - self.base]
        counts = np.bincount(live, minlength=256)
        out = {st: int(counts[st]) for st in (ST_READY, ST_DELIVERED, ST_ACKED, ST_FAILED, ST_DELAYED)}
        for st, below in self.finished_below_base.items():
            out[st] += below
        if out[ST_DELAYED]:
            mask = live == ST_DELAYED
            due = int(np.count_nonzero(self.cols["until"][: len(live)][mask] <= now))
            out[ST_DELAYED] -= due
            out[ST_READY] += due
        return out

    def live_ids(self, statuses: Iterable[int]) -> np.ndarray:
        """Ids in the window (>= low) whose status is one of `statuses`."""
        a, b = self.low - self.base, self.next_id - self.base
        mask = np.isin(self.status[a:b], list(statuses))
        return np.flatnonzero(mask) + self.low
