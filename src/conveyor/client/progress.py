"""Progress bars for long waits, shown only on a terminal (rich)."""

from __future__ import annotations

import sys
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from conveyor.protocol.requests import QueueStats


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
