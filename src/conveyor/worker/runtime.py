"""`run_worker`: a worker process's life, callable without the CLI (`conveyor worker` only parses
options and calls it).

It imports the task modules, runs one consumer in this process or several consumer processes,
stops gracefully on the first SIGTERM or Ctrl-C (at once on the second), runs the settings'
startup and shutdown hooks, and returns the consumers' counts.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from conveyor.client.pool import QueuePool
from conveyor.tasks.queue_config import QueueConfig
from conveyor.tasks.registry import import_named
from conveyor.worker.affinity import auto_pin
from conveyor.worker.consumer import Consumer
from conveyor.worker.consumer_pool import ConsumerPool, own_process
from conveyor.worker.selectors import QueueSelector
from conveyor.worker.settings import Settings
from conveyor.worker.stats import ConsumerStats

SIGNAL_CHECK_S = 1.0  # how often a multi-process worker looks after its consumers while it waits


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs (the `conveyor worker` options)."""

    processes: int = 1
    concurrency: int | None = None  # None: see conveyor.worker.affinity.default_slots
    mode: Literal["thread", "process"] = "thread"
    batch_size: int | None = None
    selector: str | type[QueueSelector] | None = None  # None: the settings' QUEUE_SELECTOR
    until_empty: bool = False
    pin_core: bool | None = None  # None: pin when there are as many consumer processes as cores


def import_task_modules(modules: Sequence[str]) -> None:
    """Import the modules whose tasks the worker runs; ConfigError names one that does not import, and why."""
    for m in modules:
        import_named(m)


def run_worker(pool: QueuePool, queues: Sequence[QueueConfig | str], settings: Settings, task_modules: Sequence[str],
               options: WorkerOptions, say: Callable[[str], object] = print) -> ConsumerStats:  # fmt: skip
    """Run consumers on `queues` until stopped (or, with `until_empty`, until they are drained).

    One process runs its consumer here; more run as child processes (`ConsumerPool`). `say`
    reports stopping and the like (the CLI prints to stderr).
    """
    import_task_modules(task_modules)
    sel = options.selector or settings.queue_selector
    if options.processes == 1:
        return _run_here(pool, queues, settings, task_modules, options, sel, say)
    cp = ConsumerPool(pool, options.processes, queues=list(queues), batch_size=options.batch_size,
                      max_concurrency=options.concurrency, concurrency=options.mode, task_modules=list(task_modules),
                      selector=sel if isinstance(sel, str) else sel.__name__, pin_core=options.pin_core)  # fmt: skip
    cp.start()
    try:
        if options.until_empty:
            cp.join()
        else:
            _wait_for_signal(cp.check)
    finally:
        cp.cancel()
    return cp.stats  # the sum over the consumer processes


def _run_here(pool: QueuePool, queues: Sequence[QueueConfig | str], settings: Settings, task_modules: Sequence[str],
              options: WorkerOptions, sel: str | type[QueueSelector], say: Callable[[str], object]) -> ConsumerStats:  # fmt: skip
    own_process()
    consumer = Consumer(pool, list(queues), batch_size=options.batch_size, max_concurrency=options.concurrency,
                        concurrency=options.mode, selector=sel if isinstance(sel, str) else sel(),
                        task_modules=list(task_modules), until_empty=options.until_empty,
                        pin_core=auto_pin(options.pin_core, options.mode, 1))  # fmt: skip
    stops = [0]

    def on_signal(*_: object) -> None:
        stops[0] += 1
        consumer.stop(graceful=stops[0] == 1)
        say("stopping: finishing running tasks (again to stop at once)" if stops[0] == 1 else "stopping now")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    if settings.on_worker_startup is not None:
        settings.on_worker_startup()
    try:
        return consumer.run()
    finally:
        if settings.on_worker_shutdown is not None:
            settings.on_worker_shutdown()


def _wait_for_signal(every_s: Callable[[], object]) -> None:
    """Block until SIGTERM or SIGINT, calling `every_s` about once a second meanwhile."""
    got = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: got.set())
    while not got.wait(SIGNAL_CHECK_S):
        every_s()
