"""Long waits: progress bars, shown only on a terminal (rich), and a warning when a wait makes no progress."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from conveyor.constants import STALL_WARN_S
from conveyor.protocol.requests import Counts, QueueStats

log = logging.getLogger("conveyor.client")


class JoinProgress:
    """Finished (acked + failed) out of everything seen, while a pool drains its queues."""

    def __init__(self, enabled: bool | None = None, description: str = "draining") -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._description = description
        self._start: int | None = None  # finished before the wait began: not this run's progress

    def __enter__(self) -> JoinProgress:
        if self.enabled:
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                                      console=Console(stderr=True), transient=False)  # fmt: skip
            self._progress.start()
            self._task = self._progress.add_task(self._description, total=None, rate="")
        return self

    def update(self, stats: dict[str, QueueStats]) -> None:
        if self._progress is None or self._task is None:
            return
        done = sum(s.acked + s.failed for s in stats.values())
        if self._start is None:
            self._start = done
        pending = sum(s.pending for s in stats.values())
        rate = sum(s.ack_rate for s in stats.values())
        failed = sum(s.failed for s in stats.values())
        fields = f"{rate:,.0f}/s" + (f", {failed:,} failed" if failed else "")
        self._progress.update(self._task, completed=done - self._start, total=done - self._start + pending, rate=fields)

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()


class Stall:
    """Warns, once per `every` seconds, while a wait without a timeout sees no progress and no consumer
    reports: work nobody serves would otherwise be waited on for ever, without a word."""

    def __init__(self, what: str, workers: Callable[[], dict[str, Counts]], every: float = STALL_WARN_S) -> None:
        self.what, self.workers, self.every = what, workers, every
        self._seen: object = None
        self._since = time.monotonic()

    def check(self, progress: object, pending: int) -> None:
        """`progress`: anything that changes as work gets done; `pending`: what is left."""
        now = time.monotonic()
        if progress != self._seen:
            self._seen, self._since = progress, now
            return
        if now - self._since < self.every:
            return
        self._since = now
        try:
            idle = not self.workers()
        except Exception:  # the wait itself reports a server that does not answer
            return
        if idle:
            log.warning("%s: %s pending and nothing finished for %.0f s, and no consumer reports: start consumers "
                        "(ConsumerPool, SparkConsumerPool, conveyor worker), or pass a timeout", self.what,
                        f"{pending:,}", self.every)  # fmt: skip
