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
- `cancel(ids, error)`: READY and delayed messages of `ids` to FAILED, dead letters keeping `error`.
- `purge()`: drop every READY message. `sync()`: make writes durable now (a server's group commit).
  `next_wakeup()`: when a delayed message or a lease may next change what `get` returns.
- `skip_ids(next_id)`, `keep_ids_past(highest)`: never assign ids below or up to these (a server's
  queues made again after a drop, its idempotency keys).
- `suspend()`: let go of open files until the next operation (a server holding many queues does so
  for the least used). `close()`.

A store is not thread-safe: one thread (or one asyncio loop) uses it at a time. Subclasses
persist what the shared logic decides through a handful of hooks (`conveyor.storage.hooks`); the
operations that change nothing are in `conveyor.storage.inspection`, argument checks in
`conveyor.storage.checks`.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress
from types import TracebackType

from conveyor.constants import MAX_ATTEMPTS_LIMIT, ST_ACKED, ST_DELAYED, ST_DELIVERED, ST_FAILED, ST_NONE, ST_READY
from conveyor.errors import DiskFullError
from conveyor.message import Message, MessageBatch, Status
from conveyor.storage.checks import as_ids, check_lease, check_nack, check_put, check_results
from conveyor.storage.columns import NOT, add, gather, mask_and, where
from conveyor.storage.ids import first_occurrences
from conveyor.storage.inspection import StoreInspection
from conveyor.storage.state import QueueState

EXPIRE_RETRY_S = 1.0  # a lease expiry that could not be settled (a full disk) is tried again this much later


@dataclass
class Totals:
    """What a store did since it was opened (not persisted: a server's counters start at zero)."""

    put: int = 0
    delivered: int = 0
    acked: int = 0
    nacked: int = 0
    released: int = 0
    expired: int = 0  # leases that ran out, or ended with their consumer's connection
    dead_lettered: int = 0


class Store(StoreInspection):
    """One queue: the operations above on top of a `QueueState`, persisted by the hooks."""

    def __init__(self, queue: str, max_attempts: int, lease_s: float, extra: dict[str, str], objects: Sequence[str] = ()) -> None:
        if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise ValueError(f"max_attempts must be in 1..{MAX_ATTEMPTS_LIMIT}, got {max_attempts}")
        self.queue = queue
        self.max_attempts = max_attempts
        self.lease_s = check_lease(lease_s, "a store's default")
        # leases and delays follow this clock: wall-clock time as of when the store was opened,
        # advanced by the monotonic clock, so that a step of the system clock does not end leases
        self.clock = steady_clock()
        self._state = QueueState(extra=extra, objects=objects)
        # every failed id, forgotten or not: status() must say FAILED after the window slides past it
        self._failed_ids = set()
        self._closed = False
        self.totals = Totals()

    # --- operations -----------------------------------------------------------------------
    def put(self, messages: Sequence[Message]) -> list[int]:
        """Append messages; returns their ids. Their own `id`, `attempts` and `lease_s` are ignored."""
        try:
            payloads = [m.payload for m in messages]
        except AttributeError:
            bad = next(i for i, m in enumerate(messages) if not isinstance(m, Message))
            raise TypeError(f"put takes Message objects; item {bad} is {type(messages[bad]).__name__}") from None
        return self.put_columns(
            payloads,
            [m.priority for m in messages],
            [m.not_before for m in messages],
            [m.max_attempts for m in messages],
            [m.headers for m in messages],
        )

    def put_columns(
        self,
        payloads: Sequence[bytes],
        priority: int | Sequence[int] = 0,
        not_before: float | Sequence[float] = 0.0,
        max_attempts: int | Sequence[int] = 0,
        headers: Sequence[dict[str, str]] | None = None,
        before: Callable[[int], None] | None = None,
    ) -> list[int]:
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
        prio, nb, max_att = check_put(payloads, priority, not_before, max_attempts, headers, self.max_attempts)
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
        self.totals.put += n
        self._commit()
        return list(ids)

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
        self.totals.delivered += len(ids)
        self._commit()
        return batch

    def ack(self, msg_id: int, result: bytes | None = None) -> bool:
        """Finish a message with an optional result; False if it was finished already or unknown."""
        return self.ack_many([msg_id], None if result is None else [result])[0]

    def ack_many(self, ids: Sequence[int], results: Sequence[bytes | None] | None = None) -> list[bool]:
        """`ack` for many ids at once (one write, one sync); returns which acks took effect."""
        self._check_open()
        arr = as_ids(ids)
        if results is not None:
            check_results(len(arr), results)
        ok = self._state.finishable(arr)
        if 1 in ok:
            every = 0 not in ok
            done = arr if every else array("q", compress(arr, ok))
            self._prepare(len(done))
            mine = None if results is None else list(results) if every else list(compress(results, ok))
            # the results are written first: on a full disk the ack is refused before anything changed
            kept = self._keep_results(done, mine) if mine and any(r is not None for r in mine) else None
            self._state.mark(done, ST_ACKED)
            self._record(done, ST_ACKED, kept, self.clock())
            self.totals.acked += len(done)
            self._commit()
        return list(map(bool, ok))

    def nack(self, msg_id: int, error: str = "", delay_s: float = 0.0, final: bool = False) -> bool:
        """Give a delivered message back: READY after `delay_s`, or FAILED when out of attempts."""
        return self.nack_many([msg_id], [error], delay_s, final)[0]

    def nack_many(
        self, ids: Sequence[int], errors: Sequence[str] | None = None, delay_s: float = 0.0, final: bool = False
    ) -> list[bool]:
        """`nack` for many ids at once; returns which nacks took effect (the id was DELIVERED).

        final: fail them now, whatever attempts are left (an error no retry can mend).
        """
        self._check_open()
        arr = as_ids(ids)
        errs = check_nack(len(arr), errors, delay_s)
        ok = mask_and(self._state.delivered(arr), first_occurrences(arr))
        if 1 in ok:
            now = self.clock()
            every = 0 not in ok
            sel = arr if every else array("q", compress(arr, ok))
            self._retry_or_fail(sel, errs if every else list(compress(errs, ok)), now + delay_s, now, final)
            self.totals.nacked += len(sel)
            self._commit()
        return list(map(bool, ok))

    def nack_each(self, ids: Sequence[int], errors: Sequence[str], delays: Sequence[float], final: bool = False) -> list[bool]:
        """`nack_many` with a delay per message: one call per distinct delay; which nacks took effect."""
        ok = [False] * len(ids)
        for d in dict.fromkeys(delays):
            sel = [i for i, x in enumerate(delays) if x == d]
            for i, o in zip(sel, self.nack_many([ids[i] for i in sel], [errors[i] for i in sel], float(d), final), strict=True):
                ok[i] = o
        return ok

    def release_many(self, ids: Sequence[int]) -> list[bool]:
        """Give back delivered messages that were never started: READY again, the attempt not counted.

        For a consumer that stops with messages fetched but not run; returns which were DELIVERED.
        """
        self._check_open()
        arr = as_ids(ids)
        ok = mask_and(self._state.delivered(arr), first_occurrences(arr))
        if 1 in ok:
            back = arr if 0 not in ok else array("q", compress(arr, ok))
            now = self.clock()
            self._prepare(len(back))
            add(self._state.attempts, where(back, self._state.base), -1)
            self._state.requeue(back, 0.0, now)
            self._record(back, ST_READY, None, now)
            self.totals.released += len(back)
            self._commit()
        return list(map(bool, ok))

    def extend_lease(self, msg_id: int, lease_s: float) -> bool:
        """Push a delivered message's lease to now + lease_s; False if it is not delivered."""
        self._check_open()
        lease = check_lease(lease_s, "extend_lease")
        now = self.clock()
        arr = as_ids([msg_id])
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

    def end_leases(self, ids: Sequence[int], deliveries: Sequence[int]) -> int:
        """End now the deliveries of `ids` numbered `deliveries`, as if their leases ran out.

        End now the deliveries of `ids` numbered `deliveries` (`delivery_numbers`), where they still
        stand, as if their leases ran out (the attempt counts): for a consumer known to be gone.
        Returns how many ended.
        """
        self._check_open()
        arr = as_ids(ids)
        live = array("q", compress(arr, self._state.holds(arr, deliveries)))
        live = array("q", compress(live, first_occurrences(live)))
        if not len(live):
            return 0
        now = self.clock()
        self._state.lapse(live, now)  # if they cannot be settled now (a full disk), they expire as any lease
        n = self._end(live, now, "its consumer's connection closed")
        self._commit()
        return n

    def delivery_numbers(self, ids: Sequence[int]) -> list[int]:
        """How many times each of `ids` was delivered.

        How many times each of `ids` was delivered: with its id, names its latest delivery (an
        attempt does not: a release gives it back).
        """
        return self._state.column_of("deliveries", as_ids(ids))

    def delivered_as(self, ids: Sequence[int], deliveries: Sequence[int]) -> list[bool]:
        """Which of `ids` are still in the deliveries numbered `deliveries` (not settled, not delivered again)."""
        return list(map(bool, self._state.holds(as_ids(ids), deliveries)))

    def _expire(self, now: float) -> int:
        """Requeue or fail deliveries whose lease ended by `now`; returns how many."""
        return self._end(self._state.expired(now), now, "lease expired")

    def _end(self, ids: Sequence[int], now: float, why: str) -> int:
        """Requeue or fail deliveries `ids` whose lease ended (`why`, said in a dead letter); returns how many."""
        if not len(ids):
            return 0
        try:
            n = len(ids) - self._retry_or_fail(ids, None, 0.0, now, why=why)
            self.totals.expired += n
            return n
        except BaseException:
            self._state.relist(ids, now + EXPIRE_RETRY_S)  # still delivered: looked at again a little later
            raise

    def _retry_or_fail(
        self,
        ids: Sequence[int],
        errors: list[str] | None,
        not_before: float,
        now: float,
        final: bool = False,
        why: str = "",
    ) -> int:
        """Requeue delivered ids, or fail those out of attempts, or all if final.

        Requeue delivered ids, or fail those out of attempts, or all if final (errors None: the
        lease ended, for the reason `why`).

        The dead letters are written first: on a full disk a nack is refused whole, and a lease
        expiry leaves the messages it would fail delivered (they expire again EXPIRE_RETRY_S later).
        Returns how many were left so.
        """
        self._prepare(len(ids))
        out = b"\x01" * len(ids) if final else self._state.out_of_attempts(ids)
        failed: Sequence[int] = ids if 0 not in out else array("q", compress(ids, out))
        n_out = len(failed)
        if n_out:
            if errors is None:
                attempts = gather(self._state.attempts, where(failed, self._state.base))
                msgs = [f"{why} on its last attempt ({a} of {a})" for a in attempts]
            else:
                msgs = list(compress(errors, out))
            try:
                kept = self._keep_dead(failed, msgs, now)
            except DiskFullError:
                if errors is not None:
                    raise
                self._state.relist(failed, now + EXPIRE_RETRY_S)
                failed = failed[:0]
            if len(failed):
                self._state.mark(failed, ST_FAILED)  # delivered, and each once
                self._failed_ids.update(failed)
                self._record(failed, ST_FAILED, kept, now)
                self.totals.dead_lettered += len(failed)
        back = ids if 1 not in out else array("q", compress(ids, out.translate(NOT)))
        if len(back):
            # a lease that ran out (its worker lost) goes ahead of the waiting work, so a lost host's
            # messages run again within about a lease, not after the backlog; a failure goes behind it
            self._state.requeue(back, not_before, now, front=errors is None)
            self._record(back, ST_READY, None, now)
        return n_out - len(failed)

    def skip_ids(self, next_id: int) -> None:
        """Never assign ids below `next_id` (a queue made again after a drop continues past the old one's)."""
        self._check_open()
        self._state.skip_to(next_id)

    def keep_ids_past(self, highest: int) -> None:
        """Never assign ids up to `highest`, which the owner's own files name (a server's idempotency keys)."""
        if highest + 1 > self.next_id:
            self.skip_ids(highest + 1)

    def purge(self) -> int:
        """Drop every READY message (delayed ones too); returns how many. Delivered ones stay leased.

        A purged id is gone as if never put: no result, no dead letter, `status()` None.
        """
        self._check_open()
        ids = self._state.live_ids((ST_READY, ST_DELAYED))
        self._prepare(len(ids))
        ok = self._state.finish(ids, ST_NONE)
        if 1 in ok:
            self._record(ids if 0 not in ok else list(compress(ids, ok)), ST_NONE, None, self.clock())
            self._commit()
        return ok.count(1)

    def cancel(self, ids: Sequence[int], error: str) -> list[bool]:
        """Fail READY and delayed messages now, each a dead letter holding `error`; returns which were.

        For work nobody wants run any more. A delivered message (its task may be running), a finished
        one, an id never assigned and a repeat within the call are left as they are (False). The dead
        letter keeps the message whole: requeueing it puts it back as it was put.
        """
        self._check_open()
        given = [int(i) for i in as_ids(ids)]
        seen: set[int] = set()
        ok: list[bool] = []
        for i in given:
            ok.append(i not in seen and self.status(i) is Status.READY)  # READY: ready or delayed, not failed
            seen.add(i)
        failed = [i for i, o in zip(given, ok, strict=True) if o]
        if failed:
            now = self.clock()
            self._prepare(len(failed))
            arr = as_ids(failed)
            kept = self._keep_dead(arr, [error] * len(failed), now)  # first: on a full disk nothing changed
            self._state.mark(arr, ST_FAILED)
            self._failed_ids.update(failed)
            self._record(arr, ST_FAILED, kept, now)
            self.totals.dead_lettered += len(failed)
            self._commit()
        return ok

    def sync(self) -> None:
        """Make everything written so far durable (group commit); safe to call from another thread."""
        return  # nothing to do for a store that keeps nothing on disk

    def suspend(self) -> bool:
        """Let go of every file descriptor the store holds open, until its next operation needs them.

        Returns whether it holds none now. False (nothing done) while it has writes waiting for a
        `sync`, which closing would run on the caller's thread. A store that keeps no files holds
        none: True.
        """
        return True

    def forget(self, ids: Iterable[int]) -> int:
        """Drop the stored results and dead letters of finished messages, freeing their space."""
        self._check_open()
        ids = list(ids)
        self._prepare(len(ids))
        n = self._forget(ids)
        self._commit()
        return n

    def close(self) -> None:
        """Flush and release everything; further calls raise StoreClosedError. Idempotent."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def steady_clock() -> Callable[[], float]:
    """Seconds since the epoch, read off the wall clock once and advanced by the monotonic clock."""
    offset = time.time() - time.monotonic()
    monotonic = time.monotonic
    return lambda: offset + monotonic()
