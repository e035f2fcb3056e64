"""How many messages a consumer fetches next: back-pressure, batching and, pinned, holding fewer
tasks as the queues drain.

A policy of its own, apart from the consumer's loop, so that it can be read and tested as one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pacing:
    """A consumer's fetch policy.

    - Back-pressure: never more tasks held (fetched, not finished) than `max_concurrency`.
    - Batching: while tasks run and the queues are busy, wait until enough slots are free for one
      request to bring several messages: half a batch; a whole one when pinned with room for two.
    - Pinned (`pinned`: the consumer's threads share one core), any one running task keeps the core
      busy, so holding fewer costs nothing. Once the queues run low, a pinned consumer holds at most
      half an even share of what is left (guided self-scheduling): the last messages wait in the
      queue for whichever consumer frees a slot first, and the consumers end together instead of
      one running a batch of long last tasks while the others wait.
    """

    max_concurrency: int
    batch_size: int  # the largest of the consumer's queues'
    pinned: bool = False
    n_consumers: int = 1
    n_shards: int = 1

    def hold(self, left: int | None) -> int:
        """How many tasks to hold, given how many ready messages the last fetch's server had left."""
        if not self.pinned or left is None:
            return self.max_concurrency
        share = -(-left * self.n_shards // (2 * max(1, self.n_consumers)))  # ceil; shards hold about as much each
        return min(self.max_concurrency, max(2, share))

    def refill(self, hold: int) -> int:
        """With tasks running and the queues busy, fetch once this many slots are free."""
        fill = min(self.batch_size, hold)
        return fill if self.pinned and hold >= 2 * fill else max(1, fill // 2)

    def want(self, running: int, left: int | None, busy: bool) -> int:
        """How many messages to fetch now (0: wait for running tasks first); `busy`: the last fetch
        got all it asked for."""
        hold = self.hold(left)
        free = hold - running
        if free <= 0 or (running and busy and free < self.refill(hold)):
            return 0
        return free
