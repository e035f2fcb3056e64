"""The command line by Celery's conventions: short flags, -l/--loglevel with dated lines, env vars in the help.

The log level and format are `conveyor.cli.logs`; the worker's progress while it drains is
`conveyor.cli.drain_progress`. Every run is `python -m conveyor` against real servers.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from conveyor.cli.commands import main
from conveyor.client.pool import QueuePool
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.publish import publish_calls

ROOT = Path(__file__).resolve().parents[2]
DATED = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"  # a log line's time, as LOG_FORMAT writes it
COMMANDS = ["serve", "worker", "call", "stats", "dashboard", "dead-letters", "cancel", "purge", "drop"]


def conveyor(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`conveyor ARGS`, from the repository's directory (where `tests.support.worker_tasks` imports)."""
    kw.setdefault("cwd", ROOT)
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args], capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw
    )


def test_every_command_has_h_and_the_short_flags_of_its_options() -> None:
    assert set(COMMANDS) <= set(main.list_commands(click.Context(main)))
    shown = {}
    for command in ["", *COMMANDS]:
        out = conveyor(*command.split(), "-h", timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("Usage: "), (command, out.stderr)
        assert "-h, --help" in out.stdout, command
        shown[command] = out.stdout
    for command in ("", "serve", "worker", "dashboard"):  # the group, and the commands that run until stopped
        assert "-l, --loglevel LEVEL" in shown[command], command
    assert "-v, --verbose" in shown[""]
    for flag in ("-c, --concurrency", "-P, --pool [thread|process|async]", "-Q, --queues"):
        assert flag in shown["worker"], flag
    for command in ("call", "stats", "dead-letters", "cancel"):
        assert "-Q, --queue" in shown[command], command


def test_every_environment_variable_read_is_shown_in_the_help_of_its_option() -> None:
    read: dict[str, set[str]] = {}
    for name in COMMANDS:
        command = main.get_command(click.Context(main), name)
        assert command is not None
        for p in command.params:
            if isinstance(p, click.Option) and p.envvar:
                assert p.show_envvar, (name, p.name)
                read.setdefault(name, set()).add(str(p.envvar))
    assert read["serve"] == {"CONVEYOR_TOKEN", "CONVEYOR_TOKEN_FILE"}
    client = {"CONVEYOR_CONNECT", "CONVEYOR_TOKEN", "CONVEYOR_TOKEN_FILE", "CONVEYOR_TLS_FINGERPRINT"}
    assert all(read[name] == client for name in COMMANDS if name != "serve")
    help_text = conveyor("worker", "-h", timeout=60).stdout.replace("\n", " ")
    help_text = re.sub(r"\s+", " ", help_text)
    for shown in ("[env var: CONVEYOR_CONNECT; required]", "[env var: CONVEYOR_TOKEN]", "$CONVEYOR_SETTINGS_MODULE"):
        assert shown in help_text, shown
    assert "$CONVEYOR_CORE_LOCK_DIR" in help_text  # read by --pin-core, not an option of its own


TASKS = """\
import logging
import os

import conveyor

log = logging.getLogger("myapp")


@conveyor.task(queue="logged")
def speak(n):
    log.info("task %d said so in process %d", n, os.getpid())
    log.warning("task %d warned", n)
    return os.getpid()
"""


def speak(pool: QueuePool, *ns: int) -> None:
    """Publish `myapp.tasks.speak(n)` for each n, by its name (as `conveyor call` does: the module is not imported here)."""
    publish_calls("myapp.tasks.speak", TaskOptions(queue="logged"), None, [((n,), {}, None) for n in ns], None, None, None, pool)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose task logs at INFO and WARNING from where it runs."""
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "tasks.py").write_text(TASKS)
    return tmp_path


@pytest.mark.parametrize(
    "level",
    [
        ["-l", "info", "worker"],  # the group's, any case
        ["worker", "-l", "INFO"],  # the command's, as Celery's worker takes it
        ["-v", "worker"],
        ["-l", "DEBUG", "worker", "--loglevel", "warning"],  # the command's wins
    ],
    ids=["group", "command", "verbose", "command-wins"],
)
def test_loglevel_sets_what_the_worker_and_its_processes_log_with_dated_lines(project: Path, level: list[str]) -> None:
    """Two consumer processes (-P process: tasks in task processes of their own) log as the worker does."""
    with QueuePool.local(n_servers=1) as pool:
        args = ["--connect", pool.addresses[0], "--tasks", "myapp.tasks", "-Q", "logged", "-c", "2", "-P", "process"]
        speak(pool, 0, 1, 2, 3)
        out = conveyor(*level, *args, "--processes", "2", "--until-empty", cwd=project)
        assert out.returncode == 0, out.stderr
        lines = out.stderr.splitlines()
        warned = [line for line in lines if re.fullmatch(rf"{DATED} WARNING myapp: task \d warned", line)]
        assert len(warned) == 4, out.stderr  # at every level asked for here
        said = [re.fullmatch(rf"{DATED} INFO myapp: task \d said so in process (\d+)", line) for line in lines]
        consumers = [
            re.fullmatch(rf"{DATED} INFO conveyor.worker: consumer \S+:(\d+):\d: process x 2 on logged.*", x) for x in lines
        ]
        if "warning" in level:
            assert not any(said) and not any(consumers), out.stderr
            return
        assert len({m.group(1) for m in consumers if m}) == 2, out.stderr  # each consumer process says it started
        task_pids = {m.group(1) for m in said if m}
        assert len([m for m in said if m]) == 4 and task_pids.isdisjoint({m.group(1) for m in consumers if m}), out.stderr


def test_the_default_level_is_warning(project: Path) -> None:
    with QueuePool.local(n_servers=1) as pool:
        speak(pool, 7)
        out = conveyor(
            "worker", "--connect", pool.addresses[0], "--tasks", "myapp.tasks", "-Q", "logged", "--until-empty", cwd=project
        )
        assert out.returncode == 0, out.stderr
        assert re.search(rf"^{DATED} WARNING myapp: task 7 warned$", out.stderr, re.M) and " INFO " not in out.stderr, out.stderr


def test_a_bad_loglevel_is_refused() -> None:
    out = conveyor("-l", "LOUD", "stats", "--connect", "tcp://127.0.0.1:1", timeout=60)
    assert out.returncode == 2 and "'LOUD' is not one of" in out.stderr


def test_worker_until_empty_shows_progress_and_ends_with_a_summary() -> None:
    from tests.support import worker_tasks as wt

    with QueuePool.local(n_servers=2, batch_size=20) as pool:
        wt.sleeps.publish_many([(0.05,) for _ in range(120)], _pool=pool)
        out = conveyor(
            "worker",
            "--connect",
            ",".join(pool.addresses),
            "--tasks",
            "tests.support.worker_tasks",
            "-Q",
            "jobs",
            "-c",
            "2",
            "--until-empty",
            "--progress-every",
            "0.2",
        )
        assert out.returncode == 0, out.stderr
        lines = out.stderr.splitlines()
        looks = [
            re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d draining jobs: (\d+) done, (\d+) left, [\d.,]+/s", x) for x in lines
        ]
        counts = [(int(m.group(1)), int(m.group(2))) for m in looks if m]
        assert len(counts) >= 2, out.stderr  # 120 tasks of 50 ms on 2 threads: 3 s at least, a look every 0.2 s
        assert all(done + left == 120 for done, left in counts) and counts == sorted(counts), out.stderr
        assert re.fullmatch(r"drained jobs: 120 done in [\d.]+ s \([\d.,]+/s\)", lines[-2]), out.stderr
        assert lines[-1].startswith("processed 120, failed 0"), out.stderr
