"""`conveyor worker` started as a user starts it: the command in a child process of its own.

For the tests that signal, stop or kill a worker (tests/worker/test_worker_stops.py,
test_task_processes.py, test_worker_outages.py). It runs from the checkout, where the test tasks
(`tests.support.worker_tasks`) import.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]  # the checkout
TASKS = "tests.support.worker_tasks"


def worker_args(addresses: Sequence[str], *args: str, queue: str = "jobs", concurrency: int = 2) -> list[str]:
    """The command line of `conveyor worker` on `addresses`, the test tasks, `queue` and `concurrency` slots; then `args`."""
    return [
        sys.executable,
        "-m",
        "conveyor",
        "worker",
        "--connect",
        ",".join(addresses),
        "--tasks",
        TASKS,
        "--queues",
        queue,
        "--concurrency",
        str(concurrency),
        *args,
    ]


def start_worker(
    addresses: Sequence[str],
    *args: str,
    queue: str = "jobs",
    concurrency: int = 2,
    stderr: IO[str] | int = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """`conveyor worker` in a session of its own: its process group is its own, as under systemd or a shell's job."""
    cmd = worker_args(addresses, *args, queue=queue, concurrency=concurrency)
    return subprocess.Popen(cmd, cwd=ROOT, stderr=stderr, text=True, start_new_session=True)
