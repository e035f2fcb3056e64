"""Hooks: set-up and tear-down of each consumer process of a pool, and of each task process.

`ConsumerHooks`, set-up and tear-down of each consumer process of a `ConsumerPool`, and what the
tear-down sends back to the pool (its value, or a `HookFailure` saying why there is none); and
`add_child_hooks`, those of each task process of a consumer in process mode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler

log = logging.getLogger("conveyor.worker")
CHILD_HOOKS: list[tuple[Callable[[], object], Callable[[], object] | None]] = []  # see add_child_hooks


def add_child_hooks(start: Callable[[], object], stop: Callable[[], object] | None = None) -> None:
    """Per-process setup (a database pool, say) of each task child process.

    `start()` runs in each task child process once its task modules are imported, before it takes
    work (if it raises, the child ends unready); `stop()` as its consumer closes it (not when
    killed). A task module calls this at import: the fork server imports them, so its children have
    them.
    """
    if (start, stop) not in CHILD_HOOKS:
        CHILD_HOOKS.append((start, stop))


class ConsumerHooks:
    """Set-up and tear-down of each consumer process of a pool, for process-wide state its tasks use.

    `conveyor.compat.daskqueue` keeps a daskqueue consumer object there. Pickled to each process:
    `start(index)` runs before the consumer takes work, `stop()` after it stopped; what `stop` returns
    (picklable) is appended to `ConsumerPool.farewells[index]` (a killed consumer says nothing; one
    whose `stop` raises or returns what cannot be pickled, a `HookFailure`, and its counts go
    anyway). A `start` that raises fails the process before it starts: after START_FAILURES_MAX in a
    row, the pool's error says what it raised.
    """

    def start(self, index: int) -> None:
        """Called in consumer process `index` before it consumes."""

    def stop(self) -> object:
        """Called in the consumer process once it has stopped; the value goes to the pool."""
        return None


@dataclass(frozen=True, slots=True)
class HookFailure:
    """In `ConsumerPool.farewells`: a consumer's `ConsumerHooks.stop()` raised, or returned what cannot be pickled."""

    error: str


def farewell(hooks: ConsumerHooks, index: int) -> object:
    """What `hooks.stop()` returns or, when it raises or returns what cannot be pickled, a `HookFailure`."""
    try:
        said = hooks.stop()
        ForkingPickler.dumps(said)  # pickled once more to send: a farewell goes once per process
        return said
    except Exception as e:
        log.error("consumer %d: its ConsumerHooks.stop() failed: %s: %s", index, type(e).__name__, e)
        return HookFailure(f"ConsumerHooks.stop() failed: {type(e).__name__}: {e}")
