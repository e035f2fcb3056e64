"""What `conveyor worker --until-empty` shows while it drains its queues, and the line it ends with.

The queues' counts come from the servers (summed over those that answer), read from a thread on
connections of its own, so the consumers' requests never wait behind it: messages done since the
worker started (acked or failed, by any worker), messages left (ready, delayed or delivered), and
the rate. On a terminal, a progress bar; into a file or a pipe, a dated line every few seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from rich.console import Console

from conveyor.client.progress import JoinProgress
from conveyor.client.sharded import ShardedQueues, summed_stats
from conveyor.protocol.requests import QueueStats

BAR_REFRESH_S = 0.5  # on a terminal, how often the bar asks the servers
STOP_WAIT_S = 5.0  # at the end, how long to wait for a look under way (its servers may be slow to answer)


@dataclass(frozen=True, slots=True)
class Drained:
    """The queues' counts at one look, as the progress shows them."""

    done: int  # acked or failed since the first look
    failed: int  # of which failed
    left: int  # ready, delayed or delivered
    elapsed_s: float  # since the first look

    @property
    def rate(self) -> float:
        """Messages done per second since the first look."""
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0


class DrainProgress:
    """The progress of a worker draining `queues`: a look every `every` seconds (0: none), and a summary at the end."""

    def __init__(self, queues: ShardedQueues, names: Sequence[str], every: float, console: Console) -> None:
        self._queues = queues.with_own_connections()
        self._names = list(names)
        self._every = every
        self._console = console
        self._bar = JoinProgress(enabled=every > 0 and console.is_terminal)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="conveyor-drain-progress", daemon=True)
        self._start = time.monotonic()
        self._first: tuple[int, int] | None = None  # (done, failed) at the first look
        self._lock = threading.Lock()
        self._ended = True  # the thread has ended (or never started)
        self._abandoned = False  # the end no longer waits for the thread: it closes the connections
        self.last: Drained | None = None

    def __enter__(self) -> DrainProgress:
        self._bar.__enter__()
        self._look()  # the counts before any work: what is done after is this run's
        if self._every > 0:
            self._ended = False
            self._thread.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT_S)
        with self._lock:  # a look still waiting on a server: its thread closes the connections as it ends
            self._abandoned = not self._ended
            mine = self._ended
        if mine:
            self._look()
            self._queues.close()
        self._bar.__exit__(t, e, tb)
        if t is None and self.last is not None:
            self._console.print(self.summary(self.last), soft_wrap=True)

    def summary(self, d: Drained) -> str:
        """The line said at the end: how many done, how long it took, how fast, and what is left (if anything)."""
        failed = f", {d.failed:,} failed" if d.failed else ""
        what = f"drained {', '.join(self._names)}" if not d.left else f"{', '.join(self._names)}: {d.left:,} left"
        return f"{what}: {d.done:,} done in {d.elapsed_s:.1f} s ({d.rate:,.1f}/s){failed}"

    def line(self, d: Drained) -> str:
        """A look's line, dated as log lines are."""
        failed = f", {d.failed:,} failed" if d.failed else ""
        when = time.strftime("%Y-%m-%d %H:%M:%S")
        return f"{when} draining {', '.join(self._names)}: {d.done:,} done, {d.left:,} left, {d.rate:,.1f}/s{failed}"

    def _watch(self) -> None:
        wait = BAR_REFRESH_S if self._bar.enabled else self._every
        while not self._stop.wait(wait):
            d = self._look()
            if d is not None and not self._bar.enabled:
                self._console.print(self.line(d), soft_wrap=True)
        with self._lock:
            self._ended = True
            if self._abandoned:
                self._queues.close()

    def _look(self) -> Drained | None:
        """The counts now, summed over the servers that answer (None if none does)."""
        try:
            per = self._queues.reachable_stats(self._names)
        except Exception:  # a look that fails is skipped: the worker says what is wrong with the servers
            return None
        up = [p for p in per if not isinstance(p, Exception)]
        if not up:
            return None
        st: dict[str, QueueStats] = summed_stats(up)
        done = sum(s.acked + s.failed for s in st.values())
        failed = sum(s.failed for s in st.values())
        if self._first is None:
            self._first = (done, failed)
        self._bar.update(st)
        self.last = Drained(
            done - self._first[0], failed - self._first[1], sum(s.pending for s in st.values()), time.monotonic() - self._start
        )
        return self.last
