"""The server's memory budget: a bound on the bytes it holds for requests and for replies in transit.

What counts is what clients make the server hold: a request's header and frames from when they are
let in until its handler is done, and a reply from when it is made until its client has taken it
(written to the socket, or at most the transport's high-water mark behind). Each connection's first
CONNECTION_FREE_BYTES are outside the budget, so that pings, acks and small puts never wait; what
any connection holds beyond them counts against the bound. A request is let in, and read past the
lengths of its parts, once all of it fits; a reply that carries payloads is made once a page of it
fits. Until then they wait (a connection is not read meanwhile), and when room comes back those
whose connections would hold the least go first: the connections that hold the most wait the
longest. A connection whose replies are not being taken runs no more of its requests until they are.

No wait for room holds room: a reader waits before it takes its request's, and a handler that needs
more for its reply than its request holds gives that back before it waits (`reply_room`). So every
byte held is on its way out without the budget's help (a request being read, a handler running, a
reply being taken), and whatever waits gets room once enough of it is out: no set of waits can hold
each other up. The limits a server announces are lowered to fit its budget, so no request it
accepts can outgrow it. A wait is logged (at most once a minute). A request that waits for room
longer than the request timeout is closed, by a sweep that closes no other connection (room may
come back from those); a reply waits while its client does (the client's own timeout ends it).
Counting costs an addition and a subtraction per frame set.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from conveyor.constants import CONNECTION_FREE_BYTES, MIN_MEMORY_BUDGET_BYTES
from conveyor.protocol.framing import Limits

log = logging.getLogger("conveyor.server.queue_server")
WAIT_LOG_EVERY_S = 60.0  # waits for room are logged at most this often


@dataclass(eq=False)
class _Waiter:
    rank: int  # what its connection would hold: the least goes first
    ok: Callable[[], bool]
    woken: asyncio.Future[None]


class MemoryBudget:
    """At most `limit` bytes held beyond the connections' free allowances (`used`)."""

    def __init__(self, limit: int) -> None:
        if limit < MIN_MEMORY_BUDGET_BYTES:
            raise ValueError(f"a memory budget of {limit:,} bytes is too small: give at least {MIN_MEMORY_BUDGET_BYTES:,}")
        self.limit = limit
        self.used = 0
        self._waiting: list[_Waiter] = []
        self._quiet_until = 0.0

    @property
    def waiting(self) -> int:
        """How many requests and replies wait for room."""
        return len(self._waiting)

    def fit(self, limits: Limits) -> Limits:
        """`limits` lowered so that any frame set they let in fits in the budget alone."""
        header = min(limits.max_header_bytes, self.limit // 4)
        message = min(limits.max_message_bytes, self.limit - header)
        return replace(
            limits, max_header_bytes=header, max_message_bytes=message, max_frame_bytes=min(limits.max_frame_bytes, message)
        )

    async def _until(self, ok: Callable[[], bool], rank: int, why: Callable[[], str]) -> None:
        """Wait until `ok()`, saying `why()` in the log (at most once a WAIT_LOG_EVERY_S)."""
        if not ok() and time.monotonic() >= self._quiet_until:
            self._quiet_until = time.monotonic() + WAIT_LOG_EVERY_S
            log.warning(
                "%s (memory budget: %s of %s MiB held beyond each connection's first MiB, --memory-budget-mib; "
                "logged at most once a minute)",
                why(),
                f"{self.used / 2**20:,.0f}",
                f"{self.limit / 2**20:,.0f}",
            )
        while not ok():
            waiter = _Waiter(rank, ok, asyncio.get_running_loop().create_future())
            self._waiting.append(waiter)
            try:
                await waiter.woken
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)

    def _wake(self) -> None:
        """Wake the waiters whose turn it may be, the least holding first (each checks again)."""
        for w in sorted(self._waiting, key=lambda w: w.rank):
            if w.ok() and not w.woken.done():
                w.woken.set_result(None)
                self._waiting.remove(w)


