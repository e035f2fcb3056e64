"""Tasks the async worker tests run (`async def`, and plain ones beside them), in a module worker processes import.

The consumers of these tests run in the test's process (but for pool="process"), so a task can
count the calls in flight in `IN_FLIGHT`; traces across processes go to files.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import conveyor
from conveyor.tasks.runner import current_message

from .worker_tasks import note


class InFlight:
    """Calls running now, and the most at once since the last `reset`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.most = 0

    def reset(self) -> None:
        with self._lock:
            self.now = self.most = 0

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


IN_FLIGHT = InFlight()


@conveyor.task(queue="jobs", max_retries=0)
async def naps(seconds: float) -> float:
    with IN_FLIGHT:
        await asyncio.sleep(seconds)
    return seconds


@conveyor.task(queue="jobs", max_retries=0)
async def where_it_ran() -> dict[str, Any]:
    """Which process and thread ran it, and whether on a running loop."""
    await asyncio.sleep(0.01)
    return {"pid": os.getpid(), "thread": threading.current_thread().name, "loop": id(asyncio.get_running_loop())}


@conveyor.task(queue="jobs", time_limit=0.5, max_retries=2, retry_backoff=0.05)
async def overruns(log: str) -> None:
    """Runs past its time limit on every attempt; notes when it starts and when it is cancelled."""
    m = current_message()
    note(log, f"start {m.attempts if m is not None else '?'}")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        note(log, "cancelled")
        raise


@conveyor.task(queue="jobs", max_retries=3, retry_backoff=0.05)
async def fails_before(attempt: int) -> int:
    """Fails its attempts before `attempt` (its own message says which this is), then returns it."""
    m = current_message()
    assert m is not None, "current_message() is None inside an async task"
    await asyncio.sleep(0.01)
    if m.attempts < attempt:
        raise ConnectionError(f"attempt {m.attempts} failed")
    return m.attempts


@conveyor.task(queue="jobs", max_retries=2, retry_backoff=0.05)
async def always_fails() -> None:
    await asyncio.sleep(0.01)
    raise ValueError("this input is bad")


@conveyor.task(queue="jobs", max_retries=0)
async def ends_at(seconds: float) -> float:
    """Sleeps `seconds`, then says when it ended (monotonic)."""
    await asyncio.sleep(seconds)
    return time.monotonic()


@conveyor.task(queue="jobs", max_retries=0)
def blocks(seconds: float) -> dict[str, Any]:
    """A plain task that blocks its thread for `seconds`; says where it ran, and when it ended."""
    time.sleep(seconds)
    m = current_message()
    return {"thread": threading.current_thread().name, "end": time.monotonic(), "id": None if m is None else m.id}


@conveyor.task(queue="jobs", max_retries=3)
async def waits_for(log: str, flag: str, seconds: float, tag: int) -> int:
    """Sleeps `seconds`, or returns at once once the file `flag` exists; notes start, done and cancelled."""
    note(log, f"start {tag}")
    try:
        with IN_FLIGHT:
            if not Path(flag).exists():
                await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        note(log, f"cancelled {tag}")
        raise
    note(log, f"done {tag}")
    return tag


@conveyor.task(queue="jobs", time_limit=1.0, max_retries=0)
def hangs(flag: str) -> None:
    """A plain task that blocks its thread past its time limit, until the file `flag` exists (60 s at most)."""
    deadline = time.monotonic() + 60.0
    with IN_FLIGHT:
        while not Path(flag).exists() and time.monotonic() < deadline:
            time.sleep(0.05)


@conveyor.task(queue="jobs", time_limit=5.0, max_retries=0)
def takes(seconds: float) -> float:
    """A plain task of `seconds`, well within its time limit of 5 s once a thread runs it (not while it waits for one)."""
    time.sleep(seconds)
    return seconds


_LOOSE: set[asyncio.Task[None]] = set()  # tasks the calls create, kept (a loop holds its tasks weakly)


async def _exits() -> None:
    raise SystemExit("out of a task a call created")


@conveyor.task(queue="jobs", max_retries=0)
async def ends_the_loop(flag: str) -> str:
    """Until the file `flag` exists, ends the loop it runs on, as a user's task may, then waits; after, returns.

    Through a task of its own raising SystemExit, which asyncio lets out of the loop (out of the
    call itself, it would fail the call).
    """
    if not Path(flag).exists():
        _LOOSE.add(asyncio.get_running_loop().create_task(_exits()))
        await asyncio.sleep(60)
    return "ran"


@conveyor.task(queue="jobs", max_retries=0)
async def outlasts_its_cancel(log: str) -> None:
    """Waits; cancelled, it cleans up for 1 s, whatever further cancels come (notes start, cancelled, ended)."""
    note(log, "start")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        note(log, "cancelled")
        end = time.monotonic() + 1.0
        while (left := end - time.monotonic()) > 0:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(left)
        note(log, "ended")
        raise
