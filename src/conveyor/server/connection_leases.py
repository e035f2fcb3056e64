"""Leases tied to the connection that took them: they end when its peer closes it.

A consumer fetches with `tie` (see the `get` operation). When its process dies (SIGKILL, the OOM
killer, a lost Spark executor), the kernel closes its sockets, and the server ends those leases at
once, as if they had run out, rather than leaving the work idle until they do. A connection the
server closes itself (too slow, a protocol error, the server stopping) leaves them to their time:
its peer may be alive; so does one whose client said `bye` first (a `QueueClient` closing it on
purpose), which the server hears as it reads it, before the close. A connection holding tied
deliveries is not closed for silence: a consumer whose tasks all run long fetches nothing for a
while. A lost host closes nothing; its leases run out as before, and then its connection is closed
for silence.
"""

from __future__ import annotations

import contextvars
import logging
import time
from itertools import compress

from conveyor.server.queues import HostedQueue, QueueHost

log = logging.getLogger("conveyor.server.queue_server")

PRUNE_AT = 4096  # deliveries a connection holds before those settled meanwhile are dropped from its list


class ConnectionLeases:
    """The deliveries (queue, id, delivery number) one connection took with `tie`.

    A delivery is known by its number (`Store.delivery_numbers`): once settled (acked, nacked,
    released, out of its lease: over whichever connection) or delivered again, it no longer
    matches. That is checked only when the connection closes, or when its list has outgrown what
    it held the last time, so a get pays a lookup of its delivery numbers and an ack nothing.
    """

    def __init__(self) -> None:
        self._taken: dict[int, tuple[HostedQueue, list[int], list[int]]] = {}  # by id(queue): ids, deliveries
        self._size = 0
        self._prune_at = PRUNE_AT

    def took(self, q: HostedQueue, ids: list[int]) -> None:
        _, taken, numbers = self._taken.setdefault(id(q), (q, [], []))
        taken += ids
        numbers += q.store.delivery_numbers(ids)
        self._size += len(ids)
        if self._size >= self._prune_at:
            self._prune()

    def _prune(self) -> None:
        """Keep the deliveries that still stand; look again once the list has doubled."""
        self._size = 0
        for key, (q, ids, numbers) in list(self._taken.items()):
            live = [False] * len(ids) if q.dropped else q.store.delivered_as(ids, numbers)
            ids[:] = compress(ids, live)
            numbers[:] = compress(numbers, live)
            if not ids:
                del self._taken[key]
            self._size += len(ids)
        self._prune_at = max(PRUNE_AT, 2 * self._size)

    def any_standing(self) -> bool:
        """Whether some of its deliveries still stand (then the server does not close it for silence)."""
        if self._taken:
            try:
                self._prune()
            except Exception:  # never the sweep's end: taken as holding, and looked at again next time
                log.exception("looking at a connection's tied deliveries")
                return True
        return bool(self._taken)

    def clear(self) -> None:
        """Tie nothing taken so far (its client said `bye`: it lives on)."""
        self._taken.clear()
        self._size = 0

    def end(self, host: QueueHost, peer: str) -> int:
        """The connection's peer closed it: end the leases it still holds; returns how many ended."""
        n = 0
        for q, ids, numbers in self._taken.values():
            if q.dropped or host.queues.get(q.info.name) is not q:
                continue
            try:
                ended = q.store.end_leases(ids, numbers)
            except Exception as e:  # a full disk, say: they end with their leases instead
                log.error("%s: ending the leases of its closed connection on queue %s: %s", peer, q.info.name, e)
                continue
            if ended:
                q.tasks.sweep(q.store.status, time.time(), closed=ids)
                host.touch(q)
                q.changed.notify()
                host.settled.notify()  # past its last attempt, a message ends here
                log.info("%s closed its connection: %d deliveries of queue %s back at once", peer, ended, q.info.name)
            n += ended
        self._taken.clear()
        return n


# the leases of the connection a request came on: set for each connection, read by the `get` handler
CONNECTION_LEASES: contextvars.ContextVar[ConnectionLeases | None] = contextvars.ContextVar(
    "conveyor_connection_leases", default=None
)
