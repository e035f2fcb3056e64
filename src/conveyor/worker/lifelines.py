"""Worker processes never outlive the process that started them, even one killed by SIGKILL.

A consumer process stops at once when its pool's process is gone (`stop_with_parent`), a task
process exits when its consumer is (`exit_with`), whatever ended the parent, even SIGKILL.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
from typing import Protocol

from conveyor.constants import PARENT_CHECK_S

log = logging.getLogger("conveyor.worker")

PARENT_GONE_EXIT_S = 8.0  # a consumer whose pool process is gone exits within this time


class Stoppable(Protocol):
    name: str

    def stop(self, graceful: bool = True) -> None: ...


def exit_with(sentinel: int) -> None:
    """Exit this process as soon as `sentinel` (its parent's) is ready: the parent is gone."""
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


def stop_with_parent(parent: multiprocessing.process.BaseProcess, consumer: Stoppable, done: threading.Event) -> None:
    """Stop at once when the parent exits.

    The pool is gone (with it, likely, the servers it started), so running tasks are handed back, or
    come back by lease, rather than waited for.
    """
    # the sentinel closes when the parent exits, unless a child it forked holds it open: hence
    # also a look whether the parent still exists
    while parent.is_alive() and parent.pid is not None and _exists(parent.pid):
        parent.join(PARENT_CHECK_S)
    log.warning("consumer %s: the process that started it is gone: stopping now", consumer.name)
    consumer.stop(graceful=False)
    # then exit without the interpreter's wait for threads: a request to a server that is gone
    # can keep trying to connect for a while
    done.wait(PARENT_GONE_EXIT_S)
    for child in multiprocessing.active_children():  # task processes (process mode) go too
        child.kill()
    os._exit(1)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        pass
    return True
