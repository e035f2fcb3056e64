"""The store interface, shared by every queue store, and the logic common to all of them.

A store holds one queue. It never looks inside payloads, results or errors beyond their
type: they are opaque bytes (errors are text). The operations, all batch-friendly:

- `put(messages) -> ids`: ids are assigned here, ascending in the order given.
- `get(n, lease_s)`: up to n READY messages, highest priority first and FIFO within a priority
  (a message requeued by a nack or an expired lease queues behind those already waiting);
  never one before its `not_before`. Each delivery counts one attempt.
- `ack(id, result)`: the first ack of an id wins and stores its result; later acks return False.
  A late ack (after the lease ran out) still counts if the message is not finished.
- `nack(id, error, delay_s, final)`: back to READY after the delay, or FAILED (a dead letter keeping
  `error`) once its attempts reached `max_attempts`, or at once when `final`.
- `release_many(ids)`: delivered but never started: READY again, the attempt not counted.
- `extend_lease(id, lease_s)`, `expire(now)`: expired leases go back to READY (the delivery has
  counted an attempt) or to FAILED when out of attempts; `get` also sweeps them.
- `result(id)`, `results(after)`, `dead_letters(after, limit)`, `forget(ids)`, `status(id)`, `stats()`.
- `purge()`: drop every READY message. `sync()`: make writes durable now (a server's group commit).
  `next_wakeup()`: when a delayed message or a lease may next change what `get` returns. `close()`.

A store is not thread-safe: one thread (or one asyncio loop) uses it at a time. Subclasses
persist what the shared logic decides through a handful of hooks.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

import numpy as np

from conveyor.constants import (
    MAX_ATTEMPTS_LIMIT,
    MAX_LEASE_S,
    PRIORITY_MAX,
    PRIORITY_MIN,
    ST_ACKED,
    ST_DELAYED,
    ST_DELIVERED,
    ST_FAILED,
    ST_NONE,
    ST_READY,
)
from conveyor.errors import DiskFullError, StoreClosedError
from conveyor.message import DeadLetter, Message, MessageBatch, Status, headers_bytes
from conveyor.storage.state import QueueState, first_occurrences

EXPIRE_RETRY_S = 1.0  # a lease expiry that could not be settled (a full disk) is tried again this much later


@dataclass(frozen=True, slots=True)
class Stats:
    """Counts of a store's messages. `ready` excludes `delayed` (READY but not yet due)."""

    ready: int
    delivered: int
    acked: int
    failed: int
    delayed: int
    bytes_on_disk: int


