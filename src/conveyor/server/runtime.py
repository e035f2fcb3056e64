"""The server process's surroundings: its event loop (uvloop where installed), its descriptor limit,
and noticing that the process that started it is gone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import stat
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from conveyor.constants import PARENT_CHECK_S

log = logging.getLogger("conveyor.server.queue_server")

FD_LIMIT_CAP = 1 << 20


async def watch_parent(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
    """Call `stop` once the parent process is gone: stdin (a pipe from it) ends, or we are re-parented.

    The pipe alone is not enough: a child the parent forked may hold its end open. A terminal or
    /dev/null as stdin is never read (a background read of a terminal would suspend the server).
    """
    parent = os.getppid()
    ended = asyncio.Event()
    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):  # no stdin at all
        fd, mode = -1, 0
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):

        def readable() -> None:
            try:
                more = os.read(fd, 4096)
            except OSError:
                more = b""
            if not more:
                loop.remove_reader(fd)
                ended.set()

        loop.add_reader(fd, readable)
    while not ended.is_set() and os.getppid() == parent:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), PARENT_CHECK_S)
    log.warning("the process that started this server is gone: stopping")
    stop()


def raise_fd_limit() -> int:
    """Raise this process's descriptor limit as far as the OS lets it (a server holds a few per queue
    and one per connection); returns the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_LIMIT_CAP if hard == resource.RLIM_INFINITY else min(hard, FD_LIMIT_CAP)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return FD_LIMIT_CAP if soft == resource.RLIM_INFINITY else soft


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop where it is installed (about a third less CPU per request), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)
