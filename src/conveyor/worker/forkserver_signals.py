"""SIGTERM in the fork servers Conveyor starts: ignored there, its default action in what they fork.

`spawning.process_context` preloads this module. A fork server ignores SIGTERM, as multiprocessing
already makes it ignore SIGINT, and the processes it forks start with its default action all the
same (`default_sigterm_in_forks`). Imported anywhere else, it changes nothing.

A stop sent to a worker's whole process group (systemd's default KillMode=control-group, `kill -TERM
-PGID`) would otherwise kill the fork server, and the pool would read its consumers as gone (their
exit status comes through the fork server) and exit under them while they still finish their tasks;
seeing it gone, they would abandon those tasks. What it forks is not to inherit its immunity: a
consumer sets its own handlers, a task process lets SIGTERM pass on its own terms (`executors`), and
any other process forked from a fork server shared with the program (Python 3.14's default start
method) must end on `terminate()` as anywhere else.
"""

from __future__ import annotations

import multiprocessing.forkserver
import os
import signal
import sys
from types import FrameType


def _default_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def default_sigterm_in_forks() -> None:
    """Make the processes this one forks from now on start with SIGTERM's default action.

    So do those forked by `os.fork` or by multiprocessing's fork, whatever this process does with
    SIGTERM; and those they fork, in turn.
    """
    os.register_at_fork(after_in_child=_default_sigterm)


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
    default_sigterm_in_forks()
