"""`conveyor inspect`: what each consumer runs now, across the servers of a pool, with real servers and consumers.

The command is `conveyor.cli.inspect`, run as `python -m conveyor inspect`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conveyor.cli.inspect import duration
from conveyor.client.pool import QueuePool
from conveyor.client.sharded import format_id, parse_id
from conveyor.worker import Consumer

from ..support import worker_tasks as wt
from ..support.servers import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXIT_SERVER_DOWN = 3
TASK = "tests.support.worker_tasks.waits_for_file"


def inspect(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "conveyor", "inspect", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def row(out: str, first: str) -> list[str]:
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{out}")


@pytest.mark.timeout(180)
def test_inspect_shows_each_consumers_running_tasks_across_the_servers(tmp_path: Path) -> None:
    release = tmp_path / "go"
    with QueuePool.local(n_servers=2) as pool:
        handles = [wt.waits_for_file.publish(str(release), 120.0, _pool=pool) for _ in range(2)]  # one per server
        consumers = [
            Consumer(pool.queues, ["jobs"], concurrency=1, task_modules=["tests.support.worker_tasks"], name=f"inspect-{i}")
            for i in range(2)
        ]
        threads = [threading.Thread(target=c.run) for c in consumers]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: pool.queues.tasks("jobs").running_total == 2, 30, "both tasks running")
            a, b = pool.addresses
            out = inspect("--connect", f"{a},{b}")
            assert out.returncode == 0, out.stderr
            assert "Running: 2 task(s) on 2 consumer(s)" in out.stdout
            by_id = {h.id: h for h in handles}
            seen = set()
            for name in ("inspect-0", "inspect-1"):
                _, queue, task, msg_id, attempt, running_for = row(out.stdout, name)
                assert (queue, task, attempt) == ("jobs", TASK, "1") and parse_id(msg_id) in by_id
                assert running_for.endswith(("ms", " s"))
                seen.add(msg_id)
            assert seen == {format_id(i) for i in by_id}  # pool-wide ids, as publish gave them, shown as shard:n

            js = inspect("--connect", a, "--connect", b, "--json", "--consumer", "inspect-1")
            assert js.returncode == 0, js.stderr
            got = json.loads(js.stdout)
            (only,) = got["running"]
            assert (only["consumer"], only["queue"], only["task"], only["attempt"]) == ("inspect-1", "jobs", TASK, 1)
            assert parse_id(only["id"]) in by_id and only["running_s"] >= 0 and got["unreachable"] == {}

            empty = inspect("--connect", a, "--task", "no.such.task")
            assert empty.returncode == 0 and "Running: 0 task(s)" in empty.stdout
            missing = inspect("--connect", a, "-Q", "nowhere")
            assert missing.returncode == 1 and "no queue named 'nowhere'" in missing.stderr
        finally:
            release.touch()
            pool.gather(handles, timeout=60)
            for c in consumers:
                c.stop()
            for t in threads:
                t.join(30)
        after = inspect("--connect", a, "--json")
        assert json.loads(after.stdout)["running"] == []


@pytest.mark.timeout(120)
def test_a_server_that_does_not_answer_is_named_and_the_others_shown() -> None:
    with QueuePool.local(n_servers=1) as pool:
        (up,) = pool.addresses
        down = "tcp://127.0.0.1:1"  # nothing listens there
        out = inspect("--connect", f"{up},{down}", "--timeout", "1")
        assert out.returncode == EXIT_SERVER_DOWN, out.stderr
        assert "Running: 0 task(s)" in out.stdout and f"{down} did not answer" in out.stderr


def test_durations_read_as_a_person_reads_them() -> None:
    assert [duration(s) for s in (0.25, 12.46, 200, 7500)] == ["250 ms", "12.5 s", "3 min 20 s", "2 h 05 min"]
