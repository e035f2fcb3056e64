"""ndkale's time limit (`kale.timeout.time_limit`): `TimeoutException` raised inside a task that runs too long.

By a timer signal (SIGALRM), as ndkale's, so only in a main thread: a worker's task processes run
tasks in theirs. Elsewhere (thread slots) the limit is not armed here, and the worker's bound stops
the task from outside (see `worker`). Unlike ndkale's, a timer already running when the limit
starts (an outer limit's, a test runner's) is set going again when it ends, less the time spent.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conveyor.compat.kale import exceptions


class Alarm:
    """Raises TimeoutException in this thread `seconds` after entry, until cancelled or left."""

    def __init__(self, seconds: float | None, error_message: str | None = None) -> None:
        self.seconds = seconds
        self.error_message = error_message
        self.armed = bool(seconds) and threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
        self._previous: Any = None
        self._outer: tuple[float, float] = (0.0, 0.0)  # the timer running before (seconds left, interval)
        self._started = 0.0

    def __enter__(self) -> Alarm:
        if self.armed:
            self._previous = signal.signal(signal.SIGALRM, self._expired)
            self._outer = signal.setitimer(signal.ITIMER_REAL, self.seconds or 0)
            self._started = time.monotonic()
        return self

    def _expired(self, signum: int, frame: object) -> None:
        if self.armed:
            raise exceptions.TimeoutException(self.error_message or f"task ran past its time_limit of {self.seconds:g} s")

    def cancel(self) -> None:
        """Disarm it, restoring the SIGALRM handler it replaced (idempotent)."""
        if self.armed:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            left, interval = self._outer
            if left > 0:  # due meanwhile: at once (a timer of 0 would be none)
                signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - self._started), 1e-6), interval)

    def __exit__(self, *exc: object) -> None:
        self.cancel()


@contextmanager
def time_limit(seconds: float, error_message: str | None = None) -> Iterator[None]:
    """Raise `exceptions.TimeoutException(error_message)` inside the block once it has run `seconds`.

    As ndkale's; fractions of a second are kept. Outside a main thread it does nothing.
    """
    with Alarm(seconds, error_message):
        yield
