"""`conveyor stats` with real servers in child processes: a server down, consumers gone, piped output.

The command is `conveyor.cli.stats`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool
from conveyor.constants import WORKER_GONE_S
from conveyor.message import Message
from conveyor.protocol import requests as calls
from conveyor.server.processes import spawn_server, stop_server

from ..support.procs import free_port
from ..support.servers import wait_for

ROOT = Path(__file__).resolve().parents[2]
LONG_QUEUE = "jobs-" + "q" * 120  # wider than 80 columns, the width rich gives a pipe
LONG_CONSUMER = "spark:" + "c" * 150 + ":0:4242"
EXIT_SERVER_DOWN = 3


def stats(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`conveyor stats` with stdout a pipe, and no COLUMNS to widen it."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "conveyor", "stats", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def cells(out: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is `first`."""
    for line in out.splitlines():
        row = [c.strip() for c in line.strip().strip("│").split("│")]
        if row and row[0] == first:
            return row
    raise AssertionError(f"no row {first!r} in:\n{out}")


@pytest.mark.timeout(120)
def test_stats_shows_the_servers_that_answer_and_marks_a_killed_one_down() -> None:
    with QueuePool.local(n_servers=2, batch_size=10) as pool:
        pool.put(LONG_QUEUE, [Message(payload=b"m%d" % i) for i in range(30)])  # 20 on the first server, 10 on the other
        pool.queues.report(LONG_CONSUMER, {"processed": 7, "pid": 4242})
        pool.queues.clients[0].call(calls.report("on-host", {"processed": 1, "host": "box-1.example"}))
        live = pool.queues.shard_stats(LONG_QUEUE)[0][LONG_QUEUE].ready
        a, b = pool.addresses
        out = stats("--connect", f"{a},{b}")
        assert out.returncode == 0, out.stderr
        assert cells(out.stdout, a)[1] == "UP" and cells(out.stdout, b)[1] == "UP"
        assert cells(out.stdout, LONG_QUEUE)[1] == "30"  # the whole name on one line, the counts summed
        assert cells(out.stdout, LONG_CONSUMER)[2] == "7"
        assert cells(out.stdout, "on-host")[1:3] == ["box-1.example", "1"]

        pool.servers.processes[1].kill()  # SIGKILL: gone without a word
        pool.servers.processes[1].wait(30)
        started = time.monotonic()
        out = stats("--connect", f"{a},{b}", "--timeout", "2")
        assert time.monotonic() - started < 15
        assert out.returncode == EXIT_SERVER_DOWN, out.stdout + out.stderr
        assert cells(out.stdout, a)[1] == "UP"
        down = cells(out.stdout, b)
        assert down[1] == "DOWN" and f"cannot connect to {b}" in down[-1] and "Connection refused" in down[-1]
        assert "Queues on 1 of 2 server(s)" in out.stdout
        assert cells(out.stdout, LONG_QUEUE)[1] == str(live)  # what the live server holds
        assert cells(out.stdout, LONG_CONSUMER)[2] == "7"  # consumers report to every server
        out = stats("--help")
        assert f"; {EXIT_SERVER_DOWN} when one did not" in " ".join(out.stdout.split())


@pytest.mark.timeout(120)
def test_watch_shows_a_server_going_down_and_coming_back(tmp_path: Path) -> None:
    a_proc, a = spawn_server(tmp_path / "a")
    b = f"tcp://127.0.0.1:{free_port()}"
    b_proc, _ = spawn_server(tmp_path / "b", port=int(b.rsplit(":", 1)[1]))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    watch = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "stats", "--connect", f"{a},{b}", "--watch", "0.2", "--timeout", "1"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(watch.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()

    def state_of_b(after: int = 0) -> list[str]:
        return [m.group(1) for line in lines[after:] if (m := re.search(re.escape(b) + r"\s*│\s*(UP|DOWN)\b", line))]

    try:
        wait_for(lambda: "UP" in state_of_b(), timeout=30, what="b shown UP")
        b_proc.kill()
        stop_server(b_proc)  # waits for it, and closes our end of its stdin
        seen = len(lines)
        wait_for(lambda: "DOWN" in state_of_b(seen), timeout=30, what="b shown DOWN")
        assert any("Connection refused" in line or "connection lost" in line for line in lines[seen:])
        b_proc, _ = spawn_server(tmp_path / "b", port=int(b.rsplit(":", 1)[1]))
        seen = len(lines)
        wait_for(lambda: "UP" in state_of_b(seen), timeout=30, what="b shown UP again")
        assert watch.poll() is None  # the watch went on throughout
    finally:
        watch.terminate()
        watch.wait(30)
        reader.join(30)
        watch.stdout.close()  # type: ignore[union-attr]
        stop_server(b_proc)
        stop_server(a_proc)


@pytest.mark.timeout(120)
def test_a_consumer_that_stops_reporting_leaves_the_table() -> None:
    with QueuePool.local(n_servers=2) as pool:
        stop = threading.Event()

        def keep_reporting() -> None:  # as a live consumer does, every 2 s
            while not stop.is_set():
                pool.queues.report("stays", {"processed": 1})
                stop.wait(0.5)

        reporter = threading.Thread(target=keep_reporting, daemon=True)
        reporter.start()
        try:
            started = time.monotonic()
            pool.queues.report("goes", {"processed": 2})
            assert {"stays", "goes"} <= set(pool.queues.workers()) and pool.queues.workers()["goes"]["seen"] < WORKER_GONE_S
            wait_for(lambda: "goes" not in pool.queues.workers(), timeout=WORKER_GONE_S + 10, what="the silent consumer gone")
            assert time.monotonic() - started >= WORKER_GONE_S - 0.5  # not before its time
            assert "stays" in pool.queues.workers()
            out = stats("--connect", ",".join(pool.addresses))
            assert out.returncode == 0, out.stderr
            assert "Consumers: 1" in out.stdout and cells(out.stdout, "stays")[2] == "1" and "goes" not in out.stdout
        finally:
            stop.set()
            reporter.join(30)
