"""Tasks the worker tests run, in a module worker processes import (`task_modules`).

Tasks that must leave a trace across processes append a line to a file named by their arguments.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import conveyor
from conveyor import Task


def note(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()


@conveyor.task(queue="jobs", max_retries=2, retry_backoff=0.05)
def add(a: int, b: int) -> int:
    return a + b


@conveyor.task(queue="jobs2", max_retries=2, retry_backoff=0.05)
def add_too(a: int, b: int) -> int:
    """`add` on a queue of its own: two workers at once, each with its own work and counts."""
    return a + b


@conveyor.task(queue="jobs", max_retries=2, retry_backoff=(0.2, 2.0))
def always_fails(log: str) -> None:
    note(log, f"{time.time()}")
    raise ValueError("this input is bad")


class Unfixable(Exception):
    retryable = False


@conveyor.task(queue="jobs", max_retries=5)
def fails_for_good() -> None:
    raise Unfixable("no retry can mend this")


@conveyor.task(queue="jobs", max_retries=5, no_retry=(KeyError,))
def listed_no_retry() -> None:
    raise KeyError("missing")


@conveyor.task(queue="jobs", max_retries=3, retry_backoff=0.05)
def flaky(log: str, fail_times: int) -> str:
    """Fails its first `fail_times` runs (counted in the log file), then succeeds."""
    runs = Path(log).read_text().count("\n") if os.path.exists(log) else 0
    note(log, f"{time.time()}")
    if runs < fail_times:
        raise ConnectionError(f"transient failure {runs + 1}")
    return f"ok after {runs + 1}"


@conveyor.task(queue="jobs", time_limit=0.5, max_retries=0)
def sleeps(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@conveyor.task(queue="jobs", time_limit=0.3, max_retries=2, retry_backoff=0.05)
def hangs(seconds: float) -> None:
    """A task that hangs (past its time limit) on every attempt."""
    time.sleep(seconds)


@conveyor.task(queue="jobs", max_retries=0)
def pid_of_worker() -> int:
    return os.getpid()


@conveyor.task(queue="jobs", max_retries=0)
def env_of_worker(name: str) -> str | None:
    return os.environ.get(name)


@conveyor.task(queue="jobs", max_retries=0)
def cores_of_worker(seconds: float = 0.0) -> tuple[int, list[int]]:
    """The worker's pid and the cores this task's thread may run on (after `seconds` of sleep)."""
    time.sleep(seconds)
    return os.getpid(), sorted(os.sched_getaffinity(0))


_running = [0]
_running_lock = threading.Lock()


@conveyor.task(queue="jobs", max_retries=0)
def running_at_start(seconds: float) -> int:
    """Sleeps; returns how many of these tasks ran in this process when it started (itself included)."""
    with _running_lock:
        _running[0] += 1
        now = _running[0]
    try:
        time.sleep(seconds)
    finally:
        with _running_lock:
            _running[0] -= 1
    return now


@conveyor.task(queue="jobs", max_retries=3)
def slow_once(log: str, seconds: float) -> str:
    """Sleeps, then records that it finished (for counting runs across killed workers)."""
    time.sleep(seconds)
    note(log, "done")
    return "finished"


@conveyor.task(queue="jobs", max_retries=2)
def kills_its_worker() -> None:
    os._exit(13)


@conveyor.task(queue="jobs", max_retries=0)
def spin(seconds: float) -> float:
    """Busy CPU for `seconds` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return seconds


class Hooked(Task):
    """Records its hooks in order, in the file named by app_data["log"]."""

    queue = "jobs"
    max_retries = 0

    def before_run(self, *args: Any, **kwargs: Any) -> None:
        note(self.app_data["log"], "before_run")

    def run_task(self, x: int, fail: bool = False) -> dict[str, Any]:
        note(self.app_data["log"], f"run_task {x} attempt {self.attempt}")
        if fail:
            raise RuntimeError("asked to fail")
        return {"x": x, "app_data": self.app_data}

    def after_run(self, result: Any, *args: Any, **kwargs: Any) -> None:
        note(self.app_data["log"], "after_run")

    def on_failure(self, exc: Exception, *args: Any, **kwargs: Any) -> None:
        note(self.app_data["log"], f"on_failure {type(exc).__name__}")

    def cleanup(self, exc: Exception | None) -> None:
        note(self.app_data["log"], f"cleanup {type(exc).__name__ if exc else None}")


