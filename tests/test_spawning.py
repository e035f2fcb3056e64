"""Where worker processes come from: a fork server preloading Conveyor (worker/spawning.py)."""

from __future__ import annotations

import multiprocessing.forkserver
import sys
import time
import types
from importlib.machinery import ModuleSpec

import pytest

from conveyor.worker.spawning import process_context, warm_up

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


def test_the_fork_server_preloads_conveyor_and_a_main_module_only_where_asked(monkeypatch: pytest.MonkeyPatch,
                                                                              kept_preload: object) -> None:  # fmt: skip
    _main_named(monkeypatch, "pyspark.daemon")  # a Spark Python worker's: importing it starts nothing
    ctx = process_context(["conveyor.worker.executors"], with_main=True)
    assert ctx.get_start_method() == "forkserver"
    assert _preload() == ["conveyor.worker.executors", "pyspark.daemon"]
    process_context(["conveyor.worker.consumer_pool"])  # a user's script may start pools unguarded: never it
    assert _preload() == ["conveyor.worker.consumer_pool"]


def test_a_packages_main_module_is_never_preloaded(monkeypatch: pytest.MonkeyPatch, kept_preload: object) -> None:
    _main_named(monkeypatch, "conveyor.__main__")  # python -m conveyor: importing it would run the CLI
    process_context(["conveyor.worker.consumer_pool"], with_main=True)
    assert _preload() == ["conveyor.worker.consumer_pool"]


def test_warm_up_starts_the_fork_server_in_the_background() -> None:
    ctx = process_context(["conveyor.worker.consumer_pool"])
    warm_up(ctx)
    deadline = time.monotonic() + 30
    while multiprocessing.forkserver._forkserver._forkserver_pid is None:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the fork server did not start within 30 s"
        time.sleep(0.02)
