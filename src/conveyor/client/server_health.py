"""Whether a pool's servers answer: `ServerHealth`.

Which servers answer, what each held when last heard from, and the error that ends a wait on one
out of reach for too long (rather than retrying it forever).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from conveyor.client.queue_client import QueueClient
from conveyor.errors import ServerUnreachableError
from conveyor.protocol.requests import QueueStats

T = TypeVar("T")


class ServerHealth:
    """Which servers (shards) of a pool answer, and the pending messages per queue each held when last heard from."""

    def __init__(self, clients: Sequence[QueueClient]) -> None:
        self.clients = clients
        self.held: dict[int, dict[str, int]] = {}

    def heard(self, per: list[T]) -> list[T]:
        """Note what each shard that answered holds (`per`: its stats, or its error), in shard order."""
        for s, st in enumerate(per):
            if isinstance(st, dict):
                self.held.setdefault(s, {}).update({q: x.pending for q, x in st.items() if isinstance(x, QueueStats)})
        return per

    def answering(self) -> list[QueueClient]:
        """The servers not known to be out of reach (their last exchange worked, or none failed yet)."""
        return [c for c in self.clients if c.unreachable_s() == 0.0]

    def check(self, limit_s: float, queues: Sequence[str] | None = None, what: str = "") -> None:
        """Raise `ServerUnreachableError` for the first server silent for longer than `limit_s`.

        The error names what the server held of `queues` when last heard from.
        """
        for s, c in enumerate(self.clients):
            gone = c.unreachable_s()
            if gone > limit_s:
                held = {q: n for q, n in self.held.get(s, {}).items() if queues is None or q in queues}
                raise ServerUnreachableError(c.address, gone, held, what)
