"""More threads for a consumer whose tasks wait: how a thread consumer sizes itself when `concurrency` is left out.

Eight threads suit tasks that compute; tasks that wait on the network (web APIs, databases) leave
them idle, and a consumer then finishes sooner with many more at once. The consumer cannot be told
which its tasks are, so it looks: after each IO_LOOK_S in which every thread was busy (at
IO_FULL_SHARE of its sweeps), the process's CPU tells. Tasks that wait use little of it, and the
threads grow by as many times as keeps it under IO_BUSY_CORES of a core (at most IO_MAX_GROWTH
times a look, up to IO_MAX_THREADS threads): more would only queue for the GIL, which gives
Python threads a core at most. Tasks that compute keep a core busy, so their consumer keeps its
threads. A look in which threads were free (the queue running dry, the job ending) grows nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from conveyor.constants import IO_BUSY_CORES, IO_FULL_SHARE, IO_LOOK_S, IO_MAX_GROWTH, IO_MAX_THREADS


@dataclass
class ThreadScaling:
    """The threads a consumer runs, grown while its tasks wait (see the module docstring)."""

    threads: int
    most: int = IO_MAX_THREADS
    _since: float = field(default_factory=time.monotonic)  # the look's start
    _cpu: float = field(default_factory=time.process_time)  # the process's CPU seconds then
    _sweeps: int = 0  # this look's sweeps
    _full: int = 0  # of them, those that found every thread busy

    def sweep(self, now: float, running: int) -> int | None:
        """Told at each sweep how many tasks the consumer holds; the new thread count when it grows, else None."""
        self._sweeps += 1
        self._full += running >= self.threads
        if now - self._since < IO_LOOK_S:
            return None
        cpu = time.process_time()
        busy_cores = (cpu - self._cpu) / (now - self._since)
        full = self._full >= IO_FULL_SHARE * self._sweeps  # new threads wait a sweep or two for their first work
        self._since, self._cpu, self._sweeps, self._full = now, cpu, 0, 0
        factor = min(IO_MAX_GROWTH, int(IO_BUSY_CORES / max(busy_cores, 1e-6)))  # what keeps the CPU under IO_BUSY_CORES
        if not full or factor < 2 or self.threads >= self.most:
            return None
        self.threads = min(self.most, self.threads * factor)
        return self.threads
