"""`conveyor worker`: consumers on the queues of running servers, until SIGTERM or Ctrl-C.

Or, with --until-empty, until the queues are drained.
"""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from pathlib import Path

import click
from rich.console import Console

from conveyor.cli.connecting import Connection, connect_options, open_pool
from conveyor.cli.drain_progress import DrainProgress
from conveyor.cli.logs import loglevel_option
from conveyor.constants import DEFAULT_SHUTDOWN_TIMEOUT_S, SETTINGS_ENV
from conveyor.errors import ConnectionLostError, ConveyorError
from conveyor.tasks.queue_config import QueueConfig, load_queues
from conveyor.worker.affinity import CORE_LOCK_DIR_ENV, default_slots
from conveyor.worker.options import POOLS, ConsumerOptions, Pool
from conveyor.worker.runtime import import_task_modules, run_worker
from conveyor.worker.settings import load_settings

DEFAULTS = ConsumerOptions()  # the options' defaults are ConsumerOptions': the command line's follow


@click.command()
@loglevel_option
@connect_options
@click.option(
    "--tasks",
    "task_modules",
    multiple=True,
    default=DEFAULTS.task_modules,
    help="A module to import so its tasks register (repeat it); with the settings module's TASK_MODULES (the module "
    f"${SETTINGS_ENV} names).",
)
@click.option(
    "--queues-config",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help=f"Queue YAML in ndkale's format (default: the settings module's QUEUE_CONFIG; ${SETTINGS_ENV} names it).",
)
@click.option("-Q", "--queues", "queue_names", default=None, help="Comma-separated queue names, instead of a queue YAML.")
@click.option(
    "-c",
    "--concurrency",
    default=DEFAULTS.concurrency,
    type=click.IntRange(1),
    help="Tasks one consumer runs at once (default: 8 threads; with --pool process, child processes "
    "for the consumer's share of the cores, plus one; with --pool async, 256 calls in flight).",
)
@click.option(
    "-P",
    "--pool",
    type=click.Choice(POOLS),
    default=DEFAULTS.pool,
    show_default=True,
    help="Run tasks in threads, in child processes (CPU-bound work; over its time limit, killed), or as "
    "coroutines on one event loop (async def tasks waiting on I/O; plain ones in its threads).",
)
@click.option("--processes", default=1, show_default=True, type=click.IntRange(1), help="Consumer processes to run.")
@click.option(
    "--batch-size",
    default=DEFAULTS.batch_size,
    type=click.IntRange(1),
    help="Messages per fetch (default: each queue's batch_size).",
)
@click.option(
    "--selector",
    default=None,
    help=f"Queue selection algorithm (default: the settings module's QUEUE_SELECTOR, else ReducedLottery; ${SETTINGS_ENV} "
    "names that module).",
)
@click.option("--until-empty", is_flag=True, help="Exit once the queues are drained.")
@click.option(
    "--progress-every",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0),
    help="With --until-empty: the queues' progress (done, left, rate) every this many seconds, a dated line "
    "each (on a terminal, a progress bar instead); 0: none. A summary line ends the run either way.",
)
@click.option(
    "--connect-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="With --until-empty: give up, with an error, when the servers cannot be reached within this many "
    "seconds of starting. Without it, a worker keeps trying (it rides out a server restart).",
)
@click.option(
    "--unreachable-s",
    default=None,
    type=click.FloatRange(0, min_open=True),
    help="Give up, with an error naming it, on a server out of reach for this many seconds. Default: keep "
    "trying it (serving the servers that answer meanwhile); with --until-empty, 30.",
)
@click.option(
    "--shutdown-timeout",
    default=DEFAULT_SHUTDOWN_TIMEOUT_S,  # a worker's process ends with its consumers (see ConsumerOptions)
    show_default=True,
    type=click.FloatRange(0),
    help="On SIGTERM or Ctrl-C, how many seconds running tasks may take to finish; those still running then "
    "are handed back to their queues for another worker (inf: no limit).",
)
@click.option(
    "--pin-core/--no-pin-core",
    default=DEFAULTS.pin_core,
    help="Run each consumer on a core of its own while one is free (--pool thread, CPU-bound tasks). "
    "Default: pinned when --processes is at least the number of cores. The workers of a host share which cores "
    f"are held through lock files in ${CORE_LOCK_DIR_ENV}, if set, else a directory of the system's.",
)
@click.option(
    "--early-ack",
    is_flag=True,
    default=DEFAULTS.early_ack,
    help="Ack each message as it is delivered, before its task runs: at most once (a worker that dies loses "
    "the tasks it was running), never a task run twice.",
)
def worker(
    conn: Connection,
    task_modules: tuple[str, ...],
    queues_config: Path | None,
    queue_names: str | None,
    concurrency: int | None,
    pool: Pool,
    processes: int,
    batch_size: int | None,
    selector: str | None,
    until_empty: bool,
    progress_every: float,
    connect_timeout: float,
    unreachable_s: float | None,
    shutdown_timeout: float,
    pin_core: bool | None,
    early_ack: bool,
) -> None:
    """Run consumers: fetch tasks from the queues and run them, until SIGTERM or Ctrl-C (a graceful stop).

    A server out of reach is retried, the others served meanwhile, and said once a minute; the worker
    gives up on it only with --unreachable-s (or --until-empty).
    """
    if queues_config is not None and queue_names is not None:  # which one would win is a guess: say so
        raise click.UsageError("give --queues-config or --queues, not both (the YAML names its queues)")
    if pin_core and pool != "thread":
        raise click.UsageError("--pin-core is for --pool thread: the OS spreads task processes over the cores")
    _cwd_on_path()
    try:
        settings = load_settings()
        modules = [*settings.task_modules, *task_modules]
        queues: list[QueueConfig | str]
        if queues_config is not None:
            queues = list(load_queues(queues_config))
        elif queue_names:
            queues = [q.strip() for q in queue_names.split(",") if q.strip()]
        else:
            queues = list(settings.queues())
        try:
            options = ConsumerOptions(
                concurrency=concurrency,
                pool=pool,
                batch_size=batch_size,
                selector=selector or settings.queue_selector,
                task_modules=modules,
                pin_core=pin_core,
                early_ack=early_ack,
                shutdown_timeout=shutdown_timeout,
            )
        except ValueError as e:  # a ConfigError (a --selector that does not load) is one too
            if selector is None and "selector" in str(e):  # the settings module's QUEUE_SELECTOR, not the command line
                raise click.ClickException(f"settings QUEUE_SELECTOR: {e}") from None
            raise click.UsageError(str(e)) from None
        import_task_modules(modules)  # a module that does not import is said first, before any server is tried
        servers = open_pool(conn)
        names = [q if isinstance(q, str) else q.name for q in queues]
        console = Console(stderr=True)
        slots = concurrency or default_slots(pool, processes)  # None goes on: the consumers then read ahead
        where = f"{', '.join(names)} from {', '.join(servers.addresses)}"
        console.print(f"[bold]conveyor worker[/]: {processes} consumer(s) x {slots} {pool}(s) on {where}", soft_wrap=True)
        if not modules:  # said up front: otherwise every named task's message ends in the dead letters
            console.print(
                "[yellow]warning[/]: no task modules (--tasks MODULE, or TASK_MODULES in the settings module): "
                "only ad-hoc callables (pool.submit, pool.map, which travel cloudpickled) can run; "
                "messages of named tasks will fail as unknown tasks and go to the dead letters"
            )
        if until_empty:
            _reach(conn, connect_timeout)
        progress = DrainProgress(servers.queues, names, progress_every, console) if until_empty else nullcontext()
        with progress:
            st = run_worker(
                servers,
                queues,
                settings,
                processes=processes,
                until_empty=until_empty,
                unreachable_s=unreachable_s,
                say=console.print,
                options=options,
            )
        console.print(st.summary(), soft_wrap=True)  # one line, however long: a log reads it whole
    except ConveyorError as e:
        raise click.ClickException(str(e)) from None


def _reach(conn: Connection, timeout: float) -> None:
    """Wait up to `timeout` s for every server to answer; a ClickException if one does not.

    For `--until-empty`: a worker meant to drain the queues and exit would otherwise retry forever
    against a server that is not running (a long-lived worker keeps retrying, on purpose).
    """
    with open_pool(conn, connect_timeout=timeout) as probe:
        try:
            probe.stats()
        except ConnectionLostError as e:
            raise click.ClickException(
                f"{e}; with --until-empty, a worker gives up on servers it cannot reach "
                f"within --connect-timeout ({timeout:g} s): is the server running?"
            ) from None


def _cwd_on_path() -> None:
    """Make modules under the current directory importable, as Celery's worker does.

    The console script puts its own directory first on sys.path, not the current one (nor does
    `python -m` in safe-path mode), so `--tasks myapp.tasks` from the project's directory would not
    import. Children (consumer and task processes) start with this sys.path too.
    """
    cwd = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
        sys.path.insert(0, cwd)
