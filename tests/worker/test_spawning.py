"""Where worker processes come from: a fork server preloading Conveyor (worker/spawning.py)."""

from __future__ import annotations

import multiprocessing.forkserver
import subprocess
import sys
import time
import types
from importlib.machinery import ModuleSpec

import pytest

from conveyor.worker.spawning import FORKSERVER_SIGNALS, process_context, warm_up

pytestmark = pytest.mark.timeout(60)


def _preload() -> list[str]:
    return list(multiprocessing.forkserver._forkserver._preload_modules)  # type: ignore[attr-defined]


@pytest.fixture
def kept_preload() -> object:
    before = _preload()
    yield
    multiprocessing.forkserver.set_forkserver_preload(before)


def _main_named(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    main = types.ModuleType("__main__")
    main.__spec__ = ModuleSpec(name, None)
    monkeypatch.setitem(sys.modules, "__main__", main)


def test_the_fork_server_preloads_conveyor_and_a_main_module_only_where_asked(
    monkeypatch: pytest.MonkeyPatch, kept_preload: object
) -> None:
    _main_named(monkeypatch, "pyspark.daemon")  # a Spark Python worker's: importing it starts nothing
    ctx = process_context(["conveyor.worker.executors"], with_main=True)
    assert ctx.get_start_method() == "forkserver"
    assert _preload() == [FORKSERVER_SIGNALS, "conveyor.worker.executors", "pyspark.daemon"]
    process_context(["conveyor.worker.consumer_pool"])  # a user's script may start pools unguarded: never it
    assert _preload() == [FORKSERVER_SIGNALS, "conveyor.worker.consumer_pool"]


def test_a_packages_main_module_is_never_preloaded(monkeypatch: pytest.MonkeyPatch, kept_preload: object) -> None:
    _main_named(monkeypatch, "conveyor.__main__")  # python -m conveyor: importing it would run the CLI
    process_context(["conveyor.worker.consumer_pool"], with_main=True)
    assert _preload() == [FORKSERVER_SIGNALS, "conveyor.worker.consumer_pool"]


def test_warm_up_starts_the_fork_server_in_the_background() -> None:
    ctx = process_context(["conveyor.worker.consumer_pool"])
    warm_up(ctx)
    deadline = time.monotonic() + 30
    while multiprocessing.forkserver._forkserver._forkserver_pid is None:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the fork server did not start within 30 s"
        time.sleep(0.02)


FORK_SERVER_SIGTERM = """
import multiprocessing.forkserver, os, signal, sys, time
from conveyor.worker.spawning import process_context

ctx = process_context(["conveyor.worker.consumer_pool"])
first = ctx.Process(target=time.sleep, args=(30,))
first.start()
server = multiprocessing.forkserver._forkserver._forkserver_pid
os.kill(server, signal.SIGTERM)  # as a stop sent to the whole process group does
later = ctx.Process(target=time.sleep, args=(0,))  # the fork server still serves: it forks another
later.start()
later.join(30)
print(later.exitcode, multiprocessing.forkserver._forkserver._forkserver_pid == server, first.is_alive())
first.terminate()  # what it forks ends on SIGTERM, as anywhere else
first.join(10)
print(first.exitcode == -signal.SIGTERM)
first.kill()
first.join(30)
import conveyor.worker.forkserver_signals  # imported here, in no fork server: SIGTERM is left alone
print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
"""


def test_a_fork_server_outlives_a_sigterm_to_its_process_group() -> None:
    """A fork server lives on through a SIGTERM to its worker's process group; what it forks does not.

    A stop sent to a worker's whole process group reaches its fork server too: it must live on (the
    pool reads its consumers' exits through it: dead, it would read them all as gone, and exit under
    them); what it forks does not inherit that (a process started from a fork server shared with the
    program must end on `terminate()`). Imported in any other process, its module leaves SIGTERM
    alone.
    """
    out = subprocess.run([sys.executable, "-c", FORK_SERVER_SIGTERM], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["0", "True", "True", "True", "True"], out.stdout + out.stderr
