"""Group commit on the server's event loop: writes answered once durable, one fsync for many writes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


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

    async def settled(self) -> None:
        """Wait until the writes made so far are durable, without asking for an fsync of its own.

        Once it returns no fsync of these files is under way or due: they may be closed.
        """
        await self.durable(self.written)

    async def _sync(self) -> None:
        target = self.written
        await asyncio.get_running_loop().run_in_executor(None, self._sync_all)
        self.synced = max(self.synced, target)

    def _sync_all(self) -> None:
        for sync in self.syncs:
            sync()
