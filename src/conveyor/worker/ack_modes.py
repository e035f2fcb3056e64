"""When a consumer acks a message: after its task ran (at least once), or as it is delivered (at most once).

The consumer chooses its mode once, from its options' `early_ack`, and asks it whatever the two
differ in: what a fetch hands to the slots, which leases to extend, what a finished task sends to
the servers (and how big a result they keep), what is given back on a stop, and what it tells its
pool it holds. The loop itself is the same in both.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from conveyor.client.backend import QueueBackend
from conveyor.constants import H_TASK
from conveyor.errors import TaskError
from conveyor.message import Message
from conveyor.worker.executors import Completion
from conveyor.worker.held import Held, due_extensions
from conveyor.worker.middleware import Decision, Middleware
from conveyor.worker.settler import Ack, Extend, Nack

STOPPED = "WorkerStopped: the worker stopped before the task finished"  # a task acked on delivery, cut short


@dataclass(frozen=True, slots=True)
class Delivered:
    """Of a fetch, the messages to `run`, and the `error` that kept any others from running (None: none)."""

    run: list[Message]
    error: Exception | None


@dataclass(frozen=True, slots=True)
class Failed:
    """What becomes of a failed task (the middleware's `decision`), and the `nack` to send for it (None: nothing)."""

    decision: Decision
    nack: Nack | None


@dataclass(frozen=True, slots=True)
class Unstarted:
    """Of the messages waiting for a slot as the consumer stops, those to `give_back` and those to `run_here`."""

    give_back: list[Message]
    run_here: list[Message]


@dataclass(frozen=True, slots=True)
class Stopped:
    """Of the tasks running as the consumer ends, the messages to `give_back` and the `failed` settled in their place."""

    give_back: list[Message]
    failed: list[Completion]


class AckMode(ABC):
    """What differs between acking after a task ran and acking on delivery."""

    reads_ahead: bool  # whether the consumer may hold messages beyond its slots (see `Pacing`)

    @abstractmethod
    def delivered(self, servers: QueueBackend, got: list[Message], held: int) -> Delivered:
        """The messages of a fetch to run (`held` are held already), and the error that kept any others from it."""

    @abstractmethod
    def holding(self, held: int) -> None:
        """The consumer holds `held` messages now (after a fetch, or as tasks end)."""

    @abstractmethod
    def extensions(self, held: Iterable[Held], now: float) -> list[Extend]:
        """The lease extensions due for the `held` messages at `now`."""

    @abstractmethod
    def result_room(self, servers: QueueBackend) -> float:
        """The largest result kept (bigger ones are checked against their own server's limit)."""

    @abstractmethod
    def succeeded(self, m: Message, result: bytes | None) -> Ack | None:
        """What to send for a task that ran to the end (None: nothing)."""

    @abstractmethod
    def failed(self, m: Message, error: TaskError) -> Failed:
        """What becomes of a failed task, and what to send for it (None: nothing)."""

    @abstractmethod
    def unstarted(self, waiting: list[Message]) -> Unstarted:
        """Split the messages `waiting` for a slot as the consumer stops: the consumer gives back or runs them as told."""

    @abstractmethod
    def stopped(self, running: list[Message]) -> Stopped:
        """What the consumer does with tasks still `running` as it ends."""


class SettleAfterRunning(AckMode):
    """At least once: a message is acked (with its result) or nacked once its task ends.

    Until then it is leased, and the lease of a long task is extended; a message not started, or
    still running when the consumer ends, goes back to its queue for another consumer.
    """

    reads_ahead = True

    def __init__(self, middleware: Sequence[Middleware]) -> None:
        self.middleware = middleware  # the consumer's own list: one added later is asked too

    def delivered(self, servers: QueueBackend, got: list[Message], held: int) -> Delivered:
        return Delivered(got, None)

    def holding(self, held: int) -> None:
        pass  # leased, not acked: the servers count them

    def extensions(self, held: Iterable[Held], now: float) -> list[Extend]:
        due = due_extensions(held, now)
        return [Extend(q, i, lease) for (q, lease), ids in due.items() for i in ids]

    def result_room(self, servers: QueueBackend) -> float:
        return min(c.server_limits.max_item_bytes for c in servers.clients)  # what any server keeps

    def succeeded(self, m: Message, result: bytes | None) -> Ack | None:
        return Ack(m.queue, m.id, result)

    def failed(self, m: Message, error: TaskError) -> Failed:
        d = next((d for mw in self.middleware if (d := mw.on_failure(m, error)) is not None), Decision(False))
        return Failed(d, Nack(m.queue, m.id, error.error, d.delay_s, d.final))

    def unstarted(self, waiting: list[Message]) -> Unstarted:
        return Unstarted(waiting, [])

    def stopped(self, running: list[Message]) -> Stopped:
        """Give them back READY, the attempt not counted: the worker stopped, the task did not fail.

        Counted, a task on its last attempt would go to the dead letters.
        """
        return Stopped(running, [])


class AckOnDelivery(AckMode):
    """At most once (daskqueue's default): a message is acked as it is delivered, before its task runs.

    So it has no lease to extend and no result is stored; a task that fails is not retried, and one
    running when its consumer ends is lost (counted as failed). What is acked cannot go back: it
    runs here, and the consumer reads none ahead. Its pool is told how many acked messages it holds
    (`holding`), since the servers no longer count them.
    """

    reads_ahead = False

    def __init__(self, holding: Callable[[int], object] | None) -> None:
        self._holding = holding

    def delivered(self, servers: QueueBackend, got: list[Message], held: int) -> Delivered:
        """Acked before they run: a crash from here on loses them."""
        if not got:
            return Delivered(got, None)
        self.holding(held + len(got))  # said before the acks: a join seeing them acked sees them held
        return ack_on_delivery(servers, got)

    def holding(self, held: int) -> None:
        if self._holding is not None:
            self._holding(held)

    def extensions(self, held: Iterable[Held], now: float) -> list[Extend]:
        return []  # acked: no lease left to extend

    def result_room(self, servers: QueueBackend) -> float:
        return math.inf  # none is stored: none is too big

    def succeeded(self, m: Message, result: bytes | None) -> Ack | None:
        return None

    def failed(self, m: Message, error: TaskError) -> Failed:
        return Failed(Decision(True), None)  # settled already: no retry can follow

    def unstarted(self, waiting: list[Message]) -> Unstarted:
        return Unstarted([], waiting)  # acked: they cannot go back

    def stopped(self, running: list[Message]) -> Stopped:
        return Stopped([], [Completion(m, None, TaskError(m.headers.get(H_TASK, "?"), STOPPED, True), -1) for m in running])


def ack_on_delivery(pool: QueueBackend, got: list[Message]) -> Delivered:
    """Ack `got` now, before any of it runs.

    Sent at once on the consumer's own connections, not by the settler's next batch: a message is
    settled before it starts. One request per queue and server, in turn; returns the messages whose
    ack took, and the error of the first request that failed (None if none). The messages of the
    requests before it were acked: they are returned, to run (an ack that went through is never
    lost). Those of the failed request and after it are not returned: not run here, they come back
    to their queue when their leases end (or, acked by the failed request after all, are lost: at
    most once). One refused (its lease had ended: another consumer has it) is not returned either.
    """
    groups: dict[tuple[str, int], list[Message]] = {}
    for m in got:
        groups.setdefault((m.queue, pool.split_id(m.id)[0]), []).append(m)
    out: list[Message] = []
    for (q, _), ms in groups.items():
        try:
            oks = pool.ack(q, [m.id for m in ms])
        except Exception as e:  # said to the caller, after what was acked starts
            return Delivered(out, e)
        out += [m for m, ok in zip(ms, oks, strict=True) if ok]
    return Delivered(out, None)


def ack_mode(early_ack: bool, middleware: Sequence[Middleware], holding: Callable[[int], object] | None) -> AckMode:
    """The mode a consumer's options choose."""
    return AckOnDelivery(holding) if early_ack else SettleAfterRunning(middleware)
