"""Ctrl-C in a real program: a child in a process group of its own, sent SIGINT as a terminal does.

The SIGINT goes to the whole group, as a terminal sends it. Local servers outlive the consumers that
settle with them, the program ends in seconds, and what it says of what is left never points at
servers that are gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool
from conveyor.server.processes import spawn_server, stop_server
from conveyor.spark.job import abandon_queue

from .support.graph_helpers import ROOT
from .support.procs import kill_tree, process_tree, wait_gone
from .support.servers import wait_for

pytestmark = pytest.mark.timeout(180)
# the bound is 2 s from Ctrl-C to exit with short tasks (measured here: well under 1 s);
# generous for a busy machine, and far below the 30 s of retries it took when the servers died first
JOIN_EXIT_S = 10.0
MAP_EXIT_S = 60.0  # Spark cancels the jobs and stops the session too


def interrupted(mode: str, tmp_path: Path, start_s: float) -> tuple[float, str, list[int]]:
    """Run tests/support/interrupted_job.py `mode`; once a task has run, SIGINT its process group.

    Returns the seconds from the signal to its exit, its stderr, and the pids it had started.
    """
    mark, err = tmp_path / "mark", tmp_path / "stderr"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with open(err, "wb") as stderr:
        args = [sys.executable, str(ROOT / "tests" / "support" / "interrupted_job.py"), mode, str(mark)]
        job = subprocess.Popen(
            args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
    try:
        wait_for(lambda: mark.exists() or job.poll() is not None, start_s, "a task of the job running")
        assert job.poll() is None, err.read_text()
        started = process_tree(job.pid)[1:]
        t0 = time.monotonic()
        os.killpg(job.pid, signal.SIGINT)
        job.wait(120)
        took = time.monotonic() - t0
    finally:
        if job.poll() is None:
            kill_tree(job)
    return took, err.read_text(errors="replace"), started


def test_ctrl_c_in_a_consumer_pool_join_on_local_servers_stops_the_consumers_first(tmp_path: Path) -> None:
    """The case seen: 30 s of ack retries, the local servers dead of the same Ctrl-C."""
    took, err, started = interrupted("join", tmp_path, 60)
    assert "KeyboardInterrupt" in err, err[-3000:]
    assert "could not ack" not in err and "retrying" not in err, err[-3000:]
    assert took < JOIN_EXIT_S, f"exited {took:.1f} s after Ctrl-C\n{err[-3000:]}"
    assert wait_gone(started, 20) == [], "processes outlived the interrupted program"


def test_ctrl_c_in_a_map_under_conveyor_local_points_at_no_server(tmp_path: Path) -> None:
    """The case seen: `conveyor drop --connect ...` advised on the servers of `conveyor.local()`, dead of the same Ctrl-C.

    Now they outlive the map's cleanup, which drops its queue.
    """
    took, err, started = interrupted("map", tmp_path, 120)
    assert "KeyboardInterrupt" in err, err[-3000:]
    assert "conveyor drop" not in err, err[-3000:]
    assert "dropped its queue" in err and "nothing is left behind" in err, err[-3000:]  # the servers were still there
    assert took < MAP_EXIT_S, f"exited {took:.1f} s after Ctrl-C\n{err[-3000:]}"
    assert wait_gone(started, 30) == [], "processes outlived the interrupted program"


def _notes_of_abandoning(pool: QueuePool, server: subprocess.Popen[bytes], ephemeral: bool = False) -> str:
    """What a map that failed on `pool` once `server` was SIGKILLed says is left behind."""
    for c in pool.queues.clients:
        c.connect_timeout = 1.0  # the server killed refuses at once: one attempt, not the default patience
    pool.queues.declare("map-x")
    server.kill()
    server.wait(10)
    error = KeyboardInterrupt()
    abandon_queue(pool, "map-x", error, entry="map", ephemeral=ephemeral)
    return " ".join(getattr(error, "__notes__", []))


@pytest.mark.parametrize("case", ["local-temporary", "local-kept", "ephemeral", "users-servers"])
def test_an_abandoned_map_points_only_at_servers_that_outlive_the_program(tmp_path: Path, case: str) -> None:
    """A map failing with a server gone points only at servers that outlive the program.

    A server gone when a map fails: on servers this program started (which stop with it) no server
    is pointed at, and what is left is said (nothing, or the data directory that keeps it); on the
    user's own servers, the `conveyor drop` command for the one out of reach.
    """
    if case == "users-servers":
        started = [spawn_server(None, 0) for _ in range(2)]
        try:
            with QueuePool.connect([address for _, address in started]) as pool:
                notes = _notes_of_abandoning(pool, started[1][0])
            assert f"conveyor drop --connect {pool.addresses[1]} map-x" in notes, notes
        finally:
            for proc, _ in started:
                stop_server(proc)
        return
    data_dir = tmp_path / "data" if case == "local-kept" else None
    with QueuePool.local(n_servers=2, data_dir=data_dir) as pool:
        notes = _notes_of_abandoning(pool, pool.servers.processes[1], ephemeral=case == "ephemeral")
    assert "conveyor drop" not in notes and pool.addresses[1] not in notes, notes
    if case == "local-kept":
        assert f"stays in {data_dir}" in notes, notes
    else:
        assert "nothing is left behind" in notes, notes