@dataclass(eq=False)
class Share:
    """One connection's part of the budget."""

    budget: MemoryBudget
    peer: str = "?"  # whose it is, for the log
    held: int = 0  # bytes of its requests (being read, admitted or running) and of its replies not yet taken
    unsent: int = 0  # of which its replies
    admitted: int = 0  # of which the request being read: what `admit` let in
    waiting: bool = False  # its next request waits for room

    def take(self, n: int) -> None:
        """Hold n more bytes, whether or not they fit (they were let in, or are made already)."""
        held = self.held + n
        if held > CONNECTION_FREE_BYTES:
            self.budget.used += held - max(self.held, CONNECTION_FREE_BYTES)
        self.held = held

    def give(self, n: int) -> None:
        """Let go of n bytes; whoever waits for the room that makes checks again."""
        before = self.held
        self.held = held = before - n
        b = self.budget
        if before > CONNECTION_FREE_BYTES:
            b.used -= before - max(held, CONNECTION_FREE_BYTES)
        if b._waiting:
            b._wake()

    def sending(self, n: int) -> None:
        """Hold n bytes of a reply until its peer takes them (`sent`)."""
        self.unsent += n
        self.take(n)

    def sent(self, n: int) -> None:
        self.unsent -= n
        self.give(n)

    def fits(self, n: int) -> bool:
        """Whether n more bytes stay within this connection's free allowance or the budget."""
        b = self.budget
        return self.held + n <= CONNECTION_FREE_BYTES or b.used + self.held + n - max(self.held, CONNECTION_FREE_BYTES) <= b.limit

    def admit(self, n: int) -> Awaitable[None] | None:
        """Let in a request of n bytes: None if they fit now, else what to await until they do.

        Let in a request of n bytes (its header and frames): None if they fit now (a request's
        usual case, which costs no coroutine), else what to await until they do. `RequestBytes`
        hands them on.
        """
        if self.held + n <= CONNECTION_FREE_BYTES:  # the usual case: `take` without a call
            self.held += n
        elif self.fits(n):
            self.take(n)
        else:
            return self._admit_later(n)
        self.admitted += n
        return None

    async def _admit_later(self, n: int) -> None:
        self.waiting = True
        try:
            await self.room(n, "a request")
        finally:
            self.waiting = False
        self.take(n)
        self.admitted += n

    async def room(self, n: int, what: str) -> None:
        """Wait until n more bytes fit."""
        await self.budget._until(
            lambda: self.fits(n), self.held + n, lambda: f"{what} of {n:,} bytes for {self.peer} waits for room"
        )

    async def replies_taken(self) -> None:
        """Wait until this connection's unsent replies are within its free allowance."""
        await self.budget._until(
            lambda: self.unsent <= CONNECTION_FREE_BYTES,
            self.held,
            lambda: f"{self.peer} has not taken {self.unsent:,} bytes of replies: its next request waits until it does",
        )


class RequestBytes:
    """What one request holds of its connection's share: its bytes, let in as it was read.

    Its task gives it back once its handler is done, and whatever ends the task (it may be
    cancelled before it starts, when its connection closes) releases it again: at most once counts.
    """

    __slots__ = ("n", "share")

    def __init__(self, share: Share) -> None:
        """What `admit` let in for the request just read, handed on to the task that runs it."""
        self.share, self.n, share.admitted = share, share.admitted, 0

    def release(self) -> None:
        if self.n:
            n, self.n = self.n, 0
            self.share.give(n)


# what the request a task runs holds (set by its server as the task starts; None outside one)
REQUEST_BYTES: contextvars.ContextVar[RequestBytes | None] = contextvars.ContextVar("conveyor_request_bytes", default=None)


def reply_room(n: int) -> Awaitable[None] | None:
    """What to await for room for a reply of up to n bytes; None if there is room now.

    None if there is room for a reply of up to n bytes (at most the whole budget) beside what
    the running request holds, which counts as part of it; else what to await until there is,
    holding nothing meanwhile: what the request holds is given back first, so that no wait for room
    holds any. The room is looked at, not taken: a handler makes its reply in the same step of the
    event loop, and `Connection.send` counts it before anything else runs.
    """
    request = REQUEST_BYTES.get()
    if request is None:
        return None
    share = request.share
    n = min(n, share.budget.limit)
    if share.fits(n - request.n):
        return None
    request.release()
    return share.room(n, "a reply")
