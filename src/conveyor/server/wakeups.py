"""Waking waiters on the server's event loop: a queue may have new work, or messages were settled."""

from __future__ import annotations

import asyncio
import contextlib


class Wakeup:
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
