"""The read-only operations of a store: statuses, counts, and paging through kept results and dead letters.

They change nothing, so they persist nothing; `Store` adds the operations that change a queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from conveyor.constants import ST_ACKED, ST_DELAYED, ST_DELIVERED, ST_FAILED, ST_NONE, ST_READY
from conveyor.message import DeadLetter, Status, headers_bytes
from conveyor.storage.hooks import StoreHooks
from conveyor.storage.ids import sorted_above

POLL_GRACE_S = 0.002  # a poll wakes this long after a wakeup time, so that what came due has


@dataclass(frozen=True, slots=True)
class Stats:
    """Counts of a store's messages. `ready` excludes `delayed` (READY but not yet due)."""

    ready: int
    delivered: int
    acked: int
    failed: int
    delayed: int
    bytes_on_disk: int


class StoreInspection(StoreHooks):
    """What a store answers without changing anything."""

    def results(self, after: int = 0) -> Iterator[tuple[int, bytes]]:
        """Stored results as (id, result) in id order, from the first id above `after` (for paging)."""
        self._check_open()
        for i in sorted_above(self._kept_ids(False), after):
            r = self.result(i)
            if r is not None:
                yield i, r

    def dead_letters(self, after: int = 0, limit: int | None = None, max_bytes: int | None = None) -> list[DeadLetter]:
        """FAILED messages not forgotten, in id order, from the first id above `after`.

        FAILED messages not forgotten, in id order, from the first id above `after`, at most
        `limit`, and no more than fit in `max_bytes` of payloads, headers and errors (at least one).
        """
        self._check_open()
        out: list[DeadLetter] = []
        size = 0
        for i in sorted_above(self._kept_ids(True), after)[:limit]:
            d = self._dead_letter(i)
            size += len(d.message.payload) + len(d.error.encode()) + 64 + headers_bytes(d.message.headers)
            if out and max_bytes is not None and size > max_bytes:
                break
            out.append(d)
        return out

    @property
    def next_id(self) -> int:
        """The id the next message put will get."""
        return self._state.next_id

    def ready_left(self) -> int:
        """How many READY messages wait (at most a little high): a get's reply tells the consumer."""
        return self._state.ready_left()

    def next_wakeup(self) -> float | None:
        """The earliest time a delayed message may come due or a lease may run out; None if neither.

        May be early, never late: a waiter that sleeps until then misses nothing.
        """
        self._check_open()
        return self._state.next_wakeup()

    def poll_wait(self, left: float) -> float:
        """How long a long poll may wait for a put: at most `left`.

        How long a long poll may wait for a put: at most `left`, and no later than just after a
        delayed message may come due or a lease run out (then `get` may find something).
        """
        wake = self.next_wakeup()
        return left if wake is None else min(left, max(wake - self.clock(), 0.0) + POLL_GRACE_S)

    def drained(self) -> bool:
        """True when no message is ready, delayed or delivered; cheap (amortized) to ask often."""
        self._check_open()
        return self._state.advance_low() == self._state.next_id

    def status(self, msg_id: int) -> Status | None:
        """The status of a message (a delayed one is READY); None for an id never assigned."""
        self._check_open()
        if msg_id < 1:
            return None
        st = self._state.status_of(msg_id)
        if st == ST_NONE:
            return None
        if msg_id in self._failed_ids:
            return Status.FAILED
        return Status.READY if st == ST_DELAYED else Status(st)

    def stats(self) -> Stats:
        self._check_open()
        c = self._state.counts(self.clock())
        return Stats(
            ready=c[ST_READY],
            delivered=c[ST_DELIVERED],
            acked=c[ST_ACKED],
            failed=c[ST_FAILED],
            delayed=c[ST_DELAYED],
            bytes_on_disk=self._bytes_on_disk(),
        )