class Unprintable(Exception):
    """An exception that cannot even say what it is."""

    def __str__(self) -> str:
        raise RuntimeError("no words for this")

    def __repr__(self) -> str:
        raise RuntimeError("nor these")


@conveyor.task(queue="jobs", max_retries=0)
def raises_unprintable() -> None:
    raise Unprintable()


@conveyor.task(queue="jobs", max_retries=0)
def exits(code: int) -> None:
    raise SystemExit(code)


@conveyor.task(queue="jobs", max_retries=0)
def returns_bytes(n: int) -> bytes:
    return b"r" * n


@conveyor.task(queue="jobs", max_retries=0)
def runs_a_program(seconds: float, path: str) -> int:
    """Notes its pid, runs `sleep` as a child program, then notes how it ended."""
    import subprocess

    note(path, f"pid {os.getpid()}")
    code = subprocess.run(["sleep", str(seconds)], check=False).returncode
    note(path, f"done {code}")
    return code


@conveyor.task(queue="jobs", max_retries=0)
def naps(log: str, tag: int, seconds: float) -> int:
    """Notes its start, sleeps, notes its end: the log tells which ran, how often, and whether they finished.

    No retries: a worker's stop that counted an attempt would make it a dead letter.
    """
    note(log, f"start {tag}")
    time.sleep(seconds)
    note(log, f"done {tag}")
    return tag


@conveyor.task(queue="jobs", max_retries=0)
def terminates_its_children() -> list[int | None]:
    """Starts a program and forks a process, terminates each once it runs; how each ended.

    Starts a program and forks a process, both asleep, and once each says it runs, terminates it
    (SIGTERM): how each ended (its exit status as subprocess gives it; None: still running 10 s
    later, the signal ignored).
    """
    import signal
    import subprocess
    import sys

    asleep = "import time; print('up', flush=True); time.sleep(60)"
    program = subprocess.Popen([sys.executable, "-c", asleep], stdout=subprocess.PIPE, text=True)
    read, write = os.pipe()
    forked = os.fork()
    if forked == 0:  # the child: asleep until a signal ends it
        os.write(write, b"up")
        time.sleep(60)
        os._exit(0)
    os.close(write)
    assert program.stdout is not None and program.stdout.readline() and os.read(read, 2)  # both run: EOF if one died
    program.terminate()
    os.kill(forked, signal.SIGTERM)
    try:
        code: int | None = program.wait(timeout=10)
    except subprocess.TimeoutExpired:
        code = None
    deadline, status = time.monotonic() + 10, None
    while status is None and time.monotonic() < deadline:  # bounded: None after 10 s says it ignored the signal
        pid, raw = os.waitpid(forked, os.WNOHANG)
        status = os.waitstatus_to_exitcode(raw) if pid else None
        time.sleep(0.05)
    program.kill()
    program.wait()
    if status is None:
        os.kill(forked, signal.SIGKILL)
        os.waitpid(forked, 0)
    os.close(read)
    return [code, status]


@conveyor.task(queue="jobs", max_retries=0)
def starts_then_waits_for_file(log: str, path: str, timeout_s: float) -> str:
    """Notes in `log` that it started, runs until `path` exists (as `waits_for_file`), then notes that it finished."""
    note(log, "started")
    waits_for_file(path, timeout_s)
    note(log, "done")
    return "finished"


@conveyor.task(queue="jobs", max_retries=0)
def waits_for_file(path: str, timeout_s: float) -> str:
    """Runs until the file `path` exists (at most `timeout_s`): a test says when it ends, no timing guessed."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.01)
    return "released"
