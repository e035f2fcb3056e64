"""Where a consumer runs tasks: a fixed number of slots, in threads or in child processes.

Every kind (these two, and `AsyncSlots` in worker/async_slots.py) is a `Slots`: it takes a message,
runs it with `run_message` and puts a `Completion` on the consumer's queue. A task over its time
limit is stopped with `stop_task(message.key)`: a child process is killed and replaced; a thread
cannot be killed, so its task is abandoned (its late result is dropped) and a new thread takes the slot.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import NamedTuple, Protocol

from conveyor.client.sharded import format_id
from conveyor.constants import H_TASK, LOG_FORMAT
from conveyor.errors import ConveyorError, TaskError
from conveyor.message import Message
from conveyor.tasks.envelope import encode_error
from conveyor.tasks.runner import run_message
from conveyor.worker.completions import Completions
from conveyor.worker.connections import BlobFetcher, WorkerConnections
from conveyor.worker.hooks import CHILD_HOOKS
from conveyor.worker.lifelines import exit_with
from conveyor.worker.spawning import START_FAILURES_MAX, never_started, process_context

log = logging.getLogger("conveyor.worker")

# A forkserver that preloaded the main module's imports (see ProcessSlots) has it in sys.modules when
# each child runs it again as __mp_main__: runpy warns of that, once per child, to no purpose here.
# Children inherit this filter from the forkserver, which imports this module.
warnings.filterwarnings(
    "ignore", message=r".*found in sys.modules after import of package", category=RuntimeWarning, module="runpy"
)


class Completion(NamedTuple):
    """The outcome of one run: the result bytes, or the error.

    A tuple: one is made per task, at a third of a frozen dataclass's cost.
    """

    message: Message
    result: bytes | None
    error: TaskError | None
    slot: int  # which slot ran it (a stopped slot's late completion is dropped)
    seconds: float = -1.0  # how long it ran (-1: unknown)


class Slots(Protocol):
    """Where a consumer runs tasks: what it asks of each kind (`ThreadSlots`, `ProcessSlots`, `AsyncSlots`).

    Outcomes go to the `Completions` the slots were made with; a message is known by its key,
    (queue, id).
    """

    @property
    def kind(self) -> str:
        """The consumer option `pool` that chooses this kind."""
        ...

    @property
    def broken(self) -> str | None:
        """Why no slot will ever run what waits (the consumer stops on it); None while they work."""
        ...

    def start(self) -> None:
        """Start the slots (ready to run once this returns)."""
        ...

    def submit(self, message: Message) -> None:
        """Run `message` in a free slot, or in the first that frees up (it waits in line meanwhile)."""
        ...

    def started(self, key: tuple[str, int]) -> float | None:
        """When a slot started the message `key` (monotonic; None: it waits in line, or has ended)."""
        ...

    def unstarted(self) -> list[Message]:
        """Take back the messages waiting in line (a stopping consumer gives them back)."""
        ...

    def stop_task(self, key: tuple[str, int]) -> str | None:
        """Stop the task of the message `key`; its outcome, if any, is dropped.

        Returns what was done to it, as a time-limit error says it (None: it is not running).
        """
        ...

    def close(self, wait: bool = True) -> None:
        """End the slots; `wait`: for the tasks still running, else stopped as they are."""
        ...


def failure(message: Message, e: BaseException) -> TaskError:
    """Any exception out of a run, as the TaskError it settles with (a TaskError as it is)."""
    return e if isinstance(e, TaskError) else TaskError(message.headers.get(H_TASK, "?"), encode_error(e), True)


def _run(message: Message, conns: WorkerConnections | None) -> tuple[bytes | None, TaskError | None]:
    """Run one message; every outcome is a result or a TaskError, never an exception out of the slot.

    Otherwise a task raising SystemExit in a thread, say, would end the slot with its message
    unsettled.
    """
    try:
        return run_message(message, fetch=conns, backend=None if conns is None else conns.pool), None
    except BaseException as e:
        return None, failure(message, e)


class ThreadSlots:
    """`n` threads; each runs one message at a time."""

    kind = "thread"
    broken: str | None = None  # threads always start

    def __init__(self, n: int, done: Completions[Completion], conns: WorkerConnections | None) -> None:
        self.n = n
        self._done = done
        self._conns = conns
        self._work: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        # message key -> the slot running it and when it started (monotonic); a message retried after
        # its time limit may run again here while its abandoned first run still hangs in another slot
        self._started: dict[tuple[str, int], tuple[int, float]] = {}
        self._retired: set[int] = set()  # slots whose task was abandoned
        self._lock = threading.Lock()
        self._threads: dict[int, threading.Thread] = {}
        self._next_slot = 0

    def start(self) -> None:
        for _ in range(self.n):
            self._spawn()

    def grow(self, k: int) -> None:
        """Start `k` more threads (`ThreadScaling`: its tasks wait)."""
        self.n += k
        for _ in range(k):
            self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            slot = self._next_slot
            self._next_slot += 1
        t = threading.Thread(target=self._loop, args=(slot,), name=f"conveyor-task-{slot}", daemon=True)
        self._threads[slot] = t
        t.start()

    def _loop(self, slot: int) -> None:
        try:
            while (message := self._work.get()) is not None:
                key = message.queue, message.id  # message.key, without a property call on the hot path
                with self._lock:
                    self._started[key] = (slot, t0 := time.monotonic())
                result, error = _run(message, self._conns)
                with self._lock:
                    if self._started.get(key, (-1, 0.0))[0] == slot:
                        del self._started[key]
                    retired = slot in self._retired
                if retired:  # abandoned over its time limit: the consumer has already failed it
                    log.info("abandoned task %s finished after all; its result is dropped", format_id(message.id))
                    return
                self._done.put(Completion(message, result, error, slot, time.monotonic() - t0))
        finally:
            self._threads.pop(slot, None)

    def submit(self, message: Message) -> None:
        """Run `message` in the next free slot (it waits in line while every slot is busy)."""
        self._work.put(message)

    def started(self, key: tuple[str, int]) -> float | None:
        """When a slot started the message `key` (None: it waits in line, or has ended)."""
        run = self._started.get(key)
        return None if run is None else run[1]

    def unstarted(self) -> list[Message]:
        """Take back the messages waiting in line for a slot (a stopping consumer gives them back)."""
        out: list[Message] = []
        while True:
            try:
                m = self._work.get_nowait()
            except queue.Empty:
                return out
            if m is None:  # closing: leave the word to stop for the slots
                self._work.put(m)
                return out
            out.append(m)

    def stop_task(self, key: tuple[str, int]) -> str | None:
        """Abandon the thread running the message `key` and start another in its place."""
        with self._lock:
            run = self._started.pop(key, None)
            if run is None:
                return None
            self._retired.add(run[0])
        self._spawn()
        return "its thread was abandoned and may still be running"

    def close(self, wait: bool = True) -> None:
        for _ in range(len(self._threads) + len(self._retired)):
            self._work.put(None)
        if wait:  # not for abandoned tasks: they may never end, and their threads are daemons
            for slot, t in list(self._threads.items()):
                if slot not in self._retired:
                    t.join()


# --- processes ------------------------------------------------------------------------------------
def _let_pass(signum: int, frame: object) -> None:
    """SIGTERM in a task process: nothing (its consumer ends it after its task)."""


def _child_main(conn: Connection, task_modules: Sequence[str], fetcher: BlobFetcher | None, log_level: int) -> None:
    """A child process: import the task modules, then run messages from the pipe until it closes.

    It logs as its consumer does (`log_level`, the consumer's when it started it; LOG_FORMAT).
    """
    logging.basicConfig(level=log_level, format=LOG_FORMAT)
    # a group of its own: a signal to the consumer's group (Ctrl-C, kill -PGID) is the consumer's, which stops
    # us after our task; so is SIGTERM sent to every process (systemd's KillMode=control-group); and should the
    # consumer die without stopping us, we go with it (a lifeline), never orphaned
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    # SIGTERM passes, handled by doing nothing rather than ignored: a program the task runs starts with the
    # default action (exec keeps an ignored signal ignored, not a handled one), and so does a process it
    # forks (see forkserver_signals); and restarted, no call of the task's is cut short by it
    signal.signal(signal.SIGTERM, _let_pass)
    signal.siginterrupt(signal.SIGTERM, False)
    if (parent := multiprocessing.parent_process()) is not None:
        threading.Thread(target=exit_with, args=(parent.sentinel,), name="conveyor-lifeline", daemon=True).start()
    for name in task_modules:
        importlib.import_module(name)
    for start, _ in list(CHILD_HOOKS):
        start()
    conns = None if fetcher is None else fetcher()
    conn.send(_READY)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message is None:
            break
        conn.send(_run(message, conns))
    for stop in [stop for _, stop in reversed(CHILD_HOOKS) if stop is not None]:
        try:
            stop()
        except Exception:
            log.exception("worker process %s: a stop hook raised", os.getpid())
    # every result went up the pipe: exit now, not after the interpreter waits for threads a task or
    # the blob fetcher's connections left (an idle pool thread waits forever; the consumer would
    # wait for the child, then kill it)
    os._exit(0)


_READY = "ready"  # a child's first word: its imports are done
READY_TIMEOUT_S = 120.0


@dataclass(eq=False)
class _Child:
    slot: int
    proc: multiprocessing.process.BaseProcess
    conn: Connection
    message: Message | None = None
    started: float = 0.0  # when it was handed `message`
    stopped: bool = False  # killed over a time limit
    gone: bool = False  # exited: its reader has ended


class ProcessSlots:
    """`n` child processes; each runs one message at a time. A killed child is replaced."""

    kind = "process"

    def __init__(
        self, n: int, done: Completions[Completion], fetcher: BlobFetcher | None, task_modules: Sequence[str] = ()
    ) -> None:
        self.n = n
        self._done = done
        self._fetcher = fetcher  # gives each child connections of its own (None: no ad-hoc tasks)
        self._task_modules = list(task_modules)
        # children fork from a server that has imported these already: a replacement starts in milliseconds
        # (and the main module: in a Spark Python worker, pyspark.daemon, whose imports are much of pyspark)
        self._ctx = process_context(["conveyor.tasks.runner", "conveyor.worker.executors", *self._task_modules], with_main=True)
        self._ready = threading.Semaphore(0)
        self._idle: list[_Child] = []  # started, running nothing (under _lock)
        self._line: collections.deque[Message] = collections.deque()  # read ahead, waiting for a child (under _lock)
        self._children: dict[int, _Child] = {}
        self._lock = threading.Lock()
        self._next_slot = 0
        self._closing = False
        self._start_failures = 0  # children that exited before they were ready, in a row
        self._broken: str | None = None  # why children are no longer replaced

    def start(self) -> None:
        """Start the children and wait until each has imported what it needs."""
        for _ in range(self.n):
            self._spawn()
        deadline = time.monotonic() + READY_TIMEOUT_S
        for _ in range(self.n):
            ready = self._ready.acquire(timeout=max(deadline - time.monotonic(), 0.0))
            if self._broken is not None or not ready:
                self.close(wait=False)
                raise ConveyorError(self._broken or f"worker processes did not start within {READY_TIMEOUT_S:.0f} s")

    def grow(self, k: int) -> None:
        """Start `k` more threads (`ThreadScaling`: its tasks wait)."""
        self.n += k
        for _ in range(k):
            self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            slot = self._next_slot
            self._next_slot += 1
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_child_main,
            args=(child, self._task_modules, self._fetcher, logging.getLogger().getEffectiveLevel()),
            name=f"conveyor-task-{slot}",
            daemon=True,
        )
        proc.start()
        child.close()
        c = _Child(slot, proc, parent)
        with self._lock:  # against close(): it sees this child, or this child sees it closing (and goes)
            if not self._closing:
                self._children[slot] = c
        if slot not in self._children:
            proc.kill()  # it ignores SIGTERM: nothing else would end it, and the consumer's exit would wait on it
            return
        threading.Thread(target=self._read, args=(c,), name=f"conveyor-slot-{slot}", daemon=True).start()

    def _read(self, c: _Child) -> None:
        """Forward the child's results; report its death while it held a message."""
        ready = False
        try:
            if c.conn.recv() == _READY:
                ready, self._start_failures = True, 0
                self._ready.release()
                self._next(c)
        except (EOFError, OSError):
            pass
        while True:
            try:
                result, error = c.conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:  # against stop_task: either the result counts, or the child was stopped
                m, c.message = c.message, None
                stopped, took = c.stopped, time.monotonic() - c.started
            if m is not None and not stopped:
                self._next(c)  # the next in line starts now, not after a round trip through the consumer
                self._done.put(Completion(m, result, error, c.slot, took))
        with self._lock:  # never handed anything again
            c.gone = True
            if c in self._idle:
                self._idle.remove(c)
            m = c.message
        c.proc.join()
        with contextlib.suppress(OSError):
            c.conn.close()
        self._children.pop(c.slot, None)
        if c.stopped or self._closing:
            return
        code = c.proc.exitcode
        log.warning(
            "worker process %s died (exit code %s)%s",
            c.proc.pid,
            code,
            f" running message {format_id(m.id)}" if m is not None else "",
        )
        if m is not None:
            why = f"WorkerDied: the worker process running it died (exit code {code})"
            err = TaskError(m.headers.get(H_TASK, "?"), why, True)
            self._done.put(Completion(m, None, err, c.slot))
        if not ready:
            self._start_failures += 1
            if self._start_failures >= START_FAILURES_MAX:  # a replacement would die the same way, forever
                self._broken = never_started("worker process", self._start_failures, code)
                log.error("%s", self._broken)
                self._ready.release()  # start() raises it
                return
        try:
            self._spawn()
        except Exception as e:  # the fork server gone, no descriptors left: the consumer stops on it
            self._broken = f"could not start a worker process in place of one that died: {type(e).__name__}: {e}"
            log.error("%s", self._broken)

    @property
    def broken(self) -> str | None:
        """Why children are no longer started (the consumer stops: what waits in line would never run)."""
        return self._broken

    def submit(self, message: Message) -> None:
        """Run `message` in a free child, or in the first that frees up (it waits in line meanwhile)."""
        with self._lock:
            if not self._idle:
                self._line.append(message)
                return
            c = self._idle.pop()
            c.message, c.started = message, time.monotonic()  # under the lock: its reader sees it if it dies
        self._send(c, message)

    def _next(self, c: _Child) -> None:
        """A free child: hand it the next message in line, or keep it idle (never one gone or stopped)."""
        with self._lock:
            if c.gone or c.stopped:
                return
            if not self._line:
                self._idle.append(c)
                return
            m = self._line.popleft()
            c.message, c.started = m, time.monotonic()
        self._send(c, m)

    @staticmethod
    def _send(c: _Child, message: Message) -> None:
        with contextlib.suppress(OSError, ValueError):  # it died meanwhile: its reader reports the message and replaces it
            c.conn.send(message)

    def _running(self, key: tuple[str, int]) -> _Child | None:
        """The child running the message `key` (a copy of the children: readers add and remove them meanwhile)."""
        return next((c for c in list(self._children.values()) if c.message is not None and c.message.key == key), None)

    def started(self, key: tuple[str, int]) -> float | None:
        """When a child started the message `key` (None: it waits in line, or has ended)."""
        c = self._running(key)
        return None if c is None else c.started

    def unstarted(self) -> list[Message]:
        """Take back the messages waiting in line for a child (a stopping consumer gives them back)."""
        with self._lock:
            out = list(self._line)
            self._line.clear()
        return out

    def stop_task(self, key: tuple[str, int]) -> str | None:
        """Kill the child running the message `key` and start another in its place (None: it has just ended)."""
        with self._lock:  # the child is not handed another message once stopped, nor stopped after it moved on
            c = self._running(key)
            if c is None:
                return None
            c.stopped = True
        if c.proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(c.proc.pid, signal.SIGKILL)
        if not self._closing:
            self._spawn()
        return "its process was killed"

    def close(self, wait: bool = True) -> None:
        with self._lock:
            self._closing = True
        for c in list(self._children.values()):
            with contextlib.suppress(OSError, ValueError):
                c.conn.send(None)
        if wait:
            for c in list(self._children.values()):
                c.proc.join(10)
        for c in list(self._children.values()):
            if c.proc.is_alive():
                c.proc.kill()
