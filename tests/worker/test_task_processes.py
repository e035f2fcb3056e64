"""Task processes (process mode) and the signals around them, with real worker processes.

A signal to the consumer's process group (Ctrl-C) leaves a running task, and the programs it
started, to finish; a consumer that dies without stopping its task processes takes them with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool

from ..support import worker_tasks as wt
from ..support.servers import wait_for
from ..support.worker_command import start_worker

pytestmark = pytest.mark.timeout(90)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")  # a zombie is gone


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_workers_group_lets_the_running_task_and_its_program_finish(tmp_path: Path, sig: int) -> None:
    with QueuePool.local(n_servers=1) as pool:
        out = tmp_path / "task.log"
        handle = wt.runs_a_program.publish(2.0, str(out), _pool=pool)
        worker = start_worker(pool.addresses, "--pool", "process", concurrency=1, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: _lines(out), 30, "the task to start")
            os.killpg(worker.pid, sig)  # as Ctrl-C does, or a service manager stopping the group
            assert worker.wait(30) == 0, worker.stderr.read() if worker.stderr else ""
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(10)
            if worker.stderr:
                worker.stderr.close()
        assert _lines(out)[-1] == "done 0"  # the program ran to its end, not killed by the signal
        assert handle.result(timeout=10) == 0


def test_task_processes_go_with_a_consumer_that_dies(tmp_path: Path) -> None:
    with QueuePool.local(n_servers=1) as pool:
        out = tmp_path / "task.log"
        wt.runs_a_program.publish(60.0, str(out), _pool=pool)
        worker = start_worker(pool.addresses, "--pool", "process", concurrency=1, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: _lines(out), 30, "the task to start")
            child = int(_lines(out)[0].split()[1])
            worker.kill()  # SIGKILL: nothing of the consumer runs to stop its task processes
            worker.wait(10)
            wait_for(lambda: not _alive(child), 10, "the task process to exit with its consumer")
        finally:
            with contextlib.suppress(ProcessLookupError):  # the worker's group (its fork server), all of it gone
                os.killpg(worker.pid, signal.SIGKILL)
