"""Long waits: progress bars, shown only on a terminal (rich), and a warning when a wait is on queues no consumer serves."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from conveyor.constants import STALL_FIRST_S, STALL_LOOK_S, STALL_WARN_S
from conveyor.protocol.report import Counts, queues_served, serves
from conveyor.protocol.requests import QueueStats

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
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
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
    """Warns while a wait is on queues that no live consumer serves.

    Work nobody serves would otherwise be waited on for ever, or until a timeout, without a word.
    The first warning comes once consumers just started have had time to report (`first` seconds
    into the wait), the next ones every `every` seconds while it lasts. Who serves what is read from
    the consumers' reports (`workers`: those heard from lately, each listing the queues it serves),
    at most every STALL_LOOK_S.
    """

    def __init__(
        self,
        what: str,
        workers: Callable[[], dict[str, Counts]],
        first: float | None = None,
        every: float | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """`first`, `every`: None for STALL_FIRST_S and STALL_WARN_S (read now: a test may shorten them).

        `timeout`: the wait's (None: it waits for ever, and the warning says a timeout would end it).
        """
        self.what, self.workers, self.timeout = what, workers, timeout
        self.every = STALL_WARN_S if every is None else every
        self._next_look = time.monotonic() + (STALL_FIRST_S if first is None else first)
        self._warned_at: float | None = None  # the last warning, while the queues have stayed unserved since

    def check(self, pending: Mapping[str, int]) -> None:
        """`pending`: what the wait still waits on, per queue."""
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + min(STALL_LOOK_S, self.every)
        try:
            heard = self.workers()
        except Exception:  # the wait itself reports a server that does not answer
            return
        idle = {q: n for q, n in pending.items() if n and not served(heard, q)}
        if not idle:
            self._warned_at = None
            return
        if self._warned_at is not None and now - self._warned_at < self.every:
            return
        self._warned_at = now
        queues = sorted(idle)
        names = ", ".join(map(repr, queues))
        on = sorted({q for counts in heard.values() for q in queues_served(counts)})
        who = f"{len(heard)} consumer(s) report, on {', '.join(map(repr, on))}" if heard else "no consumer reports"
        log.warning(
            f"{self.what}: {sum(idle.values()):,} pending on {'queue' if len(queues) == 1 else 'queues'} {names}, "
            f"which no live consumer serves ({who}): start consumers on {'it' if len(queues) == 1 else 'them'} "
            f"(ConsumerPool(pool, queues={queues!r}), or conveyor worker --queues {','.join(queues)})"
            f"{', or pass a timeout' if self.timeout is None else ''} (said again every {self.every:.0f} s while it lasts)"
        )


def served(workers: dict[str, Counts], queue: str) -> bool:
    """Whether any of these consumers serves `queue`.

    One whose report names no queue (a consumer of a version that did not say) may serve any.
    """
    return any(serves(c, queue) or not queues_served(c) for c in workers.values())
