"""daskqueue's `QueuePool` and `ConsumerPool` over Conveyor's.

A daskqueue `QueuePool(client, n)` is `n` Conveyor queues, declared on every server of the client:
`dq-<random>-<i>` in memory; durable ones `dq-<digest of dirpath>-<i>`, so that a program run again
with the same `dirpath` reopens them, as daskqueue's durable queues reopened their directories.
They are filled round-robin as daskqueue did; each item is a Conveyor message (see `consumers`). A
daskqueue `ConsumerPool` is a `conveyor.ConsumerPool` of `n_consumers` processes serving those
queues, each holding one consumer object.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import operator
import os
import secrets
import threading
from collections.abc import Callable, Generator, Iterable
from enum import Enum, auto
from typing import Any, SupportsIndex

from conveyor.client.pool import QueuePool as ConveyorPool
from conveyor.compat.daskqueue.client import Client
from conveyor.compat.daskqueue.consumers import ConsumerBaseClass, GeneralConsumer, Message, deliver
from conveyor.constants import STORE_DURABLE, STORE_TRANSIENT
from conveyor.message import DeadLetter

log = logging.getLogger("conveyor.compat.daskqueue")

# Attempts a message may use, whatever the consumers' `retries` (which the put side cannot know): a
# bound on items that kill their consumer process every time (each such delivery counts an attempt).
PUT_MAX_RETRIES = 10
DEFAULT_DIRPATH = "/tmp/"  # daskqueue's, for a durable pool given none


class Size(int):
    """A queue's size, as daskqueue's actor calls answered it: `qsize().result()` (or awaited); also an int."""

    def result(self, timeout: float | None = None) -> int:
        return int(self)

    def __await__(self) -> Generator[Any, None, int]:
        return int(self)
        yield  # a generator that returns at once: `await queue.qsize()` is the size


class Durability(Enum):
    """Where a queue keeps its messages: on disk (`DURABLE`) or in the server's memory (`TRANSIENT`)."""

    DURABLE = auto()
    TRANSIENT = auto()


class PutTimeout(Exception):
    """daskqueue's name for a put that timed out (Conveyor's puts are bounded by its client's timeouts)."""


