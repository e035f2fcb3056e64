"""Imported by the fork servers Conveyor starts (`spawning.process_context` preloads it), and by no
other process: a fork server ignores SIGTERM, as multiprocessing already makes it ignore SIGINT.

A stop sent to a worker's whole process group (systemd's default KillMode=control-group, `kill -TERM
-PGID`) would otherwise kill the fork server, and the pool would read its consumers as gone (their
exit status comes through the fork server) and exit under them while they still finish their tasks;
seeing it gone, they would abandon those tasks. The processes it forks inherit the disposition: a
consumer process sets its own handlers, and a task process keeps ignoring SIGTERM (its consumer ends
it after its task).
"""

from __future__ import annotations

import multiprocessing.forkserver
import signal
import sys
from types import FrameType


def _in_fork_server() -> bool:
    """Whether this import runs in a fork server's start (its `main`, which imports the preloaded modules)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is multiprocessing.forkserver.main.__code__:
            return True
        frame = frame.f_back
    return False


if _in_fork_server():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
