"""One client connection as the server sees it: its writer, its requests in flight, its timers.

`Connection.send` writes one frame set under a lock (replies of concurrent requests never
interleave); `linger` closes a connection after an error without destroying the error reply;
`unless_gone` ends a wait when the peer it is for leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from conveyor.protocol import framing as protocol
from conveyor.protocol.framing import Header
from conveyor.server.budget import RequestBytes, Share
from conveyor.server.connection_leases import ConnectionLeases

LINGER_S = 2.0  # after a protocol error: how long, and how much, to drain before closing
LINGER_BYTES = 256 * 1024 * 1024
T = TypeVar("T")


async def linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then read and drop what the peer is still sending, for a bounded time.

    Closing a socket with unread input makes the kernel send a reset, which can destroy the error
    reply just written before the peer reads it; draining first lets the reply arrive.
    """
    with contextlib.suppress(Exception):
        if writer.can_write_eof():
            writer.write_eof()
        deadline = asyncio.get_running_loop().time() + LINGER_S
        dropped = 0
        while dropped < LINGER_BYTES:
            chunk = await asyncio.wait_for(reader.read(2**16), deadline - asyncio.get_running_loop().time())
            if not chunk:
                break
            dropped += len(chunk)


async def unless_gone(reader: asyncio.StreamReader, waiting: Awaitable[T]) -> T | None:
    """What `waiting` returns, unless the peer closes or sends anything first (then None).

    What `waiting` returns; or None, `waiting` cancelled, once the peer closes or sends anything
    first: for an answer the peer must wait for before it sends more (its token's, held back by the
    throttle), so that a peer gone holds nothing here.
    """
    work, gone = asyncio.ensure_future(waiting), asyncio.ensure_future(reader.read(1))
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        work.cancel()
        gone.cancel()
        await asyncio.wait((work, gone))  # both ended: the reader is free for the next read
    return None if work.cancelled() else work.result()


@dataclass(eq=False)
class Connection:
    """A client's connection: what the server's reader loop, its requests and its sweep share."""

    writer: asyncio.StreamWriter
    peer: str
    share: Share  # what it holds of the server's memory budget
    reader_task: asyncio.Task[Any] | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    active: float = field(default_factory=time.monotonic)  # when it last sent or was sent something
    reading: float | None = None  # since when a request is coming in, part of it read
    sending: float | None = None  # since when a reply waits for the peer to read what is before it
    tls: bool = False  # TLS makes a record of every write: a frame set goes as one
    leases: ConnectionLeases = field(default_factory=ConnectionLeases)  # what it took with `tie`: ends when its peer closes it
    dropped: bool = False  # the server closed it (idle, too slow): its tied leases keep their time

    async def send(self, header: Header, frames: Sequence[bytes] = ()) -> None:
        """Write one frame set; a peer that went away is not an error of ours.

        Its bytes count against the memory budget while it waits, behind another reply or for its
        peer to take what the transport could not write at once (a reply written straight to the
        socket held nothing long enough to count). The caller should keep no reference to `frames`,
        which are let go of here once the transport has them.
        """
        parts = protocol.encode(header, frames)
        del frames
        share, n = self.share, 0
        try:
            with contextlib.suppress(OSError, RuntimeError):  # OSError: also a TLS error the reader met first
                if self.lock.locked():
                    n = sum(map(len, parts))
                    share.sending(n)
                async with self.lock:
                    self.writer.write(b"".join(parts)) if self.tls else self.writer.writelines(parts)
                    parts.clear()
                    if not n and (n := self.writer.transport.get_write_buffer_size()):
                        share.sending(n)
                    self.sending = time.monotonic()
                    try:
                        await self.writer.drain()
                    finally:
                        self.sending = None
        finally:
            if n:
                share.sent(n)
        self.active = time.monotonic()

    def started(self) -> None:
        self.reading = self.active = time.monotonic()

    async def error(self, rid: int, kind: str, message: str) -> None:
        await self.send({"id": rid, "error": kind, "message": message})


def finished(conn: Connection, slots: asyncio.Semaphore, request_bytes: RequestBytes, task: asyncio.Task[None]) -> None:
    """Let a request's task go from its connection's count and the memory budget once it ends.

    A request's task ended: it no longer counts against its connection's requests in flight, nor
    holds any of the memory budget (a task cancelled before it started never ran to give it back).
    """
    conn.tasks.discard(task)
    slots.release()
    if request_bytes.n:
        request_bytes.release()
