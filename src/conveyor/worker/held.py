"""The messages a consumer holds (fetched, not yet settled), and the queues it serves.

When each message is over its time limit, and when its lease is due an extension (a heartbeat); the
queues it serves, as it fetches from them; and, with early acks, how many it holds, told to its pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from conveyor.constants import DEFAULT_LEASE_S
from conveyor.message import Message
from conveyor.tasks.policy import heartbeat_s
from conveyor.tasks.queue_config import QueueConfig


@dataclass(frozen=True, slots=True)
class ServedQueue:
    """A queue as a consumer fetches from it (what its selector picks among)."""

    name: str
    priority: int
    batch_size: int | None  # None: as many as the consumer may take
    lease_s: float | None  # None: the server's default lease
    long_poll_s: float
    num_iterations: int

    @classmethod
    def of(cls, q: QueueConfig | str, batch_size: int | None) -> ServedQueue:
        c, lease = (QueueConfig(q), None) if isinstance(q, str) else (q, q.visibility_timeout_sec)
        return cls(c.name, c.priority, batch_size or c.batch_size, lease, c.long_poll_time_sec, c.num_iterations)


@dataclass(eq=False)
class Held:
    message: Message
    limit: float | None  # its time limit in seconds, counted from when a slot starts it
    heartbeat_at: float  # when its lease is next extended (monotonic)

    @classmethod
    def fetched(cls, message: Message, limit: float | None, now: float) -> Held:
        return cls(message, limit, now + heartbeat_s(message.lease_s))


def over_limit(held: Iterable[Held], started: Callable[[tuple[str, int]], float | None], now: float) -> list[tuple[Held, float]]:
    """The held messages running past their time limit, with the limit.

    `started((queue, id))` says when a slot started one (None: waiting in line for a slot, whose
    wait does not count).
    """
    return [
        (h, limit)
        for h in held
        if (limit := h.limit) is not None and (t0 := started(h.message.key)) is not None and now >= t0 + limit
    ]


def due_extensions(held: Iterable[Held], now: float) -> dict[tuple[str, float], list[int]]:
    """The ids of held messages whose lease is due an extension, by (queue, lease); their next is set."""
    due: dict[tuple[str, float], list[int]] = {}
    for h in held:
        if now >= h.heartbeat_at:
            lease = h.message.lease_s or DEFAULT_LEASE_S
            due.setdefault((h.message.queue, lease), []).append(h.message.id)
            h.heartbeat_at = now + heartbeat_s(lease)
    return due


def say_held(shared: Any, n: int) -> None:
    """In a consumer process with early acks: it holds `n` messages acked on delivery.

    `shared` (a shared array [held, changes], read by `ConsumerPool.join`) also counts the change.
    """
    with shared.get_lock():
        shared[0], shared[1] = n, shared[1] + 1
