"""A core of its own for a consumer whose tasks are CPU-bound threads (Linux).

A thread-mode consumer runs Python on one core at a time (the GIL), yet the OS can move its threads
between cores at a GIL hand-off, and a core can sit idle while the woken thread waits to be
run on the other. Pinning the consumer to one core avoids that (measured on the skewed workload,
2 consumers on 2 cores: efficiency 0.91 unpinned, 0.94 pinned, medians of 3).

Consumers on one host share out the cores through lock files, one per core, in a directory of the
user's under the temporary directory (or the one CORE_LOCK_DIR_ENV names: consumers that share it share
the cores): a consumer takes the first core whose file it can lock and holds the lock while it runs.
The kernel drops the lock when the process dies, even by SIGKILL. With every core taken, a consumer
runs unpinned.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from conveyor.constants import DEFAULT_ASYNC_CONCURRENCY, DEFAULT_CONCURRENCY

log = logging.getLogger("conveyor.worker")

CORE_LOCK_DIR = "conveyor-cores-{uid}"
CORE_LOCK_DIR_ENV = "CONVEYOR_CORE_LOCK_DIR"  # where the lock files are instead, if set
CORE_LOCK_NAME = "core-{}.lock"


@dataclass
class CorePin:
    """This thread (and the threads it starts from now on) pinned to `core`; `release()` undoes it."""

    core: int
    before: set[int]
    _fd: int

    def release(self) -> None:
        """Back to the cores this thread had before, and the core free for another consumer."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, self.before)
        os.close(self._fd)
        self._fd = -1


def check_pin(pin_core: bool | None, pool: str) -> None:
    """Refuse pinning where it does not apply."""
    if pin_core and pool != "thread":
        raise ValueError("pin_core is for pool='thread': the OS spreads task processes over the cores")


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_slots(pool: str, consumers: int, cores: int | None = None) -> int:
    """A consumer's `concurrency` when none is given.

    DEFAULT_CONCURRENCY threads; DEFAULT_ASYNC_CONCURRENCY calls in flight on an event loop; or
    child processes for its share of the `cores` (default: this process's) among `consumers`, plus
    one to start a task while another's result travels. More processes than cores only share them
    out (measured: 8 per consumer on a core each ran 1.4x slower than 2-3).
    """
    if pool == "async":
        return DEFAULT_ASYNC_CONCURRENCY
    if pool != "process":
        return DEFAULT_CONCURRENCY
    return max(1, (cores or usable_cores()) // max(1, consumers)) + 1


def resolve_slots(concurrency: int | None, pool: str, consumers: int, cores: int | None = None) -> tuple[int, bool]:
    """(slots, defaulted) of a consumer.

    Slots: `concurrency` as given, which also bounds the messages it holds; left out (None),
    `default_slots`, and (defaulted) the consumer may hold quick tasks beyond its slots
    (worker/pacing.py) and, in thread mode, add threads while its tasks wait
    (worker/thread_scaling.py). A crash of the consumer's process returns the messages held after
    their lease, an attempt spent: a bound given keeps that to the slots.
    """
    if concurrency is not None:
        return concurrency, False  # checked by ConsumerOptions
    return default_slots(pool, consumers, cores), True


def auto_pin(pin_core: bool | None, pool: str, consumers: int, cores: int | None = None) -> bool:
    """Whether consumers pin.

    As told, or (None, the default) in thread mode when there are at least as many `consumers` as
    `cores` (default: the cores this process may use). One consumer per core then gains by keeping to
    its own core; with cores to spare a consumer is better left free to use several (tasks in native
    code that releases the GIL).
    """
    check_pin(pin_core, pool)
    if pin_core is not None:
        return pin_core
    return pool == "thread" and consumers >= (cores or usable_cores())


def pin_core(lock_dir: Path | None = None) -> CorePin | None:
    """Pin the calling thread to a core no other consumer on this host holds.

    None when every core is held or the platform cannot pin (the consumer then runs as it would
    have).
    """
    if not hasattr(os, "sched_setaffinity"):
        log.warning("this platform cannot pin a thread to a core: the consumer runs unpinned")
        return None
    import fcntl  # where sched_setaffinity is, so is fcntl

    before = os.sched_getaffinity(0)
    given = lock_dir or os.environ.get(CORE_LOCK_DIR_ENV)
    directory = Path(given) if given else Path(tempfile.gettempdir()) / CORE_LOCK_DIR.format(uid=os.getuid())
    directory.mkdir(mode=0o700, exist_ok=True)
    for core in sorted(before):
        fd = os.open(directory / CORE_LOCK_NAME.format(core), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.sched_setaffinity(0, {core})
        return CorePin(core, before, fd)
    log.info("every core of this host (%s) is held by another consumer: this one runs unpinned", sorted(before))
    return None
