"""`QueueClient`: a blocking client of one queue server, many requests in flight per connection (`pipeline`).

It sends the requests of `conveyor.protocol.requests` over a `Transport` (`conveyor.client.transport`:
connecting, reconnecting, TLS, what a lost connection means for a request).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from conveyor.client.transport import Transport
from conveyor.message import DeadLetter, Message, Status
from conveyor.protocol import requests as calls
from conveyor.protocol.framing import Header
from conveyor.protocol.report import Counts
from conveyor.protocol.requests import CancelOutcome, QueueInfo, QueueStats
from conveyor.protocol.task_pages import TaskDetail, TaskPage, TaskState


class QueueClient(Transport):
    """A blocking client of one queue server: its operations, over a `Transport`.

    The `Transport` says how it connects, with TLS and a token, and what a lost connection means.
    """

    def sibling(self, timeout: float, connect_timeout: float) -> QueueClient:
        """Another client of the same server (token, TLS, limits) on a connection of its own.

        It has these timeouts: for a watcher that must not wait as long as this client's callers
        would.
        """
        return QueueClient(
            self.address, self._key, timeout=timeout, connect_timeout=connect_timeout, limits=self.limits, tls=self.tls
        )

    # --- operations (see `conveyor.protocol.requests` for each one's contract) --------------------------
    def ping(self) -> Header:
        return self.call(calls.ping())

    def declare(
        self,
        queue: str,
        *,
        kind: str | None = None,
        lease_s: float | None = None,
        max_attempts: int | None = None,
        fsync: str | None = None,
    ) -> QueueInfo:
        return self.call(calls.declare(queue, kind=kind, lease_s=lease_s, max_attempts=max_attempts, fsync=fsync))

    def queues(self) -> list[QueueInfo]:
        return self.call(calls.queues())

    def put(self, queue: str, messages: Sequence[Message]) -> list[int]:
        return [i for ids in self.pipeline(calls.puts(queue, messages, self.connect().server_limits)) for i in ids]

    def get(
        self,
        queue: str,
        n: int = 1,
        *,
        lease_s: float | None = None,
        wait_s: float = 0.0,
        tie: bool = False,
        consumer: str | None = None,
    ) -> list[Message]:
        return self.call(calls.get(queue, n, lease_s=lease_s, wait_s=wait_s, tie=tie, consumer=consumer))

    def ack(self, queue: str, ids: Sequence[int], results: Sequence[bytes | None] | None = None) -> list[bool]:
        return [o for ok in self.pipeline(calls.acks(queue, ids, results, self.connect().server_limits)) for o in ok]

    def nack(
        self,
        queue: str,
        ids: Sequence[int],
        errors: Sequence[str] | None = None,
        delay_s: float | Sequence[float] = 0.0,
        final: bool = False,
    ) -> list[bool]:
        made = calls.nacks(queue, ids, errors, delay_s, final, self.connect().server_limits)
        return [o for ok in self.pipeline(made) for o in ok]

    def release(self, queue: str, ids: Sequence[int]) -> list[bool]:
        return self.call(calls.release(queue, ids))

    def result(self, queue: str, ids: Sequence[int]) -> list[bytes | None]:
        out: list[bytes | None] = []
        while len(out) < len(ids):  # a reply holds what fits in this client's limits
            out += calls.progress(self.call(calls.result(queue, ids[len(out) :])), "result")
        return out

    def status(self, queue: str, ids: Sequence[int]) -> list[Status | None]:
        return self.call(calls.status(queue, ids))

    def report(self, worker: str, counts: Counts) -> None:
        self.call(calls.report(worker, counts))

    def workers(self) -> dict[str, Counts]:
        return self.call(calls.workers())

    def extend_lease(self, queue: str, ids: Sequence[int], lease_s: float) -> list[bool]:
        return self.call(calls.extend_lease(queue, ids, lease_s))

    def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        return self.call(calls.stats(queue))

    def purge(self, queue: str) -> int:
        return self.call(calls.purge(queue))

    def cancel(self, queue: str, ids: Sequence[int]) -> list[CancelOutcome]:
        """Make the READY and delayed messages of `ids` dead letters ("cancelled ..."); what became of each."""
        return self.call(calls.cancel(queue, ids))

    def drop(self, queue: str) -> bool:
        return self.call(calls.drop(queue))

    def results(self, queue: str, after: int = 0, limit: int = 1000) -> list[tuple[int, bytes]]:
        return self.call(calls.results(queue, after, limit))

    def iter_results(self, queue: str, after: int = 0, page: int = 1000) -> Iterator[tuple[int, bytes]]:
        """Every stored result from the first id above `after`, fetched a page at a time."""
        while rows := self.results(queue, after, page):
            yield from rows
            after = rows[-1][0]

    def dead_letters(self, queue: str, after: int = 0, limit: int = 1000) -> list[DeadLetter]:
        return self.call(calls.dead_letters(queue, after, limit))

    def iter_dead_letters(self, queue: str, after: int = 0, page: int = 1000) -> Iterator[DeadLetter]:
        """Every dead letter from the first id above `after`, fetched a page at a time."""
        while rows := self.dead_letters(queue, after, page):
            yield from rows
            after = rows[-1].message.id

    def forget(self, queue: str, ids: Sequence[int]) -> int:
        return self.call(calls.forget(queue, ids))

    def stored(self, queue: str, keys: Sequence[str]) -> list[int]:
        return self.call(calls.stored(queue, keys))

    def tasks(
        self,
        queue: str | None = None,
        *,
        task: str | None = None,
        state: TaskState | None = None,
        msg_id: int = 0,
        limit: int = 100,
    ) -> TaskPage:
        return self.call(calls.tasks(queue, task=task, state=state, msg_id=msg_id, limit=limit))

    def task(self, queue: str, msg_id: int) -> TaskDetail:
        return self.call(calls.task(queue, msg_id))

    def put_blob(self, data: bytes) -> str:
        return self.call(calls.put_blob(data))

    def get_blob(self, key: str) -> bytes | None:
        return self.call(calls.get_blob(key))

    def forget_blobs(self, keys: Sequence[str]) -> int:
        return self.call(calls.forget_blobs(keys))
