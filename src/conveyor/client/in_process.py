"""InProcessQueues: a `QueueBackend` (and task `Publisher`/`ResultReader`) over MemoryStores in this process.

One `MemoryStore` per queue, one lock around all of them, blobs in a dict keyed by sha256 hex: what
a transient queue server does per operation (see `conveyor.server.handlers`), minus the network.
Consumers, settlers, `@task` publishing and `TaskHandle.result()` work against it unchanged, so
worker logic can be tested without a server. It has no threads of its own: a `get` or `gather`
waits on a condition that every change notifies. It lives in one process: a consumer using it
runs tasks in threads (`pool="thread"`), not in child processes.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from conveyor.client.sharded import ShardedQueues
from conveyor.constants import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    ERR_BAD_ARGUMENT,
    ERR_NO_QUEUE,
    ERR_QUEUE_CONFLICT,
    H_IDEMPOTENCY_KEY,
    STORE_TRANSIENT,
    WORKER_GONE_S,
)
from conveyor.errors import ConveyorError, RequestError
from conveyor.message import DeadLetter, Message, Status
from conveyor.protocol.framing import Limits
from conveyor.protocol.report import SEEN, Counts
from conveyor.protocol.requests import Fetched, QueueInfo, QueueStats
from conveyor.storage import MemoryStore
from conveyor.tasks.publish import TaskHandle, outcome
from conveyor.tasks.queue_config import QueueConfig

if TYPE_CHECKING:
    from typing import Self

_LIVE: weakref.WeakValueDictionary[str, InProcessQueues] = weakref.WeakValueDictionary()


def _live(token: str) -> InProcessQueues:
    """What unpickling an InProcessQueues gives: the same object (it has no connections to copy)."""
    q = _LIVE.get(token)
    if q is None:
        raise ConveyorError(
            "an InProcessQueues lives in the process that made it: it cannot cross to another "
            "(run consumers on it with pool='thread')"
        )
    return q


@dataclass(frozen=True)
class _Shard:
    server_limits: Limits = field(default_factory=Limits)  # the one shard takes what a server with default limits takes


@dataclass
class _Queue:
    info: QueueInfo
    store: MemoryStore
    keys: dict[str, int] = field(default_factory=dict)  # idempotency key -> id


class InProcessQueues:
    """Named in-memory queues on one shard, thread-safe; see the module docstring."""

    def __init__(self, *, lease_s: float = DEFAULT_LEASE_S, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        self.lease_s, self.max_attempts = lease_s, max_attempts  # of queues made without `declare`
        self._cond = threading.Condition()  # the one lock; notified at every change
        self._queues: dict[str, _Queue] = {}
        self._blobs: dict[str, bytes] = {}
        self._workers: dict[str, tuple[float, Counts]] = {}
        self._configs: dict[str, QueueConfig] = {}
        self._token = uuid.uuid4().hex
        self._shards = [_Shard()]
        _LIVE[self._token] = self

    def __reduce__(self) -> tuple[Callable[[str], InProcessQueues], tuple[str]]:
        return _live, (self._token,)

    # --- shards -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return 1

    @property
    def addresses(self) -> list[str]:
        return ["in-process"]

    @property
    def clients(self) -> list[_Shard]:
        return self._shards

    def assign(self, consumer: int, n_consumers: int) -> list[int]:
        if not 0 <= consumer < n_consumers:
            raise ValueError(f"consumer must be in [0, {n_consumers}), got {consumer}")
        return [0]

    split_id = staticmethod(ShardedQueues.split_id)  # every id is on shard 0

    # --- queues -------------------------------------------------------------------------------
    def _queue(self, name: str, create: bool = False) -> _Queue:
        if name not in self._queues and not create:
            raise RequestError(ERR_NO_QUEUE, f"no queue named {name!r} in this process")
        if name not in self._queues:
            self._queues[name] = self._new(name, None, None)
        return self._queues[name]

    def _new(self, name: str, lease_s: float | None, max_attempts: int | None) -> _Queue:
        lease = float(self.lease_s if lease_s is None else lease_s)
        attempts = int(self.max_attempts if max_attempts is None else max_attempts)
        return _Queue(
            QueueInfo(name, STORE_TRANSIENT, lease, attempts, None), MemoryStore(name, max_attempts=attempts, lease_s=lease)
        )

    def declare(
        self,
        queue: str,
        *,
        kind: str | None = None,
        lease_s: float | None = None,
        max_attempts: int | None = None,
        fsync: str | None = None,
    ) -> QueueInfo:
        """Make a transient queue with these settings (one that exists must have them, as on a server)."""
        if kind not in (None, STORE_TRANSIENT):  # as a server without --data-dir refuses it: nothing made
            raise RequestError(ERR_BAD_ARGUMENT, f"queue {queue!r}: in-process queues are {STORE_TRANSIENT}, not {kind!r}")
        with self._cond:
            if queue not in self._queues:
                self._queues[queue] = self._new(queue, lease_s, max_attempts)
            have = self._queues[queue].info
            if lease_s not in (None, have.lease_s) or max_attempts not in (None, have.max_attempts):
                raise RequestError(ERR_QUEUE_CONFLICT, f"queue {queue!r} exists with {have}")
            return have

    def put(self, queue: str, messages: Sequence[Message]) -> list[int]:
        """Put messages; one with an idempotency key already stored gets that message's id instead."""
        with self._cond:
            q = self._queue(queue, create=True)
            keys = [m.headers.get(H_IDEMPOTENCY_KEY) if m.headers else None for m in messages]
            if all(k is None for k in keys):
                ids = q.store.put(messages)
            else:  # one at a time: a key's later copies in this batch find the first
                ids = []
                for m, k in zip(messages, keys, strict=True):
                    old = None if k is None else q.keys.get(k)
                    if old is None or q.store.status(old) is None:
                        [old] = q.store.put([m])
                        q.keys.update({} if k is None else {k: old})
                    ids.append(old)
            self._cond.notify_all()
            return ids

    def get(
        self,
        queue: str,
        n: int = 1,
        *,
        lease_s: float | None = None,
        wait_s: float = 0.0,
        shards: Sequence[int] | None = None,
        tie: bool = False,
        consumer: str | None = None,
    ) -> list[Message]:
        """Lease up to n messages, waiting up to `wait_s` for some to come.

        The wait is woken by puts and nacks, or when a delayed message comes due or a lease runs
        out. `tie` and `consumer` have no effect: no connection, no server keeping task records.
        """
        deadline = time.monotonic() + wait_s
        with self._cond:
            store = self._queue(queue, create=True).store
            while True:
                batch = store.get_batch(n, lease_s)
                left = deadline - time.monotonic()
                if batch.ids or n == 0 or left <= 0:
                    break
                self._cond.wait(store.poll_wait(left))
            self._cond.notify_all()  # its sweep may have ended leases: messages back, or dead (a gather waits)
            out = Fetched(batch.messages())
            out.left = store.ready_left()
            return out

    def _settle(self, queue: str, change: Callable[[MemoryStore], list[bool]]) -> list[bool]:
        with self._cond:
            ok = change(self._queue(queue).store)
            self._cond.notify_all()
            return ok

    def ack(self, queue: str, ids: Sequence[int], results: Sequence[bytes | None] | None = None) -> list[bool]:
        return self._settle(queue, lambda s: s.ack_many(ids, results))

    def nack(
        self,
        queue: str,
        ids: Sequence[int],
        errors: Sequence[str] | None = None,
        delay_s: float | Sequence[float] = 0.0,
        final: bool = False,
    ) -> list[bool]:
        delays = [float(delay_s)] * len(ids) if isinstance(delay_s, (int, float)) else [float(d) for d in delay_s]
        errs = [""] * len(ids) if errors is None else list(errors)
        return self._settle(queue, lambda s: s.nack_each(ids, errs, delays, final))

    def release(self, queue: str, ids: Sequence[int]) -> list[bool]:
        return self._settle(queue, lambda s: s.release_many(ids))

    def extend_lease(self, queue: str, ids: Sequence[int], lease_s: float) -> list[bool]:
        return self._settle(queue, lambda s: [s.extend_lease(i, lease_s) for i in ids])

    def result(self, queue: str, ids: Sequence[int]) -> list[bytes | None]:
        with self._cond:
            store = self._queue(queue).store
            return [store.result(i) for i in ids]

    def status(self, queue: str, ids: Sequence[int]) -> list[Status | None]:
        with self._cond:
            store = self._queue(queue).store
            return [store.status(i) for i in ids]

    def results(self, queue: str) -> Iterator[tuple[int, bytes]]:
        with self._cond:
            return iter(list(self._queue(queue).store.results()))

    def dead_letters(self, queue: str) -> list[DeadLetter]:
        with self._cond:
            return self._queue(queue).store.dead_letters()

    # --- workers and stats --------------------------------------------------------------------
    def report(self, worker: str, counts: Counts) -> None:
        with self._cond:
            self._workers[worker] = (time.monotonic(), dict(counts))

    def workers(self) -> dict[str, Counts]:
        """Consumers heard from within WORKER_GONE_S, with their latest counts and `seen` seconds ago."""
        now = time.monotonic()  # not the wall clock: a step of it would keep a dead consumer listed, or drop a live one
        with self._cond:
            return {w: {**c, SEEN: now - t} for w, (t, c) in self._workers.items() if now - t <= WORKER_GONE_S}

    def _stats(self, names: Iterable[str]) -> dict[str, QueueStats]:
        out = {}
        for name in names:
            s = self._queues[name].store.stats()
            out[name] = QueueStats(name, s.ready, s.delivered, s.delayed, s.acked, s.failed, s.bytes_on_disk)
        return out

    def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        with self._cond:
            return self._stats([self._queue(queue).info.name] if queue is not None else list(self._queues))

    def check_reachable(self, limit_s: float, queues: Sequence[str] | None = None, what: str = "") -> None:
        """Never: the queues are in this process."""

    def wait_drained(self, queues: Sequence[str] | None, wait_s: float) -> dict[str, QueueStats]:
        with self._cond:
            names = list(self._queues) if queues is None else [q for q in queues if q in self._queues]
            self._cond.wait_for(lambda: all(self._queues[q].store.drained() for q in names), wait_s)
            return self._stats(names)

    # --- blobs --------------------------------------------------------------------------------
    def put_blob(self, data: bytes) -> str:
        key = hashlib.sha256(data).hexdigest()
        with self._cond:
            self._blobs[key] = bytes(data)
        return key

    def get_blob(self, key: str, shard: int = 0) -> bytes | None:
        with self._cond:
            return self._blobs.get(key)

    # --- tasks: Publisher and ResultReader ----------------------------------------------------
    def use_queues(self, configs: Iterable[QueueConfig]) -> None:
        """Queue configurations that publishing checks time limits against."""
        with self._cond:
            self._configs.update((c.name, c) for c in configs)

    def queue_config(self, queue: str) -> QueueConfig | None:
        """From `use_queues`, else the queue's lease as its visibility timeout (None: no such queue yet)."""
        with self._cond:
            if queue in self._configs:
                return self._configs[queue]
            q = self._queues.get(queue)
            return None if q is None else QueueConfig(name=queue, visibility_timeout_sec=q.info.lease_s)

    def gather(self, handles: Sequence[TaskHandle], timeout: float | None = None) -> list[Any]:
        """The results of published tasks, in order, once all have finished (waiting on every change).

        TaskFailedError for the first that ended in the dead letters, TimeoutError after `timeout` s.
        """
        out: list[Any] = [None] * len(handles)
        todo = list(range(len(handles)))
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                left = []
                for k in todo:
                    h = handles[k]
                    store = self._queue(h.queue).store
                    done, out[k] = outcome(h, store.result(h.id), store.status(h.id), functools.partial(_dead_error, store, h.id))
                    if not done:
                        left.append(k)
                todo = left
                if not todo:
                    return out
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise TimeoutError(f"gather: {len(todo)} of {len(handles)} tasks unfinished after {timeout} s")
                self._cond.wait(wait)

    def task_status(self, handle: TaskHandle) -> Status | None:
        return self.status(handle.queue, [handle.id])[0]

    # --- lifecycle ----------------------------------------------------------------------------
    def with_own_connections(self) -> Self:
        """Itself: it has no connections, and every thread may call it."""
        return self

    def close(self) -> None:
        """Nothing to let go of: the queues stay (a settler's copy of this object is this object)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"InProcessQueues({sorted(self._queues)!r})"


def _dead_error(store: MemoryStore, msg_id: int) -> str | None:
    dead = store.dead_letters(after=msg_id - 1, limit=1)
    return dead[0].error if dead and dead[0].message.id == msg_id else None