def count_arg(what: str, value: object, least: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if not isinstance(value, SupportsIndex):
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    n = operator.index(value)
    if n < least:
        raise ValueError(f"{what} must be >= {least}, got {n}")
    return n


def check_seconds(what: str, value: object, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{what} must be a number of seconds >= 0, got {value!r}")


def _check_worker_class(worker_class: object) -> None:
    if not (isinstance(worker_class, type) and issubclass(worker_class, GeneralConsumer)):
        raise RuntimeError("Can't submit arbitrary tasks to arbitrary consumer. Please use the default GeneralConsumer class")


class Queue:
    """One queue of a pool (what `queue_pool[i]` gives): `qsize()`, `put`, `put_many`.

    Its methods return their values, not dask actor futures.
    """

    def __init__(self, pool: QueuePool, name: str) -> None:
        self._pool = pool
        self.key = self.name = name

    def qsize(self) -> Size:
        """Items not finished: ready, delayed for a retry, or delivered and not yet acked (`.result()` too)."""
        return Size(self._pool._sizes([self.name])[self.name])

    def empty(self) -> bool:
        return self.qsize() == 0

    def put(self, item: Any, timeout: float | None = None) -> None:
        self.put_many([item], timeout)

    def put_many(self, list_items: Iterable[Any], timeout: float | None = None) -> None:
        check_seconds("timeout", timeout, optional=True)
        self._pool._put(self.name, list(list_items))

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"


class QueuePool:
    """`n_queues` queues on the client's servers, filled round-robin (daskqueue's `QueuePool`).

    `durability`: `Durability.TRANSIENT` (daskqueue's default) keeps a queue in the servers' memory,
    `DURABLE` on their disks, named after `dirpath` (default "/tmp/", as daskqueue's): a pool made
    again with the same `dirpath` on the same servers reopens its queues, with what they hold (the
    data itself lives in the servers' data directories). `ack_timeout` is the lease of a delivered
    message (extended while it runs); `retry` is ignored: an unacked message always comes back when
    its lease ends or its consumer dies.
    """

    def __init__(
        self,
        client: Client,
        n_queues: int,
        durability: Durability = Durability.TRANSIENT,
        ack_timeout: float = 5,
        retry: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(client, Client):
            raise TypeError(f"QueuePool: client must be a conveyor.compat.daskqueue.Client, got {type(client).__name__}")
        self.n_queues = count_arg("n_queues", n_queues, 1)
        if not isinstance(durability, Durability):
            raise ValueError(f"Please provide a correct durability type (a Durability), got {durability!r}")
        if isinstance(ack_timeout, bool) or not isinstance(ack_timeout, (int, float)) or ack_timeout <= 0:
            raise ValueError(f"ack_timeout must be a number of seconds > 0, got {ack_timeout!r}")
        if set(kwargs) - {"dirpath"}:
            raise TypeError(f"QueuePool: unexpected keyword argument(s) {', '.join(sorted(set(kwargs) - {'dirpath'}))}")
        self.client: Client | None = client
        self.durability, self.ack_timeout, self.retry = durability, ack_timeout, retry
        self._pool: ConveyorPool = client.pool
        if durability is Durability.DURABLE:
            dirpath = os.path.abspath(os.fspath(kwargs.get("dirpath", DEFAULT_DIRPATH)))
            prefix = f"dq-{hashlib.blake2b(dirpath.encode(), digest_size=4).hexdigest()}"
        else:
            prefix = f"dq-{secrets.token_hex(4)}"
        self.queue_names = [f"{prefix}-{i}" for i in range(self.n_queues)]
        for name in self.queue_names:  # on every server, so that each shard takes its share of each queue
            self._pool.queues.declare(
                name, kind=STORE_DURABLE if durability is Durability.DURABLE else STORE_TRANSIENT, lease_s=float(ack_timeout)
            )
        self._setup()

    def _setup(self) -> None:
        self._queues = [Queue(self, n) for n in self.queue_names]
        self._cycle_put = itertools.cycle(self._queues)
        self._cycle_get = itertools.cycle(self._queues)
        self._lock = threading.Lock()
        self._total_put = 0

    # --- a pool crosses to consumer processes (`ConsumerBaseClass.pool`) as its queues and servers
    def __getstate__(self) -> dict[str, Any]:
        return {"pool": self._pool, "names": self.queue_names, "durability": self.durability, "ack_timeout": self.ack_timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.client, self._pool, self.queue_names = None, state["pool"], state["names"]
        self.durability, self.ack_timeout, self.retry = state["durability"], state["ack_timeout"], False
        self.n_queues = len(self.queue_names)
        self._setup()

    # --- putting ---------------------------------------------------------------------------
    def _put(self, queue: str, items: list[Any]) -> None:
        """Each item a message running `deliver(item)` in a consumer (encoded as Conveyor encodes task arguments)."""
        if items:
            self._pool.map(deliver, items, _queue=queue, _max_retries=PUT_MAX_RETRIES)
            with self._lock:
                self._total_put += len(items)

    def _next(self) -> Queue:
        with self._lock:
            return next(self._cycle_put)

    def put(self, msg: Any, timeout: float | None = None) -> None:
        """One item (a `Message`, or any object for a custom consumer) on the next queue in turn."""
        self._next().put(msg, timeout)

    def put_many(self, list_items: Iterable[Any], timeout: float | None = None) -> None:
        """All the items on the next queue in turn (one request)."""
        self._next().put_many(list_items, timeout)

    def put_many_sync(self, list_items: Iterable[Any]) -> None:
        self.put_many(list_items)

    def put_nowait(self, item: Any) -> None:
        self.put(item)

    def submit(
        self,
        func: Callable[..., Any],
        *args: Any,
        timeout: float | None = None,
        worker_class: type[ConsumerBaseClass] = GeneralConsumer,
        **kwargs: Any,
    ) -> None:
        """Queue the call `func(*args, **kwargs)` for a `GeneralConsumer`."""
        _check_worker_class(worker_class)
        self.put(Message(func, *args, **kwargs), timeout=timeout)

    def batch_submit(
        self,
        list_calls: list[tuple[Any, ...]],
        sync_mode: bool = True,
        worker_class: type[ConsumerBaseClass] = GeneralConsumer,
        batch_size: int = 1000,
        **kwargs: Any,
    ) -> list[None]:
        """Queue calls given as `(func, *args)` tuples (each also gets `kwargs`), in chunks.

        Chunks of up to `batch_size`, each chunk on the next queue in turn; returns one None per
        chunk, as daskqueue.
        """
        _check_worker_class(worker_class)
        batch_size = count_arg("batch_size", batch_size, 1)
        calls = list(list_calls)
        for k, call in enumerate(calls):  # all checked before anything is put
            if not isinstance(call, tuple) or not call or not callable(call[0]):
                raise TypeError(f"batch_submit: item {k} must be a tuple (func, *args), got {call!r:.80}")
        size = min(len(calls) // self.n_queues + 1, batch_size)
        out: list[None] = []
        for start in range(0, len(calls), size):
            self.put_many([Message(func, *args, **kwargs) for func, *args in calls[start : start + size]])
            out.append(None)
        return out

    # --- looking -----------------------------------------------------------------------------
    def _sizes(self, names: list[str]) -> dict[str, int]:
        st = self._pool.stats()
        return {n: st[n].pending if n in st else 0 for n in names}

    def get_queue_size(self) -> dict[Queue, int]:
        """{queue: items not finished}, as daskqueue (keys are `Queue`s; `sum(...values())` is what is left)."""
        sizes = self._sizes(self.queue_names)
        return {q: sizes[q.name] for q in self._queues}

    def get_queues(self) -> list[Queue]:
        return list(self._queues)

    def get_queue(self, idx: int) -> Queue:
        return self._queues[idx]

    def get_next_queue(self) -> Queue:
        with self._lock:
            return next(self._cycle_get)

    def get_len(self) -> int:
        return self.n_queues

    def dead_letters(self) -> list[DeadLetter]:
        """The messages that failed for good (a Conveyor addition: daskqueue had none), with their errors."""
        return [d for q in self.queue_names for d in self._pool.dead_letters(q)]

    def stop_gc(self) -> None:
        """Nothing to stop: Conveyor's servers expire leases themselves."""

    def print(self) -> str:
        """A summary as daskqueue gives it (returned, not printed)."""
        sizes = self._sizes(self.queue_names)
        if self.n_queues < 5:
            return f"QueuePool : {self.n_queues} queue(s)" + "".join(f"\n\t{n}: {s} pending items" for n, s in sizes.items())
        return f"QueuePool : \n\t{self.n_queues} queue(s) \n\t{self._total_put} received \n\t{sum(sizes.values())} pending"

    def __repr__(self) -> str:
        return self.print()

    def __len__(self) -> int:
        return self.n_queues

    def __getitem__(self, idx: int) -> Queue:
        return self._queues[idx]
