"""One queue's task records: its deliveries running now, and the last ones settled.

The server records each delivery a `get` makes: the message's task name (its H_TASK header: the
server never decodes a payload), the consumer it went to (the name its `get` gave), its attempt,
since when, its headers and the first TASK_PREVIEW_BYTES of its payload. A delivery runs until it
is acked, nacked (retried, or failed to the dead letters), released, or its lease ends (it ran out,
or its consumer's connection closed: the message went back, or, on its last attempt, to the dead
letters); then it joins the last TASK_RECENT settled, with its end, its run time and, for a
failure, its error. The `tasks` and `task` operations answer from them; each settled delivery is
counted for the metrics (`TaskTallies`).

What is kept is bounded: the running ones by the leases (what consumers hold), the settled ones by
TASK_RECENT, each with at most TASK_PREVIEW_BYTES of payload and TASK_ERROR_KEPT_CHARS of error. The
records live in memory: a server that restarts starts with none.

Every `get` and settlement goes through here, so the bookkeeping is done a batch at a time by the
interpreter's own loops (zip, map, Counter), and a delivery is a plain tuple laid out as `_Run` says.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from itertools import compress, repeat
from operator import getitem, itemgetter, methodcaller
from typing import Any, Final

from conveyor.constants import (
    H_TASK,
    TASK_ERROR_KEPT_CHARS,
    TASK_ERROR_SUMMARY_CHARS,
    TASK_PREVIEW_BYTES,
    TASK_RECENT,
)
from conveyor.message import MessageBatch, Status
from conveyor.protocol.task_pages import TaskState, record_wire
from conveyor.server.task_tallies import TaskTallies

_StatusOf = Callable[[int], "Status | None"]  # a store's `status`
LEASE_RAN_OUT = "its lease ran out"
CONNECTION_CLOSED = "its consumer's connection closed"


class _Delivery:
    """What the messages one `get` delivered share: the consumer, when, and until when their leases run."""

    __slots__ = ("at", "consumer", "ids", "left", "until")

    def __init__(self, consumer: str, at: float, until: float, ids: Sequence[int]) -> None:
        self.consumer, self.at, self.until = consumer, at, until
        self.ids: Sequence[int] = ids  # let go of once none of them runs
        self.left = len(ids)  # how many of them still run


class _End:
    """How a delivery ended: its state, when, and the error kept (a failure's, or why a lease ended)."""

    __slots__ = ("at", "error", "state")

    def __init__(self, state: TaskState, at: float, error: str = "") -> None:
        self.state, self.at, self.error = state, at, error


# a running delivery: (id, task name, attempt, enqueued at, payload preview, payload size, headers, _Delivery)
_Run = tuple[int, str, int, float, bytes, int, dict[str, str], _Delivery]
_ID: Final = 0
_TASK: Final = 1
_ATTEMPT: Final = 2
_ENQUEUED: Final = 3
_PREVIEW: Final = 4
_SIZE: Final = 5
_HEADERS: Final = 6
_DELIVERY: Final = 7
_task_of = methodcaller("get", H_TASK, "")
_cut = slice(0, TASK_PREVIEW_BYTES)
_tasks_and_deliveries = itemgetter(_TASK, _DELIVERY)


def kept_error(error: str) -> str:
    """An error as the records keep it: whole up to TASK_ERROR_KEPT_CHARS, else its start and its end."""
    if len(error) <= TASK_ERROR_KEPT_CHARS:
        return error
    half = TASK_ERROR_KEPT_CHARS // 2
    return f"{error[:half]}\n... ({len(error) - 2 * half:,} characters cut) ...\n{error[-half:]}"


TRACEBACK_HEADER = "Traceback (most recent call last)"


def error_summary(error: str) -> str:
    """An error's line that names it, cut to TASK_ERROR_SUMMARY_CHARS (what a page of records shows).

    Its first line (a worker's errors start with the exception), or its last when it starts with a
    bare traceback's header, which names nothing.
    """
    lines = [line for line in error.split("\n") if line.strip()] or [""]
    line = lines[-1] if lines[0].startswith(TRACEBACK_HEADER) else lines[0]
    return line if len(line) <= TASK_ERROR_SUMMARY_CHARS else line[: TASK_ERROR_SUMMARY_CHARS - 1] + "…"


class TaskRecords:
    """The deliveries of one queue: those running, and the last TASK_RECENT settled."""

    def __init__(self, queue: str, tallies: TaskTallies) -> None:
        self.queue = queue
        self._tallies = tallies
        self._running: dict[int, _Run] = {}
        self._recent: deque[tuple[_Run, _End]] = deque(maxlen=TASK_RECENT)
        self._deliveries: set[_Delivery] = set()  # those with messages still running
        self._until: dict[int, float] = {}  # the running ids whose lease was extended: when it ends
        self._due = math.inf  # no running delivery's lease ends before this (it may be early)

    @property
    def running(self) -> int:
        return len(self._running)

    # --- what the handlers tell ------------------------------------------------------------
    def delivered(self, batch: MessageBatch, consumer: str, now: float) -> None:
        """A `get` by `consumer` delivered `batch` at `now`."""
        ids = batch.ids
        if not len(ids):
            return
        running = self._running
        if running and (again := running.keys() & ids):  # their leases ended before a sweep saw it
            self._settle(sorted(again), lambda r: _End(TaskState.EXPIRED, min(now, self._lease_end(r)), LEASE_RAN_OUT))
        d = _Delivery(consumer, now, now + batch.lease_s, ids)
        self._deliveries.add(d)
        self._due = min(self._due, d.until)
        payloads = batch.payloads
        previews = map(bytes, map(getitem, payloads, repeat(_cut)))  # a copy of a view: never a whole buffer kept
        runs = zip(
            ids,
            map(_task_of, batch.headers),
            batch.attempts,
            batch.enqueued_at,
            previews,
            map(len, payloads),
            batch.headers,
            repeat(d),
        )
        running.update(zip(ids, runs, strict=True))

    def acked(self, ids: Sequence[int], ok: Sequence[bool], now: float) -> None:
        self._settle(compress(ids, ok), _End(TaskState.ACKED, now))

    def nacked(self, ids: Sequence[int], ok: Sequence[bool], errors: Sequence[str], status: _StatusOf, now: float) -> None:
        """Nacks that took effect: each delivery retried, or failed if its message is a dead letter now."""
        kept = dict(zip(compress(ids, ok), compress(errors, ok), strict=False))

        def end(r: _Run) -> _End:
            failed = status(r[_ID]) is Status.FAILED
            return _End(TaskState.FAILED if failed else TaskState.RETRIED, now, kept_error(kept[r[_ID]]))

        self._settle(kept, end)

    def released(self, ids: Sequence[int], ok: Sequence[bool], now: float) -> None:
        self._settle(compress(ids, ok), _End(TaskState.RELEASED, now))

    def extended(self, ids: Sequence[int], ok: Sequence[bool], lease_s: float, now: float) -> None:
        running = self._running
        for i in compress(ids, ok):
            if i in running:
                self._until[i] = now + lease_s

    def sweep(self, status: _StatusOf, now: float, closed: Iterable[int] | None = None) -> None:
        """Settle the deliveries whose leases the store ended: those due by `now`, or of `closed` ids.

        `closed`: the ids whose leases ended with their consumer's connection (else those whose
        lease ran out by `now` are looked at). Each is looked up in the store (`status`): one no
        longer delivered went back to its queue, or to the dead letters.
        """
        running = self._running
        if closed is not None:
            gone = [i for i in closed if i in running and status(i) is not Status.DELIVERED]
            self._settle(gone, lambda r: self._lease_ended(status, r, now, CONNECTION_CLOSED))
            return
        if now < self._due:
            return
        gone, due = [], math.inf
        for d in [d for d in self._deliveries if d.until <= now]:
            soonest = math.inf
            for i in d.ids:
                r = running.get(i)
                if r is None or r[_DELIVERY] is not d:
                    continue
                until = self._until.get(i, d.until)
                if until <= now and status(i) is not Status.DELIVERED:
                    gone.append(i)
                else:
                    soonest = min(soonest, until)
            d.until = soonest
        self._settle(gone, lambda r: self._lease_ended(status, r, now, LEASE_RAN_OUT))
        for d in self._deliveries:
            due = min(due, d.until)
        self._due = due

    # --- what the operations ask -------------------------------------------------------------
    def page(
        self, task: str | None, state: TaskState | None, msg_id: int, limit: int
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        """Running deliveries and settled ones, each newest first, matching the filters (None, 0: any).

        Returns them on the wire (at most `limit` of each) and how many running ones matched.
        """
        running: list[_Run] = []
        if state in (None, TaskState.RUNNING):
            if msg_id:
                found = self._running.get(msg_id)
                running = [] if found is None else [found]
            else:
                running = list(self._running.values())
            if task is not None:
                running = [r for r in running if r[_TASK] == task]
        newest = heapq.nlargest(limit, running, key=lambda r: r[_DELIVERY].at)
        recent: list[dict[str, Any]] = []
        if state is not TaskState.RUNNING:
            for r, e in reversed(self._recent):
                if len(recent) >= limit:
                    break
                if (
                    (task is None or r[_TASK] == task)
                    and (state is None or e.state is state)
                    and (not msg_id or r[_ID] == msg_id)
                ):
                    recent.append(self._wire(r, e, error_summary(e.error)))
        return [self._wire(r) for r in newest], recent, len(running)

    def of(self, msg_id: int) -> list[tuple[_Run, _End | None]]:
        """The deliveries of one message kept, oldest first (the running one last, its end None)."""
        out: list[tuple[_Run, _End | None]] = [(r, e) for r, e in self._recent if r[_ID] == msg_id]
        if (r := self._running.get(msg_id)) is not None:
            out.append((r, None))
        return out

    def wire(self, run: _Run, end: _End | None) -> dict[str, Any]:
        """A delivery of `of` on the wire, with its error as kept."""
        return self._wire(run, end, "" if end is None else end.error)

    @staticmethod
    def message_of(run: _Run) -> tuple[dict[str, str], float, bytes, int]:
        """What a delivery of `of` kept of its message: its headers, when it was put, its payload's preview and size."""
        return run[_HEADERS], run[_ENQUEUED], run[_PREVIEW], run[_SIZE]

    # --- inside ------------------------------------------------------------------------------
    def _wire(self, r: _Run, e: _End | None = None, error: str = "") -> dict[str, Any]:
        d = r[_DELIVERY]
        if e is None:
            return record_wire(self.queue, r[_ID], r[_TASK], TaskState.RUNNING, d.consumer, r[_ATTEMPT], d.at, None, "")
        return record_wire(self.queue, r[_ID], r[_TASK], e.state, d.consumer, r[_ATTEMPT], d.at, e.at, error)

    def _lease_end(self, r: _Run) -> float:
        return self._until.get(r[_ID], r[_DELIVERY].until)

    def _lease_ended(self, status: _StatusOf, r: _Run, now: float, why: str) -> _End:
        dead = status(r[_ID]) is Status.FAILED
        at = min(now, self._lease_end(r)) if why is LEASE_RAN_OUT else now
        return _End(TaskState.DEAD if dead else TaskState.EXPIRED, at, why)

    def _settle(self, ids: Iterable[int], end: _End | Callable[[_Run], _End]) -> None:
        """The deliveries of `ids` that run end as `end` says (one for all, or each its own).

        They join the recent ones, and are counted for the metrics.
        """
        popped: list[_Run] = list(filter(None, map(self._running.pop, ids, repeat(None))))
        if not popped:
            return
        if self._until:
            for r in popped:
                self._until.pop(r[_ID], None)
        groups = Counter(map(_tasks_and_deliveries, popped))  # deliveries of one task from one get: alike
        for (_, d), n in groups.items():
            d.left -= n
            if not d.left:
                self._deliveries.discard(d)
                d.ids = ()  # kept only while some of them run: a record of a settled one holds no batch
        tally = self._tallies.count
        if isinstance(end, _End):  # settled together: the usual ack of a batch
            self._recent.extend(zip(popped, repeat(end)))
            for (task, d), n in groups.items():
                tally(task, end.state, end.at - d.at, n)
            return
        ends = list(map(end, popped))
        self._recent.extend(zip(popped, ends, strict=True))
        for r, e in zip(popped, ends, strict=True):
            tally(r[_TASK], e.state, e.at - r[_DELIVERY].at)
