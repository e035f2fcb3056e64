"""Processes the tests start and must see gone.

Spark daemons (a standalone cluster, a Spark Connect server) started in sessions of their own,
waited for and killed with everything under them, and the process trees of other children (a pool's
process and what it started).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLL_S = 0.1
TAIL_CHARS = 4000


# --- processes ------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, from /proc; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
    return fields[0], int(fields[1])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (whatever their process group), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[1], []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        tree.append(p)
        todo += children.get(p, [])
    return tree


def kill_tree(proc: subprocess.Popen[Any]) -> list[int]:
    """SIGKILL a child started in its own session: its process group and every descendant; returns their pids.

    Descendants in other groups (Spark's Python daemon makes its own) are found through /proc while
    the child runs; once it has exited, its group is still killed (what it left behind).
    """
    pids = process_tree(proc.pid) if proc.poll() is None else []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    return pids


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Poll until none of `pids` runs; returns those still running at the deadline."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return left


def tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-TAIL_CHARS:]
    except OSError as e:
        return f"({path}: {e})"


# --- daemons ----------------------------------------------------------------------------------
@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    webui_port: int


def spawn(name: str, program: str, args: list[str], env: dict[str, str], logs: Path, webui_port: int = 0) -> Daemon:
    """Start `$SPARK_HOME/bin/<program> args...` in a session of its own, its output in `logs/<name>.log`."""
    log = logs / f"{name}.log"
    with open(log, "wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [str(Path(env["SPARK_HOME"]) / "bin" / program), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Daemon(name, proc, log, webui_port)


def wait_until(what: str, ready: Callable[[], bool], daemons: list[Daemon], timeout: float, logs: Callable[[], str]) -> None:
    """Poll `ready()` until it returns something true; fail if a daemon exits or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        dead = [f"{d.name} (exit {d.proc.returncode})" for d in daemons if d.proc.poll() is not None]
        assert not dead, f"waiting for {what}: {', '.join(dead)} exited\n{logs()}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s\n{logs()}"
        time.sleep(POLL_S)
