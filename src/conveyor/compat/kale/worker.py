"""ndkale's worker (`kale.worker.Worker().run()`): a Conveyor `Consumer` driven by the kale settings.

It serves the QUEUE_CONFIG queues with the QUEUE_SELECTOR, CONVEYOR_CONCURRENCY slots (1: ndkale's
one task at a time) in CONVEYOR_MODE ("process": each slot a child process, so a task past its
bound is killed). The bound is ndkale's: a task stops at its `time_limit` (inside the task, with
`TimeoutException`, then `handle_failure`), and never runs past its queue's
`visibility_timeout_sec`, the batch SLA, even with `time_limit = None` (there it is stopped from
outside and retried). A failed task that `handle_failure` retries is re-published by it, after the
class's `_get_delay_sec_for_retry(retry_num)` seconds; a delivery Conveyor retries itself waits as
long (`HandleFailureDelays`).

ON_WORKER_STARTUP runs, as in ndkale, in every process that runs the project's code, before it
does: in the worker's own process when it is made (it imports task modules to ask their retry
delays, and runs the QUEUE_SELECTOR), and in process mode also in each task child process (a
replacement too) before it takes work. ON_WORKER_SHUTDOWN runs as each of them ends (a task child:
when the worker closes it; not for one killed, past its bound or on a hard stop). SIGTERM, SIGINT,
SIGQUIT and SIGABRT stop it gracefully (running tasks finish; task children ignore the first three,
so one sent to the whole process group does not kill them); a second one stops it at once. It exits
with status 1 once its resident memory passes DIE_ON_RESIDENT_SET_SIZE_MB, as ndkale's, saying so
on stderr.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys

from conveyor.compat.kale import publisher, queue_info, queue_selector, settings, task
from conveyor.constants import H_TASK
from conveyor.errors import TaskError, UnknownTaskError
from conveyor.message import Message
from conveyor.tasks.envelope import decode_call
from conveyor.tasks.policy import is_number, time_limit_of
from conveyor.tasks.queue_config import QueueConfig
from conveyor.tasks.registry import registry
from conveyor.worker.consumer import Consumer
from conveyor.worker.hooks import add_child_hooks
from conveyor.worker.middleware import Decision, Middleware, Retries
from conveyor.worker.stats import ConsumerStats

log = logging.getLogger(__name__)

SIGNALS_TO_HANDLE = (signal.SIGABRT, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)
# what the task processes import: the task resolver (tasks found by `module.Class`, as ndkale did), and
# this module, whose import gives them the startup and shutdown hooks
TASK_MODULES = (task.__name__, __name__)  # imported here too: thread slots resolve tasks in this process
TIMEOUT_GRACE_S = 2.0  # past its time_limit, a task that did not stop on TimeoutException is stopped from outside


def resident_kb() -> int:
    """This process's resident set size now, in KB.

    Not `ru_maxrss`: that is a peak, and Linux carries the peak across `exec`, so a worker
    started by a large process (a test runner, a supervisor that forks) would begin "over" it.
    Where /proc is missing, the peak is the best measure there is (bytes on macOS).
    """
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak // 1024 if sys.platform == "darwin" else peak


class QueueSLA(Middleware):
    """ndkale's bound on a task from outside: its queue's visibility timeout (the batch SLA).

    Its time limit acts inside it (TimeoutException), and `handle_failure` and the clean-up run
    after that, unbounded by it, as in ndkale; only for a queue without a visibility timeout is the
    time limit (plus a grace for the exception to act first) the bound from outside.
    """

    def __init__(self, queues: list[QueueConfig]) -> None:
        self.sla = {q.name: q.visibility_timeout_sec for q in queues}

    def deadline(self, message: Message, started: float) -> float | None:
        if (sla := self.sla.get(message.queue)) is not None:
            return started + sla
        limit = time_limit_of(message.headers)
        return None if limit is None else started + limit + TIMEOUT_GRACE_S


class HandleFailureDelays(Middleware):
    """ndkale's retry delay, for a delivery Conveyor retries itself.

    A kale task's retries are re-publishes (`task.Task.republish`), which set their own delay. A
    delivery that fails otherwise and is retried by Conveyor (its task's process died, it ran past
    its queue's visibility timeout, or `handle_failure` said retry without re-publishing) waits the
    class's `_get_delay_sec_for_retry(retry_num)` seconds, `retry_num` the one the failed delivery
    ran with. Anything else, or a class that cannot be found or a delay that is not a number >= 0,
    is left to `Retries`.
    """

    def on_failure(self, message: Message, error: TaskError) -> Decision | None:
        if not error.retryable or message.attempts >= message.max_attempts:
            return None
        try:
            cls = registry.get(message.headers.get(H_TASK, "?"))
        except UnknownTaskError as e:
            log.warning("no retry delay asked: %s; the retry waits the backoff its message carries", e)
            return None
        if not (isinstance(cls, type) and issubclass(cls, task.Task)):
            return None
        try:
            delay = cls._get_delay_sec_for_retry(_retry_num(message))
        except Exception:
            log.exception("%s._get_delay_sec_for_retry raised: the retry waits the default backoff", cls.__qualname__)
            return None
        if not (is_number(delay) and delay >= 0):
            log.warning(
                "%s._get_delay_sec_for_retry returned %r, not seconds >= 0: the retry waits the default backoff",
                cls.__qualname__,
                delay,
            )
            return None
        return Decision(final=False, delay_s=float(delay))


def _retry_num(message: Message) -> int:
    """The `task_retry_num` a failed delivery ran with: its published count plus Conveyor's redeliveries."""
    try:
        entry = publisher.KaleEntry.unpack(decode_call(message.payload, message.headers).app_data)
    except Exception:  # a payload this process cannot decode (a class it cannot import): its count is unknown
        entry = None
    return (entry.retry_num if entry is not None else 0) + max(message.attempts - 1, 0)


def _child_startup() -> None:
    settings.current().ON_WORKER_STARTUP()


def _child_shutdown() -> None:
    settings.current().ON_WORKER_SHUTDOWN()


add_child_hooks(_child_startup, _child_shutdown)  # run by task child processes (CONVEYOR_MODE "process")


class Worker:
    """A kale worker: `Worker().run()` serves tasks until a signal stops it."""

    def __init__(self) -> None:
        s = settings.current()
        self._queues = queue_info.served_configs()
        selector = queue_selector.make_selector(s.QUEUE_SELECTOR)
        self._max_rss_kb = s.DIE_ON_RESIDENT_SET_SIZE_MB * 1024
        self._over_memory = False
        middleware = [QueueSLA(self._queues), HandleFailureDelays(), Retries()]
        self._consumer = Consumer(
            publisher.get_pool().queues,
            self._queues,
            concurrency=s.CONVEYOR_CONCURRENCY,
            pool=s.CONVEYOR_MODE,
            selector=selector,
            middleware=middleware,
            task_modules=TASK_MODULES,
            stop_when=self._check_process_resources,
        )
        self._signals = 0
        for sig in SIGNALS_TO_HANDLE:
            signal.signal(sig, self._cleanup_worker)
        s.ON_WORKER_STARTUP()  # task child processes run it too (add_child_hooks, above)

    def run(self) -> ConsumerStats:
        """Serve tasks until stopped; returns the consumer's counts (exits 1 when over memory)."""
        log.info("Starting run loop for task worker.")
        try:
            stats = self._consumer.run()
        finally:
            settings.current().ON_WORKER_SHUTDOWN()
        if self._over_memory:
            sys.exit(1)
        return stats

    def _check_process_resources(self) -> bool:
        """True (stop) once this process's resident memory passes DIE_ON_RESIDENT_SET_SIZE_MB."""
        rss = resident_kb()
        if rss >= self._max_rss_kb and not self._over_memory:
            # a warning, so that it reaches stderr even where the project configures no logging
            log.warning("Memory usage exceeds max: %d KB (DIE_ON_RESIDENT_SET_SIZE_MB). Exiting.", rss)
            self._over_memory = True
        return self._over_memory

    def _cleanup_worker(self, signum: int, frame: object) -> None:
        self._signals += 1
        log.info("Process sent signal %d: %s", signum, "finishing running tasks" if self._signals == 1 else "stopping now")
        self._consumer.stop(graceful=self._signals == 1)
