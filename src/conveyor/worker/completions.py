"""Completions: finished runs, handed from a consumer's slots to its loop.

A queue whose reader can sleep until several items are in. While every slot is busy, a consumer
fetches more only once enough slots are free for a batch (worker/pacing.py); waking its loop at
every completion before then costs a GIL hand-off and a pass of the loop for nothing (measured: a
tenth of a second of CPU per 1,000 tasks, on the core the tasks run on when the consumer is pinned).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Completions(Generic[T]):
    """A thread-safe FIFO: `put` from any thread; `take` and `wait` from the one reader."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._wake_at = 1  # how many items wake the reader

    def put(self, item: T) -> None:
        with self._lock:
            self._items.append(item)
            if len(self._items) >= self._wake_at:
                self._ready.set()

    def take(self) -> list[T]:
        """Everything in, oldest first (maybe nothing)."""
        with self._lock:
            out = list(self._items)
            self._items.clear()
            self._ready.clear()
        return out

    def wait(self, timeout: float, n: int = 1) -> None:
        """Return once at least `n` items are in, or after `timeout` s."""
        with self._lock:
            if len(self._items) >= n:
                return
            self._wake_at = n
            self._ready.clear()
        try:
            self._ready.wait(timeout)
        finally:
            with self._lock:
                self._wake_at = 1
