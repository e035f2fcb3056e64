"""How many messages a consumer fetches next.

Back-pressure, batching, read-ahead of quick tasks and, as the queues drain, holding fewer.

A policy of its own, apart from the consumer's loop, so that it can be read and tested as one.
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.constants import READ_AHEAD_MAX, READ_AHEAD_WINDOW_S


@dataclass(frozen=True, slots=True)
class Pacing:
    """A consumer's fetch policy.

    - Back-pressure: never more tasks held (fetched, not finished) than `slots` plus the
      read-ahead.
    - Read-ahead (`read_ahead`): messages held beyond the slots (threads or child processes), waiting for the
      next free one, as many as the consumer finishes in READ_AHEAD_WINDOW_S at its current pace.
      Quick tasks then come in large fetches (a round trip per message would cost more than the
      task); for long tasks it is next to nothing, so no message waits long behind them.
    - Batching: while tasks run and the queues are busy, wait until enough slots are free for one
      request to bring several messages: half a batch; a whole one when pinned with room for two.
      A batch is the queue's `batch_size`, or (None) whatever may be held. For async calls
      (`idle_max`, REFILL_MAX) no more slots than that wait idle for it: a call is a wait, and half
      of hundreds of them idle would halve the calls in flight. Threads and processes keep the
      half batch: there one fetch of hundreds beats several small ones (bench_workers' 512 threads).
    - As the queues run low the read-ahead goes; a pinned consumer (`pinned`: its threads share one
      core, so any one running task keeps the core busy) even holds at most half an even share of
      what is left (guided self-scheduling): the last messages wait in the queue for whichever
      consumer frees a slot first, and the consumers end together instead of one running a batch of
      long last tasks while the others wait.
    """

    slots: int
    batch_size: int | None  # the largest of the consumer's queues' (None: no limit of its own)
    pinned: bool = False
    n_consumers: int = 1
    n_shards: int = 1
    idle_max: int | None = None  # most slots left idle while waiting to fetch a batch (None: half a batch)

    def hold(self, left: int | None, read_ahead: int = 0) -> int:
        """How many tasks to hold, given how many ready messages the last fetch's server had left."""
        most = self.slots + read_ahead
        if left is None:
            return most
        share = -(-left * self.n_shards // (2 * max(1, self.n_consumers)))  # ceil; shards hold about as much each
        if self.pinned:
            return min(most, max(2, share))
        return min(most, max(self.slots, share))  # each slot may be a core of its own, or wait on I/O

    def refill(self, hold: int) -> int:
        """With tasks running and the queues busy, fetch once this many slots are free."""
        fill = min(self.batch_size or hold, hold)
        if self.pinned and hold >= 2 * fill:
            return fill
        if self.idle_max is None:
            return max(1, fill // 2)
        return max(1, min(fill // 2, hold - self.slots + self.idle_max))  # what is held beyond the slots may go first

    def _need(self, hold: int, running: int, busy: bool) -> int:
        """The free slots a fetch waits for: a refill while tasks run and the queues are busy, else one."""
        return self.refill(hold) if running and busy else 1

    def want(self, running: int, left: int | None, busy: bool, read_ahead: int = 0) -> int:
        """How many messages to fetch now (0: wait for running tasks first); `busy`: the last fetch got all it asked for."""
        hold = self.hold(left, read_ahead)
        free = hold - running
        return free if free >= self._need(hold, running, busy) else 0

    def short_of(self, running: int, left: int | None, busy: bool, read_ahead: int = 0) -> int:
        """How many of the `running` tasks must finish before `want` asks for more (at least 1)."""
        hold = self.hold(left, read_ahead)
        return max(1, self._need(hold, running, busy) - (hold - running))


def read_ahead(rate: float) -> int:
    """The read-ahead for a consumer finishing `rate` tasks a second (see `Pacing`)."""
    return min(READ_AHEAD_MAX, int(rate * READ_AHEAD_WINDOW_S))


class Throughput:
    """Tasks finished per second, smoothed over the last few looks (what sizes the read-ahead)."""

    SMOOTHING = 0.3  # the weight of the newest look

    def __init__(self) -> None:
        self.rate = 0.0
        self._count = 0
        self._since: float | None = None

    def add(self, n: int) -> None:
        self._count += n

    def update(self, now: float) -> float:
        """Take a look at `now` (monotonic seconds); returns the smoothed rate."""
        if self._since is not None and now > self._since:
            self.rate += self.SMOOTHING * (self._count / (now - self._since) - self.rate)
        self._count, self._since = 0, now
        return self.rate
