"""Consumer: fetch batches, run tasks in a fixed number of slots, ack late, nack failures.

One control thread does all the talking to the servers. It fetches only what free slots can start
at once (no prefetched message waits behind a long task), picks queues with a selector (ndkale's
algorithms), serves its assigned shards first and steals from the others when they are empty,
acks results in batches, extends the leases of long tasks, stops tasks over their time limit and
hands failures to the middleware (retries with backoff, dead letters). On `stop()` it fetches no
more, lets running tasks finish (for up to `shutdown_timeout`; then hands them back, the attempt not
counted), gives back anything fetched but not started, and returns. A server out of reach is
retried now and then while the others are served (see `outages`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from conveyor.client.backend import QueueBackend
from conveyor.client.sharded import format_id
from conveyor.constants import DEFAULT_UNREACHABLE_S, H_ROWS, H_TASK, REFILL_MAX, TASK_SECONDS_BUCKETS
from conveyor.errors import ConnectionLostError, ConveyorError, ServerUnreachableError, TaskError
from conveyor.message import Message
from conveyor.protocol.histograms import Histogram
from conveyor.protocol.report import ConsumerReport, Rows
from conveyor.tasks.queue_config import QueueConfig
from conveyor.tasks.registry import import_named
from conveyor.worker.ack_modes import ack_mode
from conveyor.worker.affinity import pin_core, resolve_slots
from conveyor.worker.async_slots import AsyncSlots
from conveyor.worker.completions import Completions
from conveyor.worker.connections import ONE_ATTEMPT, BlobFetcher, own_connections
from conveyor.worker.executors import Completion, ProcessSlots, Slots, ThreadSlots
from conveyor.worker.fetching import Fetcher
from conveyor.worker.held import Held, ServedQueue, over_limit
from conveyor.worker.middleware import default_middleware
from conveyor.worker.options import ConsumerKeywords, ConsumerOptions, options_of
from conveyor.worker.outages import Outages
from conveyor.worker.pacing import Pacing
from conveyor.worker.selectors import QueueSelector, selector_class
from conveyor.worker.settler import Release, Settlement, Settler, result_fits
from conveyor.worker.stats import ConsumerStats
from conveyor.worker.thread_scaling import ThreadScaling

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack is 3.11+; only the type checker reads it

log = logging.getLogger("conveyor.worker")

REPORT_EVERY_S = 2.0  # how often a consumer tells the servers its counts
BUSY_POLL_S = 0.05  # with tasks running, how long to wait for one to finish before looking for more work
IDLE_POLL_S = 0.25  # longest long poll while idle: a stop is noticed within it (a shard of several is polled that long anyway)
DRAIN_POLL_S = 0.1  # with until_empty, how long an idle consumer waits before looking at the queues again
RETRY_CONNECT_S = 1.0
SETTLE_S, HARD_SETTLE_S = 30.0, 2.0  # on the way out, how long the last acks may take (after a hard stop)
STOP_CHECK_S = 1.0  # how often `stop_when` is asked
_HOST = socket.gethostname()  # in every report: `conveyor stats` shows where a consumer runs


class Consumer:
    """Runs tasks from `queues` of `queue_pool` until stopped (or, with `until_empty`, until they are drained)."""

    def __init__(
        self,
        queue_pool: QueueBackend,
        /,
        queues: Sequence[QueueConfig | str] = ("default",),
        *,
        options: ConsumerOptions | None = None,
        until_empty: bool = False,
        unreachable_s: float | None = DEFAULT_UNREACHABLE_S,
        consumer: int = 0,
        n_consumers: int = 1,
        name: str | None = None,
        seed: int | None = None,
        stop_when: Callable[[], bool] | None = None,
        expect_more: Callable[[], bool] | None = None,
        on_started: Callable[[], object] | None = None,
        holding: Callable[[int], object] | None = None,
        slots_defaulted: bool | None = None,
        **keywords: Unpack[ConsumerKeywords],
    ) -> None:
        """See the module docstring; the options (`options=`, or keywords of their names) are `ConsumerOptions`.

        `until_empty`: end once the queues are drained. `unreachable_s`: a server out of reach for
        longer ends `run()` with `ServerUnreachableError` (one back within it, and the work goes on;
        None: retried for as long as it takes, the others served meanwhile). `consumer` of
        `n_consumers`: which shards it serves first. `stop_when`, asked about once a second, stops
        the consumer gracefully when it returns True (a stop signalled from elsewhere, e.g. through
        the servers). `expect_more` (with `until_empty`): while it returns True, drained queues do
        not end the consumer (producers are still at work). `on_started` is called once `run()` is
        ready to work: task modules imported, task slots started. `holding` (with `early_ack`) is
        told how many acked messages the consumer holds, before each ack and as they end: the
        servers no longer count them (`ConsumerPool.join`). `slots_defaulted`: whether `concurrency`
        was left out (None: when it is; a pool that sized the slots for its consumers says so
        here): the consumer may then hold quick tasks beyond its slots, and in thread mode adds
        threads while its tasks wait (`ThreadScaling`). With `early_ack` it reads no messages ahead, since those
        could not be given back, and extends no leases (see `ack_modes`).
        """
        if not queues:
            raise ValueError("a consumer needs at least one queue")
        self.options = opts = options_of("Consumer", options, keywords)
        self.slots, defaulted = resolve_slots(opts.concurrency, opts.pool, 1)
        defaulted = defaulted if slots_defaulted is None else slots_defaulted
        self.middleware = list(default_middleware() if opts.middleware is None else opts.middleware)
        self._ack_mode = ack_mode(opts.early_ack, self.middleware, holding)
        self.reads_ahead = defaulted and self._ack_mode.reads_ahead
        self._scaling = ThreadScaling(self.slots) if defaulted and opts.pool == "thread" else None
        self.pool = queue_pool
        self.queues = [ServedQueue.of(q, opts.batch_size) for q in queues]
        mine = queue_pool.assign(consumer, n_consumers)
        self.shards = mine + [s for s in range(len(queue_pool)) if s not in mine]  # assigned first, then steal
        self.n_assigned = len(mine)
        self.n_consumers = n_consumers
        rng = random.Random(seed)
        sel = opts.selector
        self.selector = sel if isinstance(sel, QueueSelector) else selector_class(sel)(rng)
        self.until_empty = until_empty
        self.stop_when = stop_when
        self.expect_more = expect_more
        self.on_started = on_started
        self.pin_core = bool(opts.pin_core)  # alone it cannot tell how many consumers share the host: pinned when asked
        self.unreachable_s = unreachable_s
        self._next_stop_check = self._next_sweep = 0.0  # sweep: tasks over their time limit or due a lease extension
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{consumer}"
        self.stats = ConsumerStats()
        self._task_seconds = Histogram(TASK_SECONDS_BUCKETS)  # reported: the servers' metrics show it
        self._done: Completions[Completion] = Completions()
        self._running: dict[tuple[str, int], Held] = {}  # by queue and id: each queue numbers its own messages
        self._stop = threading.Event()
        self._hard_stop = False
        self._settler: Settler
        self._undrained = False  # with until_empty: the last drained check found work still pending
        self._ended = False  # its loop returned (a stop, or drained queues): its reports say it ended

    # --- control --------------------------------------------------------------------------
    def stop(self, graceful: bool = True) -> None:
        """Stop fetching and return once running tasks finish (graceful) or at once.

        At once, their messages are handed back for another worker. Safe from any thread or a signal
        handler.
        """
        if not graceful:
            self._hard_stop = True
        self._stop.set()

    def run(self) -> ConsumerStats:
        """Work until `stop()` (or, with `until_empty`, until the queues are drained); returns the counts."""
        for name in self.options.task_modules:
            import_named(name)
        pin = pin_core() if self.pin_core else None  # before any thread starts: they inherit it
        try:
            self._run(pin.core if pin is not None else None)
        finally:
            if pin is not None:
                pin.release()
        return self.stats

    def _run(self, core: int | None) -> None:
        sizes = [q.batch_size or 0 for q in self.queues]  # 0: no limit of the queue's own
        idle_max = REFILL_MAX if self.options.pool == "async" else None
        pacing = Pacing(
            self.slots, max(sizes) if min(sizes) else None, core is not None, self.n_consumers, len(self.pool), idle_max
        )
        # its fetches' own connections: one attempt each to connect, so that a server out of reach holds up
        # neither the others' work nor a stop (it is tried again later; see Outages)
        self._servers = own_connections(self.pool, ONE_ATTEMPT)
        self._outages = Outages(self._servers, f"consumer {self.name}", self.unreachable_s)
        self._fetcher = Fetcher(
            self._servers,
            self.queues,
            self.selector,
            self.shards,
            self.n_assigned,
            self.stats,
            self._stop,
            pacing,
            self.reads_ahead,
            self.name,
        )
        fetcher, conns = BlobFetcher(self.pool), None  # conns: the task threads' own connections, closed at the end
        slots: Slots
        if self.options.pool == "process":
            slots = ProcessSlots(self.slots, self._done, fetcher, self.options.task_modules)
        else:
            slots = (AsyncSlots if self.options.pool == "async" else ThreadSlots)(self.slots, self._done, conns := fetcher())
        slots.start()
        self._settler = Settler(self.pool, self.report, REPORT_EVERY_S)  # reports: this consumer is ready
        log.info(
            "consumer %s: %s x %d on %s, shards %s%s",
            self.name,
            self.options.pool,
            self.slots,
            ", ".join(q.name for q in self.queues),
            self.shards,
            "" if core is None else f", core {core}",
        )
        try:
            if self.on_started is not None:
                self.on_started()
            self._loop(slots)
            self._ended = True  # not on an error: a consumer that fails did not end as asked
        finally:
            self._give_back(slots)
            slots.close(wait=not self._hard_stop)  # a hard stop kills task processes, cancels calls (and leaves task threads)
            self._settle(self._done.take())  # what finished meanwhile is acked, not run again elsewhere
            self._hand_back()
            if conns is not None:
                conns.pool.close()
            self._settler.close(HARD_SETTLE_S if self._hard_stop else SETTLE_S)
            self.stats.unsettled += self._settler.unsettled
            self._servers.close()

    def _loop(self, slots: Slots) -> None:
        gave_back, stop_by = False, 0.0  # once stopping, nothing new goes in line: what waits there is given back once
        while True:
            try:
                self._settle(self._done.take())
                now = time.monotonic()
                if now >= self._next_sweep:  # not at every completion: each looks at every running task
                    self._next_sweep = now + BUSY_POLL_S
                    self._fetcher.look(now)
                    if slots.broken is not None:  # no slot will ever run what it holds: said, not waited on
                        raise ConveyorError(f"consumer {self.name}: {slots.broken}")
                    self._enforce_limits(slots, now)
                    if self._scaling is not None and (grown := self._scaling.sweep(now, len(self._running))) is not None:
                        self._grow(slots, grown)
                    self._settler.put(self._ack_mode.extensions(self._running.values(), now))
                    self._check_reachable()
                if self.stop_when is not None and now >= self._next_stop_check:
                    self._next_stop_check = now + STOP_CHECK_S
                    if self.stop_when():
                        self._stop.set()
                if self._stop.is_set():
                    timeout = self.options.shutdown_timeout
                    if not gave_back:
                        self._give_back(slots)
                        gave_back, stop_by = True, now + (float("inf") if timeout is None else timeout)
                    if self._running and now >= stop_by and not self._hard_stop:
                        log.warning(f"consumer {self.name}: {timeout:g} s after the stop, running tasks are handed back")
                        self._hard_stop = True
                    if self._hard_stop or not self._running:
                        return
                    self._wait(BUSY_POLL_S)
                    continue
                free = self._fetcher.want(len(self._running))
                if not free:  # while the queue is busy, fetch in batches rather than one by one
                    self._wait(BUSY_POLL_S, self._fetcher.short_of(len(self._running)))
                    continue
                if not self._running and self._fetcher.looks_drained:
                    self._settler.hurry()  # idle, the queues look drained: our last acks may be what ends the work
                got = self._fetch(free)
                if self._stop.is_set() and got:
                    self._release(got)
                    continue
                self._start(slots, got)
                if got:
                    continue
                if self._running:
                    self._wait(BUSY_POLL_S)
                    continue
                if self.until_empty:
                    # others' tasks still run: the servers answer at their end, or after a while (a retry may bring work back)
                    if self._drained(DRAIN_POLL_S if self._undrained else 0.0):
                        return
                    self._undrained = True
            except (ConnectionLostError, TimeoutError) as e:  # no server answers: said by the sweep (Outages)
                if isinstance(e, ServerUnreachableError):
                    raise
                log.debug("consumer %s: %s; retrying", self.name, e)
                self._stop.wait(RETRY_CONNECT_S)

    def _grow(self, slots: Slots, threads: int) -> None:
        """Run `threads` threads from now on: its tasks wait (`ThreadScaling`)."""
        if not isinstance(slots, ThreadSlots):
            return
        log.info("consumer %s: every thread busy, the process's CPU idle: its tasks wait; %d threads now", self.name, threads)
        slots.grow(threads - slots.n)
        self.slots = threads
        # tasks that wait keep no core busy: a pinned consumer's rule of holding less as the queues drain
        # (so that consumers of a core each end together) would only leave its threads idle at the end
        self._fetcher.pacing = dataclasses.replace(self._fetcher.pacing, slots=threads, pinned=False)

    def _check_reachable(self) -> None:
        """Say which servers are out of reach; one past `unreachable_s` ends the consumer: a hard stop (no long goodbye to it)."""
        self._outages.say()
        try:
            if self.unreachable_s is not None:
                self._servers.check_reachable(self.unreachable_s, [q.name for q in self.queues], f"consumer {self.name}: ")
        except ServerUnreachableError:
            self._hard_stop = True
            raise

    # --- fetching -------------------------------------------------------------------------
    def _fetch(self, free: int) -> list[Message]:
        """Up to `free` messages from the selected queue (see `Fetcher`); a probe's surplus goes back."""
        got, extra = self._fetcher.fetch(free, self._poll_s)
        if extra:
            self._release(extra)
        self._settler.busy = not self._fetcher.last_short
        return got

    def _poll_s(self, q: ServedQueue) -> float | None:
        """How long to long-poll `q`: only when idle; with until_empty, only while others still put work (then see _drained).

        None: a stop since the loop looked (the pool's wake may be past), no poll.
        """
        wait = 0.0
        if not self._running and not self.until_empty:
            wait = min(q.long_poll_s, IDLE_POLL_S)
        elif not self._running and self._undrained and self.expect_more is not None:
            wait = min(q.long_poll_s, DRAIN_POLL_S)
        if wait:  # idle for a while, perhaps: acks held back to gather more would wait as long
            self._settler.hurry()
            if self._stop.is_set():
                return None
        return wait

    def _drained(self, wait_s: float) -> bool:
        """Whether the queues are drained, waiting up to `wait_s` for it (not while others still put work)."""
        if self.expect_more is not None:
            if self.expect_more():
                return False
            self.expect_more = None  # all is put: it stays so
        if not self._settler.flush(IDLE_POLL_S):  # our own acks count: sent before asking (a server out of reach may hold them)
            return False
        st = self._servers.wait_drained([q.name for q in self.queues], wait_s)
        return all(s.pending == 0 for s in st.values())

    # --- running --------------------------------------------------------------------------
    def _start(self, slots: Slots, got: list[Message]) -> None:
        delivered = self._ack_mode.delivered(self._servers, got, len(self._running))  # those it keeps from running do not
        middleware, running = self.middleware, self._running
        now = time.monotonic()  # fetched together: one time for the batch
        for m in delivered.run:
            deadlines = [d for mw in middleware if (d := mw.deadline(m, now)) is not None]
            running[m.queue, m.id] = Held.fetched(m, min(deadlines) - now if deadlines else None, now)
            slots.submit(m)
        self._ack_mode.holding(len(running))
        if delivered.error is not None:  # what was acked before it runs; the loop retries (or ends on) the error
            raise delivered.error

    def _wait(self, timeout: float, n: int = 1) -> None:
        """Wait for `n` completions (left for the next loop) or the timeout."""
        self._done.wait(timeout, n)

    def _enforce_limits(self, slots: Slots, now: float) -> None:
        """Stop the tasks over their time limit (counted from when they started: not while in line)."""
        for r, limit in over_limit(self._running.values(), slots.started, now):
            if (stopped := slots.stop_task(r.message.key)) is not None:
                self.stats.timed_out += 1
                err = TaskError(
                    r.message.headers.get(H_TASK, "?"),
                    f"TimeLimitExceeded: the task ran over its time limit of {limit:g} s ({stopped})",
                    True,
                )
                self._settle([Completion(r.message, None, err, -1, limit)])

    def _settle(self, done: list[Completion]) -> None:
        """Settle what finished, as the ack mode says (sent by the settler); failures go to the middleware first."""
        if done:
            self._undrained = False  # a task of ours ended: the queues may be drained now
            self._fetcher.finished(len(done))
        out: list[Settlement] = []
        mode, running, held = self._ack_mode, self._running, len(self._running)
        fits = mode.result_room(self._servers) if done else 0
        for c in done:
            m = c.message
            if running.pop((m.queue, m.id), None) is None:
                continue  # stopped over its time limit and settled then: a late result
            if c.seconds >= 0:
                self._task_seconds.observe(c.seconds)
            if c.result is not None and len(c.result) > fits:
                c = result_fits(c, self._servers, fits)  # a result too big fails its task, not its batch
            if c.error is None:
                if (ack := mode.succeeded(m, c.result)) is not None:
                    out.append(ack)
                self.stats.processed += 1
                if H_ROWS in m.headers:  # a map job's: its rows are counted (only then: this is the hot path)
                    self.stats.settled(m)
            else:
                failed = mode.failed(m, c.error)
                if failed.nack is not None:
                    out.append(failed.nack)
                self.stats.failed += 1
                dead = failed.decision.final or m.attempts >= m.max_attempts
                self.stats.dead, self.stats.retried = self.stats.dead + dead, self.stats.retried + (not dead)
                if dead:
                    self.stats.settled(m)
                log.info(
                    "task %s (message %s, attempt %d) failed: %s",
                    c.error.task,
                    format_id(m.id),
                    m.attempts,
                    c.error.error.split("\n", 1)[0],
                )
            for mw in self.middleware:
                mw.on_finish(m, c.error)
        self._settler.put(out)
        if len(running) != held:
            mode.holding(len(running))

    def _give_back(self, slots: Slots) -> None:
        """Release the messages read ahead and not started: a stopping consumer leaves them to others.

        Acked on delivery, they cannot go back: they run here (see `ack_modes`).
        """
        split = self._ack_mode.unstarted(slots.unstarted())
        for m in split.run_here:
            slots.submit(m)  # back in line, in their order
        for m in split.give_back:
            del self._running[m.queue, m.id]
        self._release(split.give_back)

    def _hand_back(self) -> None:
        """Settle the messages still running as the consumer ends, as the ack mode says.

        The consumer ends on a hard stop, `shutdown_timeout` past, or an error: their messages go
        back to the queue, or, acked on delivery, count as failed.
        """
        stopped = self._ack_mode.stopped([r.message for r in self._running.values()])
        self._settle(stopped.failed)
        self._settler.put([Release(m.queue, m.id) for m in stopped.give_back])
        self.stats.handed_back += len(stopped.give_back)
        self._running.clear()

    def _release(self, got: list[Message]) -> None:
        self._settler.put([Release(m.queue, m.id) for m in got])
        self.stats.released += len(got)

    def report(self) -> ConsumerReport:
        """What this consumer tells the servers now (its settler sends it every REPORT_EVERY_S).

        Its task times are the live histogram, not a copy: read the report as it is made.
        """
        s = self.stats
        return ConsumerReport(
            self.name,
            _HOST,
            pid=os.getpid(),
            processed=s.processed,
            failed=s.failed,
            retried=s.retried,
            dead=s.dead,
            timed_out=s.timed_out,
            running=len(self._running),
            stolen=s.stolen,
            serves=tuple(q.name for q in self.queues),
            # a copy made at once (atomic): the consumer's thread adds job queues while the settler's reads
            rows={q: Rows(m, r) for q, (m, r) in list(s.rows.items())},
            task_seconds=self._task_seconds,
            ended=self._ended,
        )
