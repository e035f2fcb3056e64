"""Starting and stopping queue server processes (`conveyor serve` in a child process)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from conveyor.errors import ConveyorError

SERVER_START_TIMEOUT_S = 30.0


def spawn_server(
    data_dir: str | Path | None,
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    token: str | None = None,
    args: Sequence[str] = (),
    stderr: Any = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `conveyor serve` on `host` in a child process; returns it and its address once it listens.

    The server logs to `stderr` (default: this process's stderr). It stops when this process ends,
    even by SIGKILL (`--stop-with-parent`, its stdin a pipe from here), or when `stop_server` stops it,
    and not before: it runs in a session of its own, so that a terminal's Ctrl-C (SIGINT to the whole
    foreground process group) reaches this process and its consumers but not the servers they still
    settle their work with.
    """
    return listening(start_server(data_dir, port, host=host, token=token, args=args, stderr=stderr))


def start_server(
    data_dir: str | Path | None,
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    token: str | None = None,
    args: Sequence[str] = (),
    stderr: Any = None,
) -> subprocess.Popen[bytes]:
    """`spawn_server` without waiting: several servers start at once, then `listening` waits for each."""
    cmd = [sys.executable, "-m", "conveyor", "serve", "--host", host, "--port", str(port), "--stop-with-parent", *args]
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    env = {k: v for k, v in os.environ.items() if k not in ("CONVEYOR_TOKEN", "CONVEYOR_TOKEN_FILE")}  # the pool's own
    if token:
        env["CONVEYOR_TOKEN"] = token  # not on the command line, where `ps` would show it
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.PIPE, stderr=stderr, env=env, start_new_session=True)


def listening(proc: subprocess.Popen[bytes]) -> tuple[subprocess.Popen[bytes], str]:
    """Wait (up to SERVER_START_TIMEOUT_S) for a started server to say it listens; (it, its address)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        chunk = os.read(proc.stdout.fileno(), 4096) if left > 0 and select.select([proc.stdout], [], [], left)[0] else None
        if not chunk:
            proc.kill()
            stop_server(proc)  # reaps it and closes its stdin
            proc.stdout.close()
            why = (
                f"did not start within {SERVER_START_TIMEOUT_S:.0f} s"
                if chunk is None
                else f"exited with code {proc.returncode} before listening (see its errors above)"
            )
            raise ConveyorError(f"queue server {why}: {' '.join(cast('list[str]', proc.args))}")
        line += chunk
    proc.stdout.close()  # the rest is not read: the server does not wait for it to be
    return proc, line.decode().splitlines()[0].split()[-1]  # "listening on ADDRESS"; more lines may follow


def stop_server(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM (a clean stop: stores closed), then SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdin is not None:
        proc.stdin.close()
