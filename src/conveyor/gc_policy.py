"""The garbage collector's settings in serving and consuming processes, and its pause in publishers.

The settings are for the processes that exist only to serve or consume, and for Conveyor's Spark
tasks (`gc_tuned`); the pause, for while a publisher builds a batch.

A process that only serves or consumes allocates a few container objects per message (the message,
its headers, what holds it while it runs), and many live a while: the default first-generation
threshold of 700 allocations makes the collector walk every message in flight several times over,
and its full collections walk everything imported too. Objects that exist once a process has
started are frozen out of the collector's walks (`gc.freeze`), and it runs less often. Reference
counting frees the objects themselves as before; only reference cycles wait longer (to the next
full collection at most). Measured (one consumer, no-op tasks, medians of 3 interleaved runs, with
full collections 20x rarer still): 32k -> 40k tasks/s.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

# allocations before a young collection; young per middle; middle per full: a full collection every
# million allocations at most (cyclic garbage a task leaves, an exception's traceback, say, lives that long)
GC_THRESHOLDS = (10_000, 10, 10)


def tune_gc() -> None:
    """Freeze what exists now out of the collector's walks and collect less often.

    For a process of Conveyor's own, though thread-mode tasks run in it too.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


@contextlib.contextmanager
def gc_tuned() -> Iterator[None]:
    """`tune_gc` for a Spark task of Conveyor's, in a Python worker that goes on to run other tasks.

    On the way out the thresholds are as they were; what the task left in reference cycles (a
    model, say) is collected, a walk of only what came since the freeze; and what it leaves alive
    stays frozen, as what came before does. Spark's daemon collects after every task of a reused
    Python worker, and the worker takes no task until it is done: a walk of a whole worker with
    pandas, pyarrow and a model imported took 90-190 ms (W1: twice per worker and map, the
    read-back's task waiting behind the first); of a frozen one, under 1 ms. The price: a reference
    cycle among frozen objects that later becomes garbage is never collected.
    """
    before = gc.get_threshold()
    tune_gc()
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.collect()
        gc.freeze()


_pause_lock = threading.Lock()
_pausers = 0  # threads inside `gc_paused` now
_was_enabled = True  # the collector's state when the first of them came in


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Hold the cyclic collector off while a batch of objects that all outlive it is built.

    The batch: a publish of many tasks (messages, their headers, the handles). Afterwards the
    collector is put back as it was.

    Every few hundred allocations the collector walks the young objects, which here are the batch
    itself, and now and then everything the process holds: measured on 200,000 no-op tasks
    published 10,000 at a time, the publishing process used 1.0 s of CPU, 0.66 s with the
    collector paused (reference counting still frees what the batch drops; cycles wait for the
    next collection). Threads publishing at once share one pause: the last out restores it. Keep
    it to CPU work (not around a request to a server), so that it ends soon, whoever else publishes.
    """
    global _pausers, _was_enabled
    with _pause_lock:
        if _pausers == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pausers += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pausers -= 1
            if _pausers == 0 and _was_enabled:
                gc.enable()


def _after_fork() -> None:
    """A child forked during a pause starts with no one inside it: the collector as it was before."""
    global _pausers
    if _pausers:
        _pausers = 0
        if _was_enabled:
            gc.enable()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