class Store(ABC):
    """One queue: the operations above on top of a `QueueState`, persisted by the hooks."""

    def __init__(self, queue: str, max_attempts: int, lease_s: float, extra: dict[str, object]) -> None:
        if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise ValueError(f"max_attempts must be in 1..{MAX_ATTEMPTS_LIMIT}, got {max_attempts}")
        self.queue = queue
        self.max_attempts = max_attempts
        self.lease_s = check_lease(lease_s, "a store's default")
        # leases and delays follow this clock: wall-clock time as of when the store was opened,
        # advanced by the monotonic clock, so that a step of the system clock does not end leases
        self.clock = steady_clock()
        self._state = QueueState(extra=extra)
        # every failed id, forgotten or not: status() must say FAILED after the window slides past it
        self._failed_ids: set[int] = set()
        self._closed = False

    # --- hooks ----------------------------------------------------------------------------
    @abstractmethod
    def _store_messages(self, ids: np.ndarray, payloads: Sequence[bytes], headers: Sequence[dict[str, str]] | None,
                        now: float) -> None:  # fmt: skip
        """Keep new messages' payloads and headers (state already holds their scheduling fields)."""

    @abstractmethod
    def _reserve_ids(self, upto: int) -> None:
        """Make sure ids below `upto` are never assigned again, even after a crash (a durable store
        records that before the ids are used). A put starts here: it may be refused (disk full)."""

    @abstractmethod
    def _load(self, ids: np.ndarray, lease_s: float) -> MessageBatch:
        """The delivered messages `ids`, with attempts and lease from the state."""

    @abstractmethod
    def _prepare(self, n: int) -> None:
        """Make sure the records of a transition of `n` messages can be written whatever happens to
        the free space meanwhile (raises DiskFullError when they cannot be). Called before anything
        changes, so that a full disk refuses an operation whole rather than failing it halfway."""

    @abstractmethod
    def _sizes(self, ids: np.ndarray) -> np.ndarray:
        """Bytes each message takes in a reply (payload, headers and per-message fields, or a little more)."""

    @abstractmethod
    def _keep_results(self, ids: np.ndarray, results: Sequence[bytes | None]) -> Any:
        """Write the results of messages about to be ACKED, before they are (None: no result).
        Returns what `_record` needs to find them."""

    @abstractmethod
    def _keep_dead(self, ids: np.ndarray, errors: Sequence[str], now: float) -> Any:
        """Write the dead letters of DELIVERED messages about to be FAILED, before they are."""

    @abstractmethod
    def _record(self, ids: np.ndarray, status: int, kept: Any, now: float) -> None:
        """Persist a transition of `ids` to `status` (`kept`: what `_keep_results` or `_keep_dead` returned).

        Must not fail for lack of space: `_prepare` made room for it."""

    @abstractmethod
    def _commit(self) -> None:
        """Make what the last operation wrote durable under the store's policy."""

    @abstractmethod
    def result(self, msg_id: int) -> bytes | None:
        """The stored result of an acked message, or None (no result, or not acked)."""

    @abstractmethod
    def _kept_ids(self, dead: bool) -> Iterable[int]:
        """Ids holding a stored result (dead=False) or a dead letter (dead=True), in any order."""

    @abstractmethod
    def _dead_letter(self, msg_id: int) -> DeadLetter:
        """The dead letter of a FAILED id that `_kept_ids(True)` lists."""

    @abstractmethod
    def _forget(self, ids: list[int]) -> int:
        """Drop stored results and dead letters of these ids; returns how many were dropped."""

    @abstractmethod
    def _bytes_on_disk(self) -> int: ...

    @abstractmethod
    def _close(self) -> None: ...

    # --- operations -----------------------------------------------------------------------
    def put(self, messages: Sequence[Message]) -> list[int]:
        """Append messages; returns their ids. Their own `id`, `attempts` and `lease_s` are ignored."""
        try:
            payloads = [m.payload for m in messages]
        except AttributeError:
            bad = next(i for i, m in enumerate(messages) if not isinstance(m, Message))
            raise TypeError(f"put takes Message objects; item {bad} is {type(messages[bad]).__name__}") from None
        return self.put_columns(payloads, [m.priority for m in messages], [m.not_before for m in messages],
                                [m.max_attempts for m in messages], [m.headers for m in messages])  # fmt: skip

    def put_columns(self, payloads: Sequence[bytes], priority: int | Sequence[int] = 0,
                    not_before: float | Sequence[float] = 0.0, max_attempts: int | Sequence[int] = 0,
                    headers: Sequence[dict[str, str]] | None = None,
                    before: Callable[[int], None] | None = None) -> list[int]:  # fmt: skip
        """`put` from per-message columns (a scalar applies to all), without building Messages.

        Ids are consecutive, ascending in the order given. `before(first id)` runs once the put is
        checked and its ids reserved (never given to another message, even after a crash), before
        anything is stored: a server writes the put's idempotency keys there. If it raises, nothing
        was put; if the put fails after it, its ids stay unused.
        """
        self._check_open()
        n = len(payloads)
        if not n:
            return []
        prio = _column(priority, n, np.int64, "priority")
        max_att = _column(max_attempts, n, np.int64, "max_attempts")
        nb = _column(not_before, n, np.float64, "not_before")
        if not all(type(p) is bytes for p in payloads):
            bad = next(i for i, p in enumerate(payloads) if type(p) is not bytes)
            raise TypeError(f"put: message {bad} has a {type(payloads[bad]).__name__} payload, not bytes")
        if (prio < PRIORITY_MIN).any() or (prio > PRIORITY_MAX).any():
            raise ValueError(f"put: priority must be within [{PRIORITY_MIN}, {PRIORITY_MAX}]")
        if headers is not None:
            if len(headers) != n:
                raise ValueError(f"put: {n} payloads but {len(headers)} headers")
            for i, h in enumerate(headers):
                if h and (type(h) is not dict or not all(type(k) is str and type(v) is str for k, v in h.items())):
                    raise TypeError(f"put: message {i} headers must be a dict of str to str")
        if (max_att < 0).any() or (max_att > MAX_ATTEMPTS_LIMIT).any():
            raise ValueError(f"put: max_attempts must be within [0, {MAX_ATTEMPTS_LIMIT}] (0: store default)")
        if not np.isfinite(nb).all():
            raise ValueError("put: not_before must be a finite time")
        max_att[max_att == 0] = self.max_attempts
        now = self.clock()
        self._reserve_ids(self._state.next_id + n)
        if before is not None:
            before(self._state.next_id)
        ids = self._state.add(prio, nb, max_att, now)
        try:
            self._store_messages(ids, payloads, headers, now)
        except BaseException:
            self._state.finish(ids, ST_NONE)  # never stored: the ids stay unused
            raise
        self._commit()
        return cast(list[int], ids.tolist())

    def get(self, n: int, lease_s: float | None = None) -> list[Message]:
        """Deliver up to n messages under a lease of `lease_s` seconds (store default if None)."""
        return self.get_batch(n, lease_s).messages()

    def get_batch(self, n: int, lease_s: float | None = None, max_bytes: int | None = None) -> MessageBatch:
        """`get`, as columns rather than Message objects (what a server sends on).

        max_bytes: deliver no more messages than fit in this many bytes of payload and headers
        (always at least one: a message bigger than that comes alone).
        """
        self._check_open()
        if n < 0:
            raise ValueError(f"get: n must be >= 0, got {n}")
        lease = self.lease_s if lease_s is None else check_lease(lease_s, "get")
        now = self.clock()
        self._expire(now)
        self._state.promote(now)
        self._prepare(min(n, self._state.ready_left()))
        ids, until = self._state.take(n, lease, now, None if max_bytes is None else (self._sizes, max_bytes))
        if not len(ids):
            self._commit()
            return MessageBatch(self.queue, lease, [], [], [], [], [], [], [], [])
        try:
            batch = self._load(ids, lease)  # before the delivery is recorded: a failed read changes nothing
        except BaseException:
            self._state.untake(ids, until)
            raise
        self._record(ids, ST_DELIVERED, None, now)
        self._commit()
        return batch

    def ack(self, msg_id: int, result: bytes | None = None) -> bool:
        """Finish a message with an optional result; False if it was finished already or unknown."""
        return self.ack_many([msg_id], None if result is None else [result])[0]

    def ack_many(self, ids: Sequence[int], results: Sequence[bytes | None] | None = None) -> list[bool]:
        """`ack` for many ids at once (one write, one sync); returns which acks took effect."""
        self._check_open()
        arr = self._ids(ids)
        if results is not None:
            if len(results) != len(arr):
                raise ValueError(f"ack: {len(arr)} ids but {len(results)} results")
            for r in results:
                if r is not None and type(r) is not bytes:
                    raise TypeError(f"ack: a result must be bytes or None, not {type(r).__name__}")
        ok = self._state.finishable(arr)
        if ok.any():
            done = arr[ok]
            self._prepare(len(done))
            mine = None if results is None else [r for r, o in zip(results, ok, strict=True) if o]
            # the results are written first: on a full disk the ack is refused before anything changed
            kept = self._keep_results(done, mine) if mine and any(r is not None for r in mine) else None
            self._state.mark(done, ST_ACKED)
            self._record(done, ST_ACKED, kept, self.clock())
            self._commit()
        return cast(list[bool], ok.tolist())

    def nack(self, msg_id: int, error: str = "", delay_s: float = 0.0, final: bool = False) -> bool:
        """Give a delivered message back: READY after `delay_s`, or FAILED when out of attempts."""
        return self.nack_many([msg_id], [error], delay_s, final)[0]

    def nack_many(self, ids: Sequence[int], errors: Sequence[str] | None = None, delay_s: float = 0.0,
                  final: bool = False) -> list[bool]:  # fmt: skip
        """`nack` for many ids at once; returns which nacks took effect (the id was DELIVERED).

        final: fail them now, whatever attempts are left (an error no retry can mend).
        """
        self._check_open()
        arr = self._ids(ids)
        errs = [""] * len(arr) if errors is None else list(errors)
        if len(errs) != len(arr):
            raise ValueError(f"nack: {len(arr)} ids but {len(errs)} errors")
        if not all(type(e) is str for e in errs):
            raise TypeError("nack: errors must be str")
        if not 0 <= delay_s < float("inf"):
            raise ValueError(f"nack: delay_s must be a finite number >= 0, got {delay_s}")
        ok = self._state.delivered(arr) & first_occurrences(arr)
        if ok.any():
            now = self.clock()
            sel = np.flatnonzero(ok)
            self._retry_or_fail(arr[sel], [errs[i] for i in sel], now + delay_s, now, final)
            self._commit()
        return cast(list[bool], ok.tolist())

    def release_many(self, ids: Sequence[int]) -> list[bool]:
        """Give back delivered messages that were never started: READY again, the attempt not counted.

        For a consumer that stops with messages fetched but not run; returns which were DELIVERED.
        """
        self._check_open()
        arr = self._ids(ids)
        ok = self._state.delivered(arr) & first_occurrences(arr)
        if ok.any():
            back = arr[ok]
            now = self.clock()
            self._prepare(len(back))
            self._state.cols["attempts"][back - self._state.base] -= 1
            self._state.requeue(back, np.zeros(len(back), np.float64), now)
            self._record(back, ST_READY, None, now)
            self._commit()
        return cast(list[bool], ok.tolist())

    def extend_lease(self, msg_id: int, lease_s: float) -> bool:
        """Push a delivered message's lease to now + lease_s; False if it is not delivered."""
        self._check_open()
        lease = check_lease(lease_s, "extend_lease")
        now = self.clock()
        arr = self._ids([msg_id])
        self._prepare(1)
        ok = self._state.extend(arr, lease, now)
        if ok[0]:
            self._record(arr, ST_DELIVERED, None, now)
            self._commit()
        return bool(ok[0])

    def expire(self, now: float | None = None) -> int:
        """Return deliveries whose lease ended by `now`; returns how many came back or failed."""
        self._check_open()
        n = self._expire(self.clock() if now is None else now)
        if n:
            self._commit()
        return n

    def _expire(self, now: float) -> int:
        """Requeue or fail deliveries whose lease ended by `now`; returns how many."""
        ids = self._state.expired(now)
        if not len(ids):
            return 0
        try:
            return len(ids) - self._retry_or_fail(ids, None, np.float64(0.0), now)
        except BaseException:
            self._state.relist(ids, now + EXPIRE_RETRY_S)  # still delivered: they expire again a little later
            raise

    def _retry_or_fail(self, ids: np.ndarray, errors: list[str] | None, not_before: float | np.floating,
                       now: float, final: bool = False) -> int:  # fmt: skip
        """Requeue delivered ids, or fail those out of attempts, or all if final (errors None: lease expiry).

        The dead letters are written first: on a full disk a nack is refused whole, and a lease
        expiry leaves the messages it would fail delivered (they expire again EXPIRE_RETRY_S later).
        Returns how many were left so.
        """
        self._prepare(len(ids))
        out = np.ones(len(ids), bool) if final else self._state.out_of_attempts(ids)
        failed = ids[out]
        if len(failed):
            if errors is None:
                attempts = self._state.cols["attempts"][failed - self._state.base].tolist()
                msgs = [f"lease expired on its last attempt ({a} of {a})" for a in attempts]
            else:
                msgs = [e for e, o in zip(errors, out, strict=True) if o]
            try:
                kept = self._keep_dead(failed, msgs, now)
            except DiskFullError:
                if errors is not None:
                    raise
                self._state.relist(failed, now + EXPIRE_RETRY_S)
                failed = failed[:0]
            if len(failed):
                self._state.mark(failed, ST_FAILED)  # delivered, and each once
                self._failed_ids.update(failed.tolist())
                self._record(failed, ST_FAILED, kept, now)
        back = ids[~out]
        if len(back):
            self._state.requeue(back, np.full(len(back), not_before, np.float64), now)
            self._record(back, ST_READY, None, now)
        return int(out.sum()) - len(failed)

    def results(self, after: int = 0) -> Iterator[tuple[int, bytes]]:
        """Stored results as (id, result) in id order, from the first id above `after` (for paging)."""
        self._check_open()
        for i in _sorted_above(self._kept_ids(False), after).tolist():
            r = self.result(i)
            if r is not None:
                yield i, r

    def dead_letters(self, after: int = 0, limit: int | None = None, max_bytes: int | None = None) -> list[DeadLetter]:
        """FAILED messages not forgotten, in id order, from the first id above `after`, at most `limit`,
        and no more than fit in `max_bytes` of payloads, headers and errors (at least one)."""
        self._check_open()
        out: list[DeadLetter] = []
        size = 0
        for i in _sorted_above(self._kept_ids(True), after)[:limit].tolist():
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

    def skip_ids(self, next_id: int) -> None:
        """Never assign ids below `next_id` (a queue made again after a drop continues past the old one's)."""
        self._check_open()
        self._state.skip_to(next_id)

    def purge(self) -> int:
        """Drop every READY message (delayed ones too); returns how many. Delivered ones stay leased.

        A purged id is gone as if never put: no result, no dead letter, `status()` None.
        """
        self._check_open()
        ids = self._state.live_ids((ST_READY, ST_DELAYED))
        self._prepare(len(ids))
        ok = self._state.finish(ids, ST_NONE)
        if ok.any():
            self._record(ids[ok], ST_NONE, None, self.clock())
            self._commit()
        return int(ok.sum())

    def sync(self) -> None:
        """Make everything written so far durable (group commit); safe to call from another thread."""
        return  # nothing to do for a store that keeps nothing on disk

    def ready_left(self) -> int:
        """How many READY messages wait (at most a little high): a get's reply tells the consumer."""
        return self._state.ready_left()

    def next_wakeup(self) -> float | None:
        """The earliest time a delayed message may come due or a lease may run out; None if neither.

        May be early, never late: a waiter that sleeps until then misses nothing.
        """
        self._check_open()
        return self._state.next_wakeup()

    def drained(self) -> bool:
        """True when no message is ready, delayed or delivered; cheap (amortized) to ask often."""
        self._check_open()
        return self._state.advance_low() == self._state.next_id

    def forget(self, ids: Iterable[int]) -> int:
        """Drop the stored results and dead letters of finished messages, freeing their space."""
        self._check_open()
        ids = list(ids)
        self._prepare(len(ids))
        n = self._forget(ids)
        self._commit()
        return n

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
        return Stats(ready=c[ST_READY], delivered=c[ST_DELIVERED], acked=c[ST_ACKED], failed=c[ST_FAILED],
                     delayed=c[ST_DELAYED], bytes_on_disk=self._bytes_on_disk())  # fmt: skip

    def close(self) -> None:
        """Flush and release everything; further calls raise StoreClosedError. Idempotent."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # --- helpers --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.queue!r} is closed")

    @staticmethod
    def _ids(ids: Sequence[int]) -> np.ndarray:
        arr = np.asarray(ids)
        if arr.size == 0:
            return np.empty(0, np.int64)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise TypeError(f"message ids must be a flat sequence of integers, got {type(ids).__name__}")
        return arr.astype(np.int64, copy=False)


def steady_clock() -> Callable[[], float]:
    """Seconds since the epoch, read off the wall clock once and advanced by the monotonic clock."""
    offset = time.time() - time.monotonic()
    monotonic = time.monotonic
    return lambda: offset + monotonic()


def check_lease(lease_s: object, what: str) -> float:
    """A lease as a float within (0, MAX_LEASE_S], else ValueError (an endless lease would never return a message)."""
    if type(lease_s) not in (int, float) or not 0 < cast(float, lease_s) <= MAX_LEASE_S:
        raise ValueError(f"{what}: lease_s must be a number of seconds in (0, {MAX_LEASE_S:g}], got {lease_s!r}")
    return float(cast(float, lease_s))


def _sorted_above(ids: Iterable[int], after: int) -> np.ndarray:
    """The ids above `after`, sorted (numpy: paging through a million ids stays cheap)."""
    arr = np.fromiter(ids, np.int64)
    arr = arr[arr > after]
    arr.sort()
    return arr


def _column(value: object, n: int, dtype: type, name: str) -> np.ndarray:
    """A writable array of n values from a sequence, or from one value for all; TypeError unless every
    value is an integer (an integer dtype) or a number (a float dtype): 2.7 is no max_attempts."""
    kinds = "iu" if np.dtype(dtype).kind in "iu" else "iuf"
    if type(value) in (list, tuple) and (seq := cast("Sequence[object]", value)) and seq.count(seq[0]) == len(seq):
        value = seq[0]  # the usual case: one value for all (equal values: 1 and 1.0 hold the same)
    arr = np.asarray(value) if isinstance(value, (int, float, np.number, list, tuple, np.ndarray)) else None
    if arr is None or arr.dtype.kind not in kinds or arr.ndim > 1 or (arr.ndim == 1 and len(arr) != n):
        want = "an integer" if kinds == "iu" else "a number"
        raise TypeError(f"put: {name} must be {want} (one for all, or one per message), got {value!r:.60}")
    return np.full(n, arr, dtype) if arr.ndim == 0 else arr.astype(dtype)
