"""Settler: a consumer's acks, nacks, releases, lease extensions and reports, sent from a thread of their own.

Over connections of its own, so that an ack waiting for its fsync never holds up the next fetch.
Whatever piles up while a request is out goes in the next one (one call per server, queue and kind,
split to fit the servers' limits). What a server out of reach (restarting, say) or with a full disk
was to get waits for it and is tried again, less and less often, until it goes through (an ack that
arrives late, after the lease, still counts if no one else finished the message); meanwhile the other
servers' settlements go on. Only `close` sets a limit: what could not be sent by then is given up
(counted in `unsettled`), and comes back when its lease ends.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, NoReturn, cast

from conveyor.client.backend import QueueBackend
from conveyor.constants import ERR_STORE, H_TASK, OUT_OF_REACH_SAY_S, SHARD_SHIFT
from conveyor.errors import ConnectionLostError, ConveyorError, RequestError, TaskError
from conveyor.protocol.report import ConsumerReport
from conveyor.worker.connections import ONE_ATTEMPT, own_connections
from conveyor.worker.executors import Completion

log = logging.getLogger("conveyor.worker")

RETRY_S = 0.5  # first wait before a server that did not answer (or whose disk is full) is tried again
MAX_RETRY_S = 5.0
COALESCE_S = 0.05  # after the first settlement, how long to gather more before sending
# the same while the consumer's queues are busy: a request costs the server and the consumer about
# the same CPU whatever it carries, so under load fewer, larger acks leave more for the tasks (an
# idle consumer, a flush and close hurry them: the end of the work is not delayed)
BUSY_COALESCE_S = 0.25
CLOSE_SAY_S = 2.0  # a close that waits longer for its last settlements says why


# not frozen: a frozen dataclass costs three times as much to make (0.4 µs), for each message settled
@dataclass(slots=True)
class Ack:
    """Finish a message, with its task's result (None: it returned none)."""

    kind: ClassVar[str] = "ack"
    queue: str
    msg_id: int
    result: bytes | None


@dataclass(slots=True)
class Nack:
    """Fail a message: back to its queue after `delay_s`, or (`final`, or out of attempts) to its dead letters."""

    kind: ClassVar[str] = "nack"
    queue: str
    msg_id: int
    error: str
    delay_s: float
    final: bool


@dataclass(slots=True)
class Release:
    """Give a message back unstarted: no attempt counted."""

    kind: ClassVar[str] = "release"
    queue: str
    msg_id: int


@dataclass(slots=True)
class Extend:
    """Push a running message's lease to now + `lease_s` (its task's heartbeat)."""

    kind: ClassVar[str] = "extend"
    queue: str
    msg_id: int
    lease_s: float


Settlement = Ack | Nack | Release | Extend
_SETTLES = (Ack, Nack)  # the kinds that finish or return a message (a consumer counts those not sent)


class _Stop:
    """Put last on the settler's queue by `close`."""


_STOP = _Stop()


@dataclass
class _Outage:
    """A server whose settlements wait: since when, when it is tried again, the wait after that, when it was said."""

    since: float
    retry_at: float
    wait: float
    said: float


