"""Leases tied to the connection that took them: they end when its peer closes it.

A consumer fetches with `tie` (see the `get` operation). When its process dies (SIGKILL, the OOM
killer, a lost Spark executor), the kernel closes its sockets, and the server ends those leases at
once, as if they had run out, rather than leaving the work idle until they do. A connection the
server closes itself (idle, too slow, a protocol error, the server stopping) leaves them to their
time: its peer may be alive; so does one whose client said `bye` first (a `QueueClient` closing it
on purpose). A lost host closes nothing either; its leases run out as before.
"""

from __future__ import annotations

import contextvars
import logging

import numpy as np

from conveyor.errors import StoreError
from conveyor.server.queues import HostedQueue, QueueHost

log = logging.getLogger("conveyor.server.queue_server")

PRUNE_AT = 4096  # deliveries a connection holds before those settled meanwhile are dropped from its list


class TiedLeases:
    """The deliveries (queue, id, attempt) one connection took with `tie`.

    A delivery is known by its attempt: once acked, nacked (the next delivery counts another
    attempt) or out of its lease, it no longer matches, over whichever connection that happened.
    That is checked only when the connection closes or its list outgrows what it held the last
    time, so a get pays a list append and an ack nothing. A release (the attempt not counted)
    must come over the same connection, which drops those ids at once.
    """

    def __init__(self) -> None:
        self._held: dict[int, tuple[HostedQueue, list[int], list[int]]] = {}  # by id(queue): ids, attempts
        self._size = 0
        self._prune_at = PRUNE_AT

    def took(self, q: HostedQueue, ids: list[int], attempts: list[int]) -> None:
        _, held, tries = self._held.setdefault(id(q), (q, [], []))
        held += ids
        tries += attempts
        self._size += len(ids)
        if self._size >= self._prune_at:
            self._prune()

    def gave_back(self, q: HostedQueue, ids: list[int]) -> None:
        """Released ids: their attempt was not counted, so their next delivery, another's, would
        carry the same (id, attempt) as the one this connection took."""
        held = self._held.get(id(q))
        if held is not None:
            back = set(ids)
            keep = [k for k, i in enumerate(held[1]) if i not in back]
            self._size -= len(held[1]) - len(keep)
            held[1][:] = [held[1][k] for k in keep]
            held[2][:] = [held[2][k] for k in keep]

    def _prune(self) -> None:
        """Keep the deliveries that still stand; look again once the list has doubled."""
        self._size = 0
        for key, (q, ids, attempts) in list(self._held.items()):
            live = np.zeros(len(ids), bool) if q.dropped else q.store.delivered_as(ids, attempts)
            ids[:] = np.asarray(ids)[live].tolist()
            attempts[:] = np.asarray(attempts)[live].tolist()
            if not ids:
                del self._held[key]
            self._size += len(ids)
        self._prune_at = max(PRUNE_AT, 2 * self._size)

    def clear(self) -> None:
        """Tie nothing taken so far (the client closes the connection on purpose: it lives on)."""
        self._held.clear()
        self._size = 0

    def end(self, host: QueueHost, peer: str) -> int:
        """The connection's peer closed it: end the leases it still holds; returns how many ended."""
        n = 0
        for q, ids, attempts in self._held.values():
            if q.dropped or host.queues.get(q.info.name) is not q:
                continue
            try:
                ended = q.store.end_leases(ids, attempts)
            except StoreError as e:  # a full disk: they end with their leases instead
                log.error("%s: ending the leases of its closed connection on queue %s: %s", peer, q.info.name, e)
                continue
            if ended:
                host.touch(q)
                q.changed.notify()
                host.settled.notify()  # past its last attempt, a message ends here
                log.info("%s closed its connection: %d deliveries of queue %s back at once", peer, ended, q.info.name)
            n += ended
        self._held.clear()
        return n


# the leases of the connection a request came on: set for each connection, read by the `get` handler
TIED: contextvars.ContextVar[TiedLeases | None] = contextvars.ContextVar("conveyor_tied_leases", default=None)
