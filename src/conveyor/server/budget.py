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

Holding a whole request's room before reading it cannot deadlock: every admitted request can be
read to its end. The limits a server announces are lowered to fit its budget, so no request it
accepts can outgrow it. Counting costs an addition and a subtraction per frame set.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from conveyor.constants import CONNECTION_FREE_BYTES, MIN_MEMORY_BUDGET_BYTES
from conveyor.protocol.framing import Limits


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

    def fit(self, limits: Limits) -> Limits:
        """`limits` lowered so that any frame set they let in fits in the budget alone."""
        header = min(limits.max_header_bytes, self.limit // 4)
        message = min(limits.max_message_bytes, self.limit - header)
        return replace(
            limits, max_header_bytes=header, max_message_bytes=message, max_frame_bytes=min(limits.max_frame_bytes, message)
        )

    async def _until(self, ok: Callable[[], bool], rank: int) -> None:
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
    held: int = 0  # bytes of its requests (being read, admitted or running) and of its replies not yet taken
    unsent: int = 0  # of which its replies
    admitted: int = 0  # of which the request being read: what `admit` let in

    def take(self, n: int) -> None:
        """Hold n more bytes, whether or not they fit (they were let in, or are made already)."""
        before = self.held
        self.held += n
        self.budget.used += max(0, self.held - CONNECTION_FREE_BYTES) - max(0, before - CONNECTION_FREE_BYTES)

    def give(self, n: int) -> None:
        """Let go of n bytes; whoever waits for the room that makes checks again."""
        before = self.held
        self.held -= n
        self.budget.used -= max(0, before - CONNECTION_FREE_BYTES) - max(0, self.held - CONNECTION_FREE_BYTES)
        if self.budget._waiting:
            self.budget._wake()

    def fits(self, n: int) -> bool:
        """Whether n more bytes stay within this connection's free allowance or the budget."""
        b = self.budget
        return self.held + n <= CONNECTION_FREE_BYTES or b.used + self.held + n - max(self.held, CONNECTION_FREE_BYTES) <= b.limit

    async def reserve(self, n: int) -> None:
        """Hold n more bytes once they fit in the budget (at once if they do)."""
        n = min(n, self.budget.limit)
        if not self.fits(n):
            await self.budget._until(lambda: self.fits(n), self.held + n)
        self.take(n)

    def admit(self, n: int) -> Awaitable[None] | None:
        """Let in a request of n bytes (its header and frames): None if they fit now (a request's
        usual case, which costs no coroutine), else what to await until they do. `taken` hands
        them on."""
        if not self.fits(n):
            return self._admit_later(n)
        self.take(n)
        self.admitted += n
        return None

    async def _admit_later(self, n: int) -> None:
        await self.reserve(n)
        self.admitted += n

    def taken(self) -> int:
        """The bytes `admit` let in for the request just read: its task gives them back when done."""
        n, self.admitted = self.admitted, 0
        return n

    def replies_taken(self) -> Awaitable[None] | None:
        """None if this connection's unsent replies are within its free allowance, else what to
        await until they are."""
        if self.unsent <= CONNECTION_FREE_BYTES:
            return None
        return self.budget._until(lambda: self.unsent <= CONNECTION_FREE_BYTES, self.held)


# the share of the connection a task serves (set once per connection by its server; None outside one)
SHARE: contextvars.ContextVar[Share | None] = contextvars.ContextVar("conveyor_share", default=None)
# what the request a task runs holds for its reply (`reserve_reply`): a context of its own per task
_REPLY: contextvars.ContextVar[int] = contextvars.ContextVar("conveyor_reply_room", default=0)


async def reserve_reply(n: int) -> None:
    """Hold room for a reply of up to n bytes before making it (a handler whose reply carries
    payloads, before it reads them); its server gives it back once the reply counts as itself."""
    share, held = SHARE.get(), _REPLY.get()
    if share is not None and held < n:
        await share.reserve(n - held)
        _REPLY.set(n)


def release_reply() -> None:
    """Give back what `reserve_reply` held (before a long wait, and once the reply is made)."""
    held = _REPLY.get()
    if held:
        share = SHARE.get()
        assert share is not None
        share.give(held)
        _REPLY.set(0)
