"""How Conveyor starts its worker processes (consumers, and task processes): from a fork server.

The fork server has imported what they need once, so that each new process starts in milliseconds.

A process started with multiprocessing's "spawn" method is a fresh interpreter: it imports
Conveyor (with numpy: ~0.3 s here) and runs the main module again, every time. The "forkserver"
method forks each one from a server process; whatever that server imported, its children have. Its
documented default is to preload the main module, but Python 3.11's forkserver never does (it looks
for a "main_path" the preparation data does not have), so the modules are named here. Where there is
no forkserver (macOS, Windows), processes are spawned. A fork server ignores SIGTERM, so that a stop
sent to a worker's whole process group reaches its consumers, not their fork server
(`forkserver_signals`). And what is said of processes that keep exiting before they start
(`never_started`).
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.forkserver
import sys
import threading
from collections.abc import Sequence
from multiprocessing.context import ForkServerContext, SpawnContext

log = logging.getLogger("conveyor.worker")
FORKSERVER_SIGNALS = "conveyor.worker.forkserver_signals"  # imported by a fork server only, first (see there)


def process_context(preload: Sequence[str], with_main: bool = False) -> ForkServerContext | SpawnContext:
    """The context to start worker processes with: a fork server preloading `preload` where there is one, else "spawn".

    `with_main` preloads the main module too, by its module name when it has one (a Spark Python
    worker's pyspark.daemon, whose imports are much of pyspark): only where that module is known not
    to start workers itself when imported (the fork server would import it, and a script that starts
    a pool without the main guard would start fork servers without end).

    The fork server is one per process: the preload takes effect if it has not started yet (a
    server already running keeps what it has; its children import the rest themselves).
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    main = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) if with_main else None
    # not a package's __main__ (`python -m conveyor`): importing one runs its program
    ctx.set_forkserver_preload([FORKSERVER_SIGNALS, *preload, *([main] if main and not main.endswith("__main__") else [])])
    return ctx


def warm_up(ctx: ForkServerContext | SpawnContext) -> None:
    """Start the fork server in the background, ahead of the first process that needs it.

    It takes as long as its imports: the first process started later then does not wait for it.
    Nothing to do for "spawn". Processes forked from it inherit its environment, not the starting
    process's: pass what may have changed since, as ConsumerPool passes os.environ.
    """
    if ctx.get_start_method() != "forkserver":
        return

    def start() -> None:
        try:
            multiprocessing.forkserver.ensure_running()
        except Exception as e:  # the first process started says what is wrong, where it is caught
            log.debug("the fork server did not start ahead of time: %s", e)

    threading.Thread(target=start, name="conveyor-forkserver-warm-up", daemon=True).start()


# A child process that exits before it is ready this many times in a row is not replaced again:
# what kills it at startup (a script without the main guard, a task module that does not import)
# kills every replacement too. One or two may be chance (killed while starting).
START_FAILURES_MAX = 3
MAIN_GUARD_HINT = (
    "The likely cause: a script that starts worker processes (a ConsumerPool, or a consumer in process mode) "
    'without the `if __name__ == "__main__":` guard: each process imports the main module again and runs it. '
    "Otherwise, see the process's errors above (a task module or settings module that fails to import, a start hook that raises)"
)


def never_started(what: str, times: int, code: int | None, why: str = "") -> str:
    """The error of processes that keep exiting before they start, with its cause.

    The cause is `why`, the error one said it failed with, or else the likely one.
    """
    if why:
        return f"{what} failed to start{f' {times} times in a row' if times > 1 else ''}: {why}"
    exited = f"exited {times} times in a row" if times > 1 else "exited"
    return f"{what} {exited} before it started{f' (exit code {code})' if code is not None else ''}; giving up. {MAIN_GUARD_HINT}"
