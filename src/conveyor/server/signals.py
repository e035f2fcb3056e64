"""Waking and durability on the server's event loop: `Signal` and `GroupCommit`.

Waking and durability on the server's event loop: `Signal` (wake every waiter) and `GroupCommit`
(answer writes once durable, one fsync for every write made before it began).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class Signal:
    """Wakes every waiter at the next `notify`: a queue may have new work, or messages were settled."""

    def __init__(self) -> None:
        self._fut: asyncio.Future[None] | None = None

    def notify(self) -> None:
        if self._fut is not None and not self._fut.done():
            self._fut.set_result(None)
        self._fut = None

    async def wait(self, timeout: float) -> None:
        """Return on the next notify, or after `timeout` seconds."""
        if self._fut is None:
            self._fut = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._fut), timeout)


class GroupCommit:
    """Answers writes only once durable, sharing one fsync among all writes made before it began."""

    def __init__(self, *syncs: Callable[[], None]) -> None:
        self.syncs = syncs
        self.written = 0  # generation of the last write
        self.synced = 0  # every generation up to this one is durable
        self._task: asyncio.Future[None] | None = None

    def wrote(self) -> int:
        self.written += 1
        return self.written

    async def durable(self, generation: int) -> None:
        while self.synced < generation:
            if self._task is None or self._task.done():
                self._task = asyncio.ensure_future(self._sync())
            await asyncio.shield(self._task)

    async def _sync(self) -> None:
        target = self.written
        await asyncio.get_running_loop().run_in_executor(None, self._sync_all)
        self.synced = max(self.synced, target)

    def _sync_all(self) -> None:
        for sync in self.syncs:
            sync()