class Settler:
    """Queues settlements for a background thread; `flush()` waits until all were sent."""

    def __init__(
        self, pool: QueueBackend, report: Callable[[], ConsumerReport] | None = None, report_every_s: float = 2.0
    ) -> None:
        self._pool: QueueBackend = own_connections(pool, ONE_ATTEMPT)  # each try is one: the thread retries
        self._items: queue.SimpleQueue[Sequence[Settlement] | _Stop] = queue.SimpleQueue()
        self._report = report
        self._report_every_s = report_every_s
        self._pending = 0
        self._cond = threading.Condition()
        self._hurry = threading.Event()  # send without gathering more (a flush waits, or the consumer is idle)
        self.busy = False  # set by the consumer while its queues are busy: gather for BUSY_COALESCE_S
        self.errors = 0
        self._owed = 0  # acks and nacks queued and neither sent nor given up yet
        self._given_up = 0  # acks and nacks given up
        self.unsettled = 0  # set by close: acks and nacks not sent (their messages come back when their leases end)
        self._give_up_at = float("inf")  # set by close: stop retrying after this
        self._out: dict[int, _Outage] = {}  # by shard: servers whose settlements wait
        self._later: list[Settlement] = []  # those settlements, in order
        self._thread = threading.Thread(target=self._loop, name="conveyor-settler", daemon=True)
        self._thread.start()

    # --- what a consumer queues ---------------------------------------------------------
    def put(self, items: Sequence[Settlement]) -> None:
        """Queue settlements (`Ack`, `Nack`, `Release`, `Extend`), sent in this order per server and queue."""
        if items:
            with self._cond:
                self._pending += len(items)
                self._owed += sum(1 for item in items if isinstance(item, _SETTLES))
            self._items.put(items)

    def hurry(self) -> None:
        """Send what is queued without gathering more (nothing else is coming soon).

        With nothing queued, nothing to hurry: the next settlements gather as usual.
        """
        with self._cond:
            if self._pending:
                self._hurry.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far was sent; False on timeout."""
        self.hurry()
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Send what is queued and a last report, and stop.

        Gives up after `timeout` s (what was not sent by then comes back to the queues when its
        lease ends) and returns; says so when it waits longer than CLOSE_SAY_S (a server out of
        reach holds its settlements).
        """
        self._give_up_at = deadline = time.monotonic() + timeout
        if not self.flush(min(timeout, CLOSE_SAY_S)) and (left := deadline - time.monotonic()) > 0:
            with self._cond:
                n = self._pending
            why = "a server out of reach, or slow"
            then = "what is left then comes back to its queue when its lease ends"
            log.warning("%d settlement(s) not sent yet (%s): trying for up to %.0f s more; %s", n, why, left, then)
            self.flush(left)
        self._items.put(_STOP)
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        with self._cond:  # what is still queued or under way when the time is up counts as not sent
            self.unsettled = self._given_up + self._owed

    # --- the thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._run()
        finally:
            self._pool.close()

    def _run(self) -> None:
        next_report, stopping = 0.0, False
        while True:
            now = time.monotonic()
            if self._report is not None and now >= next_report:
                self._send_report()
                next_report = now + self._report_every_s
            # wake for the next report, the next try of a server settlements wait for, or (stopping) the time to give up
            waiting = {item.msg_id >> SHARD_SHIFT for item in self._later}
            wake = [next_report] if self._report is not None else []
            wake += [o.retry_at for s, o in self._out.items() if s in waiting] + ([self._give_up_at] if stopping else [])
            lists = self._take(min(wake) - time.monotonic() if wake else None)
            stopping = stopping or any(items is _STOP for items in lists)
            batch = self._due() + [item for items in lists if not isinstance(items, _Stop) for item in items]
            settled = self._send(batch)
            with self._cond:
                self._pending -= settled
                self._cond.notify_all()
            if stopping and (not self._later or time.monotonic() >= self._give_up_at):
                left: dict[tuple[type[Settlement], str], list[int]] = {}
                for item in self._later:
                    left.setdefault((type(item), item.queue), []).append(item.msg_id)
                for (kind, q), ids in left.items():
                    self._lost(kind, ids, q, TimeoutError("its server did not answer before the consumer stopped"))
                if self._report is not None:
                    self._send_report()
                return

    def _take(self, timeout: float | None) -> list[Sequence[Settlement] | _Stop]:
        """The lists of settlements queued by `timeout` (None: until there are some).

        Gathered a little longer for more to go in the same requests.
        """
        try:
            first = self._items.get(timeout=None if timeout is None else max(timeout, 0.01))
        except queue.Empty:
            return []
        if not isinstance(first, _Stop):  # let settlements arriving together go in one request
            self._hurry.wait(BUSY_COALESCE_S if self.busy else COALESCE_S)
        self._hurry.clear()
        lists = [first]
        while True:
            try:
                lists.append(self._items.get_nowait())
            except queue.Empty:
                return lists

    def _due(self) -> list[Settlement]:
        """Take the waiting settlements whose server is to be tried again now."""
        now = time.monotonic()
        due = {s for s, o in self._out.items() if o.retry_at <= now}
        if not due:
            return []
        out = [item for item in self._later if item.msg_id >> SHARD_SHIFT in due]
        self._later = [item for item in self._later if item.msg_id >> SHARD_SHIFT not in due]
        return out

    def _send(self, batch: list[Settlement]) -> int:
        """Send `batch`, one request per server, queue and kind; return how many were settled.

        What a server out of reach (or with its disk full) was to get waits for its next try. Settled:
        sent, or given up.
        """
        # one request takes one `final` (nacks) or one lease (extensions): those differing go apart
        groups: dict[tuple[int, type[Settlement], str, bool | float | None], list[Settlement]] = {}
        for item in batch:  # the shard as split_id reads it, without a call per message
            alike = item.final if type(item) is Nack else item.lease_s if type(item) is Extend else None
            groups.setdefault((item.msg_id >> SHARD_SHIFT, type(item), item.queue, alike), []).append(item)
        settled = 0
        for (shard, kind, q, _), items in groups.items():
            ids = [item.msg_id for item in items]
            if shard in self._out and self._out[shard].retry_at > time.monotonic():  # it failed just now: wait
                self._later += items
                continue
            try:
                self._request(q, ids, items)
            except (ConnectionLostError, TimeoutError, RequestError) as e:
                self.errors += 1
                if isinstance(e, RequestError) and e.kind != ERR_STORE:
                    self._lost(kind, ids, q, e)  # refused (a queue gone): retrying cannot help
                    settled += len(ids)
                    continue
                self._wait_for(shard, f"could not {kind.kind} {len(ids)} message(s) on {q!r} ({e})")
                self._later += items
                continue
            except Exception as e:  # anything else (a bug, or a settlement no server takes): not retried
                self.errors += 1
                self._lost(kind, ids, q, e)
                settled += len(ids)
                continue
            if self._out.pop(shard, None) is not None:
                log.info("settlements: %s answers again", self._pool.addresses[shard])
            self._done(kind, len(ids))
            settled += len(ids)
        return settled

    def _request(self, q: str, ids: list[int], items: list[Settlement]) -> None:
        """One request for `items`: of one kind, queue and server, and alike (`_send` grouped them so)."""
        first = items[0]
        match first:
            case Ack():
                self._pool.ack(q, ids, [a.result for a in cast(list[Ack], items)])
            case Nack(final=final):
                nacks = cast(list[Nack], items)
                self._pool.nack(q, ids, [n.error for n in nacks], [n.delay_s for n in nacks], final=final)
            case Release():
                self._pool.release(q, ids)
            case Extend(lease_s=lease_s):
                self._pool.extend_lease(q, ids, lease_s)
            case _:
                unknown: NoReturn = first  # mypy: each kind of settlement has its case
                raise AssertionError(f"a settlement of no known kind: {unknown!r}")

    def _wait_for(self, shard: int, what: str) -> None:
        """Try server `shard` again later, each time after twice the wait (up to MAX_RETRY_S).

        Say so at the first failure and once every OUT_OF_REACH_SAY_S while it lasts.
        """
        now = time.monotonic()
        o = self._out.get(shard) or _Outage(now, now, RETRY_S, -OUT_OF_REACH_SAY_S)
        o.retry_at, o.wait = now + o.wait, min(o.wait * 2, MAX_RETRY_S)
        self._out[shard] = o
        said = f"settlements for {self._pool.addresses[shard]} wait ({now - o.since:.0f} s so far): {what}"
        if now - o.said >= OUT_OF_REACH_SAY_S:
            o.said = now
            log.warning("%s; tried again every %g s at most, the other servers' go on meanwhile", said, MAX_RETRY_S)
        else:
            log.debug("%s", said)

    def _done(self, kind: type[Settlement], n: int, given_up: bool = False) -> None:
        if issubclass(kind, _SETTLES):
            with self._cond:
                self._owed -= n
                self._given_up += n if given_up else 0

    def _lost(self, kind: type[Settlement], ids: list[int], q: str, e: BaseException) -> None:
        self._done(kind, len(ids), given_up=True)
        log.error(
            "gave up trying to %s %d message(s) on %r (%s: %s): they come back when their leases end",
            kind.kind,
            len(ids),
            q,
            type(e).__name__,
            e,
        )

    def _send_report(self) -> None:
        """Send the consumer's report."""
        assert self._report is not None
        r = self._report()
        try:  # to every server; one out of reach costs a refused attempt to connect, not a wait
            self._pool.report(r.consumer, r.to_counts())
        except (ConveyorError, OSError) as e:  # OSError: TimeoutError, a server that does not reply
            log.debug("report failed: %s", e)


def result_fits(c: Completion, pool: QueueBackend, fits: float) -> Completion:
    """`c`, or, when its result is too big for a server, a failure of that task alone.

    Too big: bigger than the server holding its message takes (`fits`: what any server takes). The
    failure is not retried: the other results of its batch are acked.
    """
    if c.result is None or len(c.result) <= fits:
        return c
    m = c.message
    limit = pool.clients[pool.split_id(m.id)[0]].server_limits.max_item_bytes  # its hello said: it was fetched there
    if len(c.result) <= limit:
        return c
    why = (
        f"ResultTooLarge: the result is {len(c.result):,} bytes, over the server's limit of {limit:,} "
        "bytes (return less, or store it elsewhere and return where)"
    )
    return Completion(m, None, TaskError(m.headers.get(H_TASK, "?"), why, False), c.slot)
