"""ConsumerPool: local consumer processes over a queue pool, restarted when they die.

Each process runs one `Consumer` (consumer i of n, so each serves its own shards first). SIGTERM
or SIGINT makes a consumer stop gracefully; `join()` waits until the queues are drained and
nothing is in flight, then stops them; `results()` reads back every result and failure.

Each consumer process has a pipe to the pool: it says when it has started (its imports done, its
task slots up) and, when it stops, sends its counts (`ConsumerPool.stats` sums them; one that dies
leaves them in a tally, shared memory it updates as it goes). A process that keeps exiting before it
started is not restarted forever: the pool gives up with an error.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from types import TracebackType
from typing import TYPE_CHECKING, Any

from conveyor.client.pool import QueuePool
from conveyor.client.progress import JoinProgress
from conveyor.client.sharded import ShardedQueues, summed_stats
from conveyor.constants import DEFAULT_UNREACHABLE_S, LOG_FORMAT
from conveyor.errors import ConveyorError, RequestError
from conveyor.gc_policy import tune_gc
from conveyor.protocol.requests import QueueStats
from conveyor.tasks.envelope import decode_result
from conveyor.tasks.queue_config import QueueConfig
from conveyor.worker.affinity import auto_pin, resolve_slots
from conveyor.worker.consumer import Consumer
from conveyor.worker.held import say_held
from conveyor.worker.hooks import ConsumerHooks, HookFailure, farewell
from conveyor.worker.lifelines import stop_with_parent
from conveyor.worker.options import (
    ConsumerKeywords,
    ConsumerOptions,
    options_of,
    process_shutdown_timeout,
    refuse_shared_selector,
)
from conveyor.worker.settings import load_settings
from conveyor.worker.spawning import START_FAILURES_MAX, never_started, process_context, warm_up
from conveyor.worker.stats import TALLIED, ConsumerStats, keep_tally, tallied, write_tally

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is 3.11+; only the type checker reads it

log = logging.getLogger("conveyor.worker")

STOP_MARGIN_S = 10.0  # past its shutdown timeout, how long a consumer may take to hand its tasks back before it is killed
# In a process that only consumes, CPU-bound tasks in threads switch the GIL every 5 ms by default;
# every switch costs the process time on the CPU (measured: 0.86 -> 0.90 efficiency on the skewed
# workload going from 1 ms to 20 ms). Set only in processes Conveyor starts (and `conveyor worker`).
CONSUMER_SWITCH_INTERVAL_S = 0.02
# A consumer process that exits before it started START_FAILURES_MAX times in a row fails the pool
# (see executors: what kills it at startup kills every replacement too).
HEAR_S = 0.05  # while consumers stop, how often the pool reads their pipes
_STARTED, _STATS, _FAREWELL, _FAILED = "started", "stats", "farewell", "failed"  # what a consumer process sends up its pipe


def own_process() -> None:
    """Tune a process that exists only to consume (its GIL switches and garbage collector)."""
    sys.setswitchinterval(CONSUMER_SWITCH_INTERVAL_S)
    tune_gc()


@dataclass(frozen=True, slots=True)
class TaskFailure:
    """A task that ended in the dead letters: its last error (type, message and traceback)."""

    error: str

    def __str__(self) -> str:
        return self.error.split("\n", 1)[0]


def _consumer_main(
    pool: ShardedQueues,
    queues: list[QueueConfig | str],
    index: int,
    n: int,
    options: ConsumerOptions,
    wiring: _Wiring,
    conn: Connection,
    environ: dict[str, str],
    hooks: ConsumerHooks | None = None,
    holding: Any = None,
    tally: Any = None,
) -> None:
    """One consumer process: run until SIGTERM or SIGINT, then stop gracefully.

    It tells the pool through `conn` when it has started and, at the end, its counts (`tally`, a
    shared array: as it goes). `holding`: a shared array, the messages it holds acked on delivery and
    how often that changed (see `ConsumerPool.join`).
    """
    os.environ.clear()  # the pool process's environment when it started this one, not the fork server's
    os.environ.update(environ)
    logging.basicConfig(level=wiring.log_level, format=LOG_FORMAT)
    try:
        _consume(
            pool, queues, index, n, options, wiring, conn, hooks, None if holding is None else partial(say_held, holding), tally
        )
    except BaseException as e:  # before it started, the pool's error says why (not only that it exited)
        _tell(conn, _FAILED, "".join(traceback.format_exception_only(type(e), e)).strip())
        raise


def _consume(
    pool: ShardedQueues,
    queues: list[QueueConfig | str],
    index: int,
    n: int,
    options: ConsumerOptions,
    wiring: _Wiring,
    conn: Connection,
    hooks: ConsumerHooks | None,
    holding: Callable[[int], object] | None,
    tally: Any,
) -> None:
    settings = load_settings()
    own_process()
    consumer = Consumer(
        pool,
        queues,
        options=options,
        unreachable_s=None,  # join() is what gives up on a server out of reach
        consumer=index,
        n_consumers=n,
        on_started=lambda: _tell(conn, _STARTED, None),
        holding=holding,
        slots_defaulted=wiring.slots_defaulted,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: consumer.stop())
    parent, done = multiprocessing.parent_process(), threading.Event()
    if parent is not None:  # a pool whose process is gone, even by SIGKILL, leaves no consumer behind
        threading.Thread(target=stop_with_parent, args=(parent, consumer, done), name="conveyor-watch", daemon=True).start()
    if tally is not None:  # should this process die, its pool counts what it did
        threading.Thread(target=keep_tally, args=(consumer.stats, tally, done), name="conveyor-tally", daemon=True).start()
    if settings.on_worker_startup is not None:
        settings.on_worker_startup()
    if hooks is not None:
        hooks.start(index)
    try:
        stats = consumer.run()
    finally:
        if tally is not None:  # the exact counts, however run() ended
            write_tally(consumer.stats, tally)
        if settings.on_worker_shutdown is not None:
            settings.on_worker_shutdown()
        done.set()
    if hooks is not None:
        _tell(conn, _FAREWELL, farewell(hooks, index))
    _tell(conn, _STATS, stats)  # whatever the hooks did: the counts always go


def _tell(conn: Connection, what: str, data: object) -> None:
    """Send the pool a word up the pipe (nothing when the pool is gone: no one to tell)."""
    with contextlib.suppress(OSError):
        conn.send((what, data))


@dataclass(frozen=True, slots=True)
class _Wiring:
    """What a pool tells each of its consumer processes beside the options."""

    slots_defaulted: bool  # concurrency was left out: the pool sized the slots (see Consumer)
    log_level: int  # the pool process's, when it made the pool


class ConsumerPool:
    """`n_consumers` consumer processes on this machine."""

    def __init__(
        self,
        queue_pool: QueuePool,
        /,
        n_consumers: int | None = None,
        *,
        queues: Sequence[QueueConfig | str] = ("default",),
        restart: bool = True,
        hooks: ConsumerHooks | None = None,
        options: ConsumerOptions | None = None,
        **keywords: Unpack[ConsumerKeywords],
    ) -> None:
        """The consumers' options (`options=`, or keywords of their names) are `ConsumerOptions`.

        Left out, `concurrency` and `pin_core` are sized for `n_consumers` consumers sharing this
        machine's cores. `shutdown_timeout` is also how long `cancel` waits for running tasks.
        `restart`: consumers that die are started again. `hooks`: see `ConsumerHooks`. A consumer
        keeps trying a server out of reach: `join` is what gives up on it.
        """
        self.pool = queue_pool
        self.n_consumers = n_consumers or os.cpu_count() or 1
        if type(self.n_consumers) is not int or self.n_consumers < 1:
            raise ValueError(f"n_consumers must be an integer >= 1, got {n_consumers!r}")
        self.queues = list(queues)
        self.queue_names = [q if isinstance(q, str) else q.name for q in self.queues]
        given = options_of("ConsumerPool", options, keywords)
        refuse_shared_selector("ConsumerPool", given)
        slots, defaulted = resolve_slots(given.concurrency, given.pool, self.n_consumers)
        # what each consumer runs with: sized for the consumers on this machine
        self.options = replace(
            given,
            concurrency=slots,
            pin_core=auto_pin(given.pin_core, given.pool, self.n_consumers),
            shutdown_timeout=process_shutdown_timeout(given.shutdown_timeout),
        )
        self._wiring = _Wiring(defaulted, logging.getLogger().level or logging.WARNING)
        self.restart = restart
        self.restarts = 0
        self.hooks = hooks
        # what `hooks.stop()` returned in consumer i's processes, in order (restarted or started again: one more)
        self.farewells: dict[int, list[object]] = {}
        self.stats = ConsumerStats()  # the counts of the consumer processes that have stopped (see `_spawn`)
        self._ctx = process_context(["conveyor.worker.consumer_pool"])
        warm_up(self._ctx)  # start() then forks consumers from a ready server (~0.4 s sooner here)
        self._procs: list[multiprocessing.process.BaseProcess | None] = [None] * self.n_consumers
        self._conns: list[Connection | None] = [None] * self.n_consumers  # the read ends of their pipes
        self._started = [False] * self.n_consumers
        self._start_failures = [0] * self.n_consumers  # exits before starting, in a row
        self._why = [""] * self.n_consumers  # the error a process that failed to start sent
        self._holding: list[Any] = [None] * self.n_consumers  # shared [held, changes]: messages acked on delivery, running
        self._tallies: list[Any] = [None] * self.n_consumers  # shared: the counts of a live consumer, as it goes
        self._stopping = False
        self._lock = threading.Lock()  # check() is called from the waits of any thread, cancel() from close()
        self._failure: str | None = None  # why check() gave up on the consumers, said again until start()

    @property
    def processes(self) -> list[multiprocessing.process.BaseProcess]:
        return [p for p in self._procs if p is not None]

    def _spawn(self, i: int) -> None:
        """Start consumer i with a pipe of its own.

        It sends when it has started and, when it stops (not when killed), its counts, which go into
        `stats`.
        """
        read, write = self._ctx.Pipe(duplex=False)
        # [held, changes]: a new process holds nothing yet
        self._holding[i] = self._ctx.Array("q", 2) if self.options.early_ack else None
        self._tallies[i] = self._ctx.RawArray("q", len(TALLIED))
        p = self._ctx.Process(
            target=_consumer_main,
            args=(
                self.pool.queues,
                self.queues,
                i,
                self.n_consumers,
                self.options,
                self._wiring,
                write,
                dict(os.environ),
                self.hooks,
                self._holding[i],
                self._tallies[i],
            ),
            name=f"conveyor-consumer-{i}",
            daemon=False,
        )
        p.start()
        write.close()  # the child's end: with it closed here, the read end sees EOF when the child exits
        self._procs[i], self._conns[i], self._started[i], self._why[i] = p, read, False, ""

    def _hear(self, i: int) -> None:
        """Read what consumer i has sent so far; after it exited, everything, and close its pipe."""
        conn = self._conns[i]
        if conn is None:
            return
        try:
            while conn.poll():
                raw = conn.recv_bytes()
                try:
                    what, data = ForkingPickler.loads(raw)
                except Exception as e:  # what a hook returned may pickle there and not unpickle here
                    what, data = _FAREWELL, HookFailure(f"a word from consumer {i} could not be read: {type(e).__name__}: {e}")
                if what == _STARTED:
                    self._started[i], self._start_failures[i], self._why[i] = True, 0, ""
                elif what == _FAREWELL:
                    self.farewells.setdefault(i, []).append(data)
                    if isinstance(data, HookFailure):
                        log.error("consumer %d: %s", i, data.error)
                elif what == _FAILED:
                    self._why[i] = data
                else:
                    self.stats, self._tallies[i] = self.stats + data, None  # its own counts: its tally is done with
        except (EOFError, OSError):  # it exited: nothing more will come
            conn.close()
            self._conns[i] = None

    def start(self) -> ConsumerPool:
        """Start the consumer processes.

        The pool's waits (`result()`, `gather`, `join`) look after them from then on
        (`QueuePool.attached`): consumers that cannot start fail the wait with their error.
        """
        self._stopping, self._failure = False, None
        for i in range(self.n_consumers):
            self._spawn(i)
        self.pool.attached.add(self)
        return self

    def check(self) -> None:
        """Restart consumers that died (their messages come back to the queue when their leases end).

        `join()` calls it while it waits, and so do the waits of the pool's tasks (`result()`, `gather`);
        call it now and then when waiting otherwise. Raises ConveyorError when a consumer keeps exiting
        before it started (START_FAILURES_MAX times in a row): a replacement would die the same way,
        forever; then raises it again at every call until `start()`. Once `cancel()` began, does nothing.
        """
        with self._lock:
            if self._failure is not None:
                raise ConveyorError(self._failure)
            if self._stopping:  # cancel() has them: a wait's check() in another thread leaves them alone
                return
            try:
                self._look_after()
            except ConveyorError as e:
                self._failure = str(e)
                raise

    def _look_after(self) -> None:
        for i, p in enumerate(self._procs):
            self._hear(i)
            if p is not None and p.exitcode is not None and not self._stopping:
                self._hear(i)  # all it sent before it exited, "started" included
                self._count_tally(i)
                self._procs[i] = None
                if not self._started[i]:
                    self._start_failures[i] += 1
                    if self.restart and self._start_failures[i] >= START_FAILURES_MAX:
                        raise ConveyorError(self._never_started(i, self._start_failures[i], p.exitcode))
                log.warning(
                    "consumer %d (pid %s) exited with code %s%s%s%s",
                    i,
                    p.pid,
                    p.exitcode,
                    "" if self._started[i] else " before it started",
                    f" ({self._why[i]})" if self._why[i] else "",
                    "; restarting it" if self.restart else "",
                )
                if self.restart:
                    self.restarts += 1
                    self._spawn(i)
        if not any(p is not None and p.is_alive() for p in self._procs) and not self.restart:
            failed = next((k for k, n in enumerate(self._start_failures) if n), None)
            if failed is not None:
                raise ConveyorError(self._never_started(failed, 1, None))
            raise ConveyorError("every consumer process has exited")

    def _count_tally(self, i: int) -> None:
        """Consumer i has exited without its counts (killed): count what its tally holds."""
        if self._tallies[i] is not None and self._conns[i] is None:
            self.stats, self._tallies[i] = self.stats + tallied(self._tallies[i]), None

    def _never_started(self, i: int, times: int, code: int | None) -> str:
        """The error of consumer i exiting before it started: what it said failed, when it said."""
        return never_started(f"consumer process {i}", times, code, self._why[i])

    def _held(self) -> tuple[int, int]:
        """Messages acked on delivery still running in live consumers, and how often that changed.

        The servers no longer count these messages.
        """
        live = [h[:] for h, p in zip(self._holding, self._procs, strict=True) if h is not None and p is not None and p.is_alive()]
        return sum(h[0] for h in live), sum(h[1] for h in live)

    def join(
        self,
        timeout: float | None = None,
        progress: bool | None = None,
        poll_s: float = 0.2,
        unreachable_s: float = DEFAULT_UNREACHABLE_S,
    ) -> dict[str, QueueStats]:
        """Wait until the queues have nothing ready, delayed or delivered, then stop the consumers.

        With `early_ack`, also wait until the consumers run nothing they acked on delivery.

        With no consumer running (a previous `join` stopped them, or `cancel`), it starts them again
        first: work put since is served, not waited on. A progress bar shows on a terminal. Raises
        TimeoutError (consumers left running) after `timeout`, and `ServerUnreachableError` when a
        server has been out of reach for longer than `unreachable_s` (its work cannot finish).
        """
        if not any(p is not None for p in self._procs):
            log.info("join: no consumer is running: starting %d", self.n_consumers)
            self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = 0.0  # a first look at once; then each look waits on the servers for the end, up to poll_s
        with JoinProgress(enabled=progress) as bar:
            while True:
                self.check()
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                before = self._held()  # a message that ends between two looks may have put more: look again
                per = self.pool.queues.reachable_stats(self.queue_names, drained_wait_s=wait)
                self.pool.queues.check_reachable(unreachable_s, self.queue_names, "join: ")
                up = [{q: s for q, s in p.items() if q in self.queue_names} for p in per if isinstance(p, dict)]
                st = summed_stats(up)
                bar.update(st)
                # read after the servers: a consumer says it holds a message before acking it
                held, _ = after = self._held()
                if len(up) == len(per) and all(s.pending == 0 for s in st.values()) and not held and after == before:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    also = f" and {held:,} acked on delivery still running" if held else ""
                    raise TimeoutError(f"join: {sum(s.pending for s in st.values()):,} messages pending{also} after {timeout} s")
                if held:  # drained: the servers would answer at once, so wait on the consumers (ending, or dying)
                    left = poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
                    multiprocessing.connection.wait([p.sentinel for p in self.processes], left)
                    continue
                if len(up) < len(per):  # a server out of reach answers at once: look again after poll_s, not in a spin
                    time.sleep(poll_s)
                wait = poll_s
        self.cancel()
        return st

    def cancel(self, graceful: bool = True) -> None:
        """Stop the consumers: gracefully or at once.

        Gracefully, running tasks finish, for up to the pool's shutdown timeout; those still running
        then are handed back. At once (SIGKILL), their messages come back at once.
        """
        with self._lock:  # once a check() under way in another thread's wait is done: none looks after them now
            self._stopping = True
        self.pool.attached.remove(self)
        procs = self.processes
        for p in procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM if graceful else signal.SIGKILL)
        if graceful and procs:
            try:
                self.pool.queues.wake(self.queue_names)  # after the signals: a woken consumer has its stop already
            except Exception as e:  # only speeds the stop up: the consumers' polls end on their own
                log.warning("could not wake the consumers' long polls: %s", e)
        timeout = self.options.shutdown_timeout
        assert timeout is not None  # resolved in __init__, as the consumers have it
        grace = STOP_MARGIN_S + (timeout if graceful else 0)
        deadline = time.monotonic() + grace
        try:
            for i, p in ((i, p) for i, p in enumerate(self._procs) if p is not None):
                while p.is_alive() and time.monotonic() < deadline:
                    self._hear(i)  # read as it stops: a farewell bigger than the pipe holds would block its exit
                    p.join(HEAR_S)
                if p.is_alive():
                    log.warning("consumer pid %s did not stop within %.0f s: killing it", p.pid, grace)
                    p.kill()
                    p.join()
            for i in range(self.n_consumers):  # their last counts (those killed: as far as their tallies go)
                self._hear(i)
                self._count_tally(i)
        finally:  # whatever went wrong above, no consumer is left running, nor counted as running
            for p in self.processes:
                if p.is_alive():
                    p.kill()
                    p.join(10)
            self._procs = [None] * self.n_consumers

    def results(self) -> Iterator[tuple[int, Any]]:
        """(message id, result) for every finished task; a failed one's result is a `TaskFailure`."""
        for q in self.queue_names:
            try:
                for i, r in self.pool.queues.results(q):
                    yield i, decode_result(r)
                for d in self.pool.dead_letters(q):
                    yield d.message.id, TaskFailure(d.error)
            except RequestError as e:
                if e.kind != "no-such-queue":
                    raise

    def __enter__(self) -> ConsumerPool:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.cancel()  # with no consumer left running too: it unties this pool from the QueuePool's waits
