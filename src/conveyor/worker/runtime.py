"""`run_worker`: a worker process's life, callable without the CLI (`conveyor worker` only parses options and calls it).

It imports the task modules, runs one consumer in this process or several consumer processes,
stops gracefully on SIGTERM or Ctrl-C, whether sent to this process or to its whole process group
(running tasks finish within the shutdown timeout; with one process, a second signal stops at once),
runs the settings' startup and shutdown hooks, and returns the consumers' counts. A server out of
reach is retried, the others served meanwhile, for as long as it takes unless told otherwise.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from conveyor.client.pool import QueuePool
from conveyor.client.sharded import ShardedQueues
from conveyor.constants import DEFAULT_UNREACHABLE_S
from conveyor.tasks.queue_config import QueueConfig
from conveyor.tasks.registry import import_named
from conveyor.worker.affinity import auto_pin
from conveyor.worker.connections import ONE_ATTEMPT, own_connections
from conveyor.worker.consumer import Consumer
from conveyor.worker.consumer_pool import ConsumerPool, own_process
from conveyor.worker.forkserver_signals import default_sigterm_in_forks
from conveyor.worker.options import ConsumerKeywords, ConsumerOptions, options_of, process_shutdown_timeout
from conveyor.worker.settings import Settings
from conveyor.worker.stats import ConsumerStats

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is 3.11+; only the type checker reads it

SIGNAL_CHECK_S = 1.0  # how often a multi-process worker looks after its consumers (and the servers) while it waits


class Stopping(Exception):
    """SIGTERM or Ctrl-C: a multi-process worker stops its consumers gracefully."""


def gives_up_after(unreachable_s: float | None, until_empty: bool) -> float | None:
    """How long a server may be out of reach before the worker ends with an error (None: never).

    As given; left out, never, unless the worker is to drain the queues and end (DEFAULT_UNREACHABLE_S).
    """
    return DEFAULT_UNREACHABLE_S if unreachable_s is None and until_empty else unreachable_s


def import_task_modules(modules: Sequence[str]) -> None:
    """Import the modules whose tasks the worker runs; ConfigError names one that does not import, and why."""
    for m in modules:
        import_named(m)


def run_worker(
    queue_pool: QueuePool,
    /,
    queues: Sequence[QueueConfig | str],
    settings: Settings,
    *,
    processes: int = 1,
    until_empty: bool = False,
    unreachable_s: float | None = None,
    say: Callable[[str], object] = print,
    options: ConsumerOptions | None = None,
    **keywords: Unpack[ConsumerKeywords],
) -> ConsumerStats:
    """Run consumers on `queues` until stopped (or, with `until_empty`, until they are drained).

    One process runs its consumer here; more run as child processes (`ConsumerPool`). The options
    (`options=`, or keywords of their names) are `ConsumerOptions`; `conveyor worker` fills in the
    settings module's task modules and selector. `settings`: its startup and shutdown hooks run.
    `unreachable_s`: see `gives_up_after`. `say` reports stopping and the like (the CLI prints to
    stderr).
    """
    given = options_of("run_worker", options, keywords)
    shutdown_timeout = process_shutdown_timeout(given.shutdown_timeout)
    opts = dataclasses.replace(given, shutdown_timeout=shutdown_timeout)
    import_task_modules(opts.task_modules)
    limit = gives_up_after(unreachable_s, until_empty)
    if processes == 1:
        return _run_here(queue_pool.queues, queues, settings, opts, until_empty, limit, say)
    cp = ConsumerPool(queue_pool, processes, queues=list(queues), options=opts)
    signals = StopOnSignals(shutdown_timeout, say)
    names = [q if isinstance(q, str) else q.name for q in queues]
    try:
        cp.start()
        if until_empty:
            cp.join(progress=False, unreachable_s=limit or DEFAULT_UNREACHABLE_S)  # with until_empty, there is a limit
        else:
            _look_after(cp, queue_pool.queues, names, limit)
    except Stopping:
        pass
    finally:
        signals.under_way = True
        cp.cancel()  # the consumers finish their running tasks (within the shutdown timeout)
    return cp.stats  # the sum over the consumer processes (those that died: as far as their tallies go)


def _run_here(
    queue_pool: ShardedQueues,
    queues: Sequence[QueueConfig | str],
    settings: Settings,
    options: ConsumerOptions,
    until_empty: bool,
    unreachable_s: float | None,
    say: Callable[[str], object],
) -> ConsumerStats:
    own_process()
    options = dataclasses.replace(options, pin_core=auto_pin(options.pin_core, options.pool, 1))  # the one consumer here
    consumer = Consumer(queue_pool, list(queues), options=options, until_empty=until_empty, unreachable_s=unreachable_s)
    stops = [0]

    def on_signal(*_: object) -> None:
        stops[0] += 1
        consumer.stop(graceful=stops[0] == 1)
        say("stopping: finishing running tasks (again to stop at once)" if stops[0] == 1 else "stopping now")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    default_sigterm_in_forks()  # a process a task forks ends on SIGTERM, not in our handler
    if settings.on_worker_startup is not None:
        settings.on_worker_startup()
    try:
        return consumer.run()
    finally:
        if settings.on_worker_shutdown is not None:
            settings.on_worker_shutdown()


class StopOnSignals:
    """SIGTERM and SIGINT in a multi-process worker: the first raises `Stopping` in the main thread.

    The consumer processes have the signal too when it went to the whole process group; if not,
    `ConsumerPool.cancel` sends it on. Once the stop is `under_way`, a signal is said, not raised.
    """

    def __init__(self, shutdown_timeout: float, say: Callable[[str], object]) -> None:
        self.shutdown_timeout, self.say, self.under_way = shutdown_timeout, say, False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)

    def on_signal(self, *_: object) -> None:
        if self.under_way:
            self.say("already stopping: running tasks finish first")
            return
        self.under_way = True
        within = "" if math.isinf(self.shutdown_timeout) else f" (for up to {self.shutdown_timeout:g} s)"
        self.say(f"stopping: finishing running tasks{within}")
        raise Stopping


def _look_after(cp: ConsumerPool, pool: ShardedQueues, queues: list[str], limit_s: float | None) -> None:
    """Until a signal (`Stopping`): restart dying consumer processes; with a limit, end on an outage.

    With a limit, end with `ServerUnreachableError` once a server has been out of reach for longer
    (each look, one attempt to connect: the consumers keep serving the others meanwhile).
    """
    probe = None if limit_s is None else own_connections(pool, ONE_ATTEMPT)
    try:
        while True:
            time.sleep(SIGNAL_CHECK_S)
            cp.check()
            if probe is not None and limit_s is not None:
                probe.reachable_stats(queues)
                probe.check_reachable(limit_s, queues, "worker: ")
    finally:
        if probe is not None:
            probe.close()
