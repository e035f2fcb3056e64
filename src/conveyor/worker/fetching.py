"""A consumer's fetch policy: which queue, from which shards, how many, and when.

It fetches from the queue its selector picks (served for up to `num_iterations` batches; a
selector's probe of a queue is a fetch, and what it finds is run, not fetched twice), from its
assigned shards first, then from the others (stealing). How many, and whether to wait for more free
slots first, is its `Pacing`'s call, from what the last fetch said of the queues (how much its
server had left, whether it came back short) and, reading ahead, from how fast tasks finish.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from conveyor.client.backend import QueueBackend
from conveyor.message import Message
from conveyor.worker.held import ServedQueue
from conveyor.worker.pacing import Pacing, Throughput, read_ahead
from conveyor.worker.selectors import QueueSelector
from conveyor.worker.stats import ConsumerStats

NO_QUEUE_WAIT_S = 0.05  # the selector picked no queue: how long to wait before asking it again


class Fetcher:
    """A consumer's fetches from `queues` on `servers`, `shards` in order (the first `n_assigned` its own).

    Paced by `pacing`; `reads_ahead`: whether it may hold quick tasks beyond the slots; `consumer`:
    its name, given with each fetch.
    """

    def __init__(
        self,
        servers: QueueBackend,
        queues: Sequence[ServedQueue],
        selector: QueueSelector,
        shards: list[int],
        n_assigned: int,
        stats: ConsumerStats,
        stop: threading.Event,
        pacing: Pacing,
        reads_ahead: bool,
        consumer: str | None = None,
    ) -> None:
        self.servers, self.queues, self.selector, self.stats, self._stop = servers, list(queues), selector, stats, stop
        self.shards, self.n_assigned = shards, n_assigned
        self.pacing, self.reads_ahead = pacing, reads_ahead
        self.consumer = consumer  # its name, which its gets give the servers (their task records show it)
        self._throughput, self._read_ahead = Throughput(), 0
        self.left: int | None = None  # READY messages the last fetch's queue had left on its server
        self.last_short = True  # the last fetch got less than it asked for: the queues are not busy
        self._current: ServedQueue | None = None
        self._iterations_left = 0
        self._stash: list[Message] = []

    # --- how many ------------------------------------------------------------------------
    def finished(self, n: int) -> None:
        """`n` more tasks finished (their pace sizes the read-ahead)."""
        self._throughput.add(n)

    def look(self, now: float) -> None:
        """Size the read-ahead to the pace tasks finish at, as of `now` (monotonic; every so often)."""
        if self.reads_ahead:
            self._read_ahead = read_ahead(self._throughput.update(now))

    def want(self, running: int) -> int:
        """How many messages to fetch now, with `running` held (0: wait for some of them to finish first)."""
        return self.pacing.want(running, self.left, not self.last_short, self._read_ahead)

    def short_of(self, running: int) -> int:
        """How many of the `running` tasks must finish before `want` asks for more (at least 1)."""
        return self.pacing.short_of(running, self.left, not self.last_short, self._read_ahead)

    @property
    def looks_drained(self) -> bool:
        """The last fetch came back short, or its queue had nothing left on its server."""
        return self.last_short or not self.left

    # --- fetching --------------------------------------------------------------------------
    def fetch(self, free: int, poll_s: Callable[[ServedQueue], float | None]) -> tuple[list[Message], list[Message]]:
        """Up to `free` messages from the selected queue, and those the selector's probes found beyond them (to give back).

        `poll_s(queue)`: how long to long-poll it (None: not at all, nothing is fetched: the
        consumer is stopping).
        """
        self._stash = []
        q: ServedQueue | None
        if self._current is not None and self._iterations_left > 0:
            q = self._current
        else:
            q = self.selector.get_queue(self.queues, self._probe_for(free))
            self._iterations_left = q.num_iterations if q is not None else 0
            self._current = q
        extra: list[Message] = []
        if self._stash:  # a selector that probed past a queue with work: the surplus goes back
            got, extra = self._stash[:free], self._stash[free:]
        elif q is None:
            self._stop.wait(NO_QUEUE_WAIT_S)
            return [], []
        else:
            wait = poll_s(q)
            if wait is None:
                return [], []
            got = self._get(q, min(q.batch_size or free, free), wait)
        self._iterations_left = self._iterations_left - 1 if got else 0
        self.last_short = len(got) < min((q.batch_size or free) if q is not None else 1, free)
        return got, extra

    def _probe_for(self, free: int) -> Callable[[ServedQueue], bool]:
        def probe(q: ServedQueue) -> bool:
            got = self._get(q, min(q.batch_size or free, free), 0.0)
            self._stash += got
            return bool(got)

        return probe

    def _get(self, q: ServedQueue, n: int, wait_s: float) -> list[Message]:
        got = self.servers.get(q.name, n, lease_s=q.lease_s, wait_s=wait_s, shards=self.shards, tie=True, consumer=self.consumer)
        self.left = getattr(got, "left", None)
        if got:
            self.stats.fetches += 1
            shard = self.servers.split_id(got[0].id)[0]
            self.stats.fetched_by_shard[shard] = self.stats.fetched_by_shard.get(shard, 0) + len(got)
            if shard not in self.shards[: self.n_assigned]:
                self.stats.stolen += len(got)
        return got
