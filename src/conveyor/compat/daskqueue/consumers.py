"""daskqueue's consumer classes and `Message`, and how they run inside Conveyor consumer processes.

A daskqueue consumer was a dask actor: an object on a worker that fetched items and called its
`process_item` on each. Here each process of a `conveyor.ConsumerPool` holds one such object
(`ConsumerHooks.start` makes it, `stop` sends back what its `get_results()` holds), and every item
on a compat queue is a Conveyor message running `deliver(item)`, which hands the item to that object.
So fetching, leases, retries, dead letters and early or late acks are Conveyor's own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import cloudpickle

from conveyor.errors import SerializationError, TaskError
from conveyor.message import Message as ConveyorMessage
from conveyor.tasks.envelope import encode_result
from conveyor.worker.hooks import ConsumerHooks
from conveyor.worker.middleware import Decision, Middleware

log = logging.getLogger("conveyor.compat.daskqueue")


class Message:
    """A call put by `QueuePool.submit` / `batch_submit`: `data()` runs it (daskqueue's `Message`)."""

    def __init__(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if not callable(func):
            raise TypeError(f"Message: {func!r} is not callable")
        self.id = uuid.uuid4()
        self.timestamp = int(time.time())
        self.delivered_timestamp: float | None = None
        self.data = partial(func, *args, **kwargs)

    def __hash__(self) -> int:
        return hash(self.id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and other.id == self.id

    def __str__(self) -> str:
        return f"Message {self.id.int}"

    def serialize(self) -> bytes:
        return bytes(cloudpickle.dumps(self))


class NotACall(TypeError):
    """A plain item reached a `GeneralConsumer`, which runs only calls: no retry can mend that."""

    retryable = False  # Conveyor fails it at once (a dead letter), rather than retrying it


class ConsumerBaseClass(ABC):
    """Subclass it and write `process_item(item)`; optionally `get_results()` for `ConsumerPool.results()`.

    One instance per consumer process, made there with daskqueue's arguments. `pool` is the
    `QueuePool` (its connections in that process: `self.pool.put(...)` queues more work). Items
    run in the consumer's threads, several at once: guard shared state as with daskqueue's
    worker threads. What `process_item` returns is ignored, as by daskqueue, except that with
    late acks it is also stored as the message's Conveyor result when it can be (see `deliver`).
    """

    def __init__(
        self, id: int, name: str, pool: Any, batch_size: int, max_concurrency: int, retries: int, early_ack: bool
    ) -> None:
        self.id = id
        self.name = f"{name}-{os.getpid()}"
        self.pool = pool
        self.items: list[Any] = []  # every item received, as daskqueue keeps them
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self.n_retries = retries
        self.early_ack = early_ack
        self._lock = threading.Lock()
        self._pending = 0

    def len_items(self) -> int:
        return len(self.items)

    def len_pending_items(self) -> int:
        return self._pending

    def get_items(self) -> list[Any]:
        return self.items

    def _handle(self, item: Any) -> Any:
        with self._lock:
            self.items.append(item)
            self._pending += 1
        try:
            return self.process_item(item)
        finally:
            with self._lock:
                self._pending -= 1

    @abstractmethod
    def process_item(self, item: Any) -> Any:
        """Process one item from the queues."""


class DummyConsumer(ConsumerBaseClass):
    """Logs each item (daskqueue's `DummyConsumer`)."""

    def process_item(self, item: Any) -> None:
        log.info("[%s]: Processing %s", self.name, item)


class GeneralConsumer(ConsumerBaseClass):
    """Runs the calls `QueuePool.submit` / `batch_submit` put; `get_results()` is {hash(message): result}."""

    def __init__(
        self,
        id: int,
        name: str,
        pool: Any,
        batch_size: int,
        max_concurrency: int,
        retries: int,
        early_ack: bool,
        backend: object = None,
    ) -> None:
        super().__init__(id, name, pool, batch_size, max_concurrency, retries, early_ack)
        self.backend = backend
        self._results: dict[int, Any] = {}

    def get_results(self) -> dict[int, Any]:
        return self._results

    def save(self, msg: Message, result: Any) -> None:
        self._results[hash(msg)] = result

    def process_item(self, msg: Any) -> Any:
        if not isinstance(msg, Message):
            raise NotACall(
                f"GeneralConsumer runs the calls put by submit or batch_submit, got {type(msg).__name__} "
                f"{msg!r:.80}: give the ConsumerPool a ConsumerClass whose process_item takes such items"
            )
        result = msg.data()
        self.save(msg, result)
        return result


class _Here:
    """The consumer object of this process (set by `Hooks.start` in a consumer process)."""

    consumer: ConsumerBaseClass | None = None
    result_limit: int | None = None
    servers: Any = None  # its queue pool's servers (a conveyor QueuePool)


def deliver(item: Any) -> Any:
    """The Conveyor task every compat message runs: `item` to this process's consumer object.

    daskqueue ignored what `process_item` returns: here it is the message's result only with late
    acks, and only when it can be stored (it encodes, and fits the servers' limit); otherwise None
    is, and the item succeeded all the same (a result that cannot be stored is logged).
    """
    consumer = _Here.consumer
    if consumer is None:
        raise RuntimeError(
            "no daskqueue consumer in this process: the items of a conveyor.compat.daskqueue "
            "QueuePool are run by its ConsumerPool"
        )
    value = consumer._handle(item)
    if value is None or consumer.early_ack:  # acked on delivery: no result is stored
        return None
    try:
        size = len(encode_result(value))
    except SerializationError as e:
        log.warning("consumer %s: process_item returned what cannot be stored as the result (%s): none is", consumer.name, e)
        return None
    if size > _result_limit():
        log.warning(
            "consumer %s: process_item returned a %s of %d bytes encoded, over the servers' limit of %d: no result is stored",
            consumer.name,
            type(value).__name__,
            size,
            _result_limit(),
        )
        return None
    return value


def _result_limit() -> int:
    """The largest result every server takes (their hellos say; asked once per process)."""
    if _Here.result_limit is None:
        _Here.result_limit = min(c.connect().server_limits.max_item_bytes for c in _Here.servers.queues.clients)
    return _Here.result_limit


@dataclass(frozen=True)
class Hooks(ConsumerHooks):
    """Makes a consumer process's consumer object and, when it stops, sends back its results.

    The class is cloudpickled: one defined in a script or a function goes too, as dask sent it.
    """

    consumer_class: bytes
    queue_pool: Any  # the compat QueuePool (typed loosely: pools imports this module)
    batch_size: int
    max_concurrency: int
    retries: int
    early_ack: bool

    def start(self, index: int) -> None:
        cls = cloudpickle.loads(self.consumer_class)
        _Here.servers, _Here.result_limit = self.queue_pool._pool, None
        _Here.consumer = cls(
            index + 1,
            f"{cls.__name__}-{index}",
            self.queue_pool,
            self.batch_size,
            self.max_concurrency,
            self.retries,
            self.early_ack,
        )

    def stop(self) -> object:
        """(items received, cloudpickled `get_results()` or None); an error getting them is logged, not raised."""
        consumer, _Here.consumer = _Here.consumer, None
        if consumer is None:
            return None
        try:
            get = getattr(consumer, "get_results", None)  # daskqueue's consumers need not have one
            results = get() if callable(get) else None
            return consumer.len_items(), cloudpickle.dumps(results)
        except Exception as e:
            log.error("consumer %s: could not send back its results: %s: %s", consumer.name, type(e).__name__, e)
            return consumer.len_items(), None


class CapRetries(Middleware):
    """daskqueue's `retries`: a message that failed `retries + 1` times is failed for good.

    It becomes a dead letter, whatever attempts it has left; before that, Conveyor's `Retries`
    decides (backoff).
    """

    def __init__(self, retries: int) -> None:
        self.retries = retries

    def on_failure(self, message: ConveyorMessage, error: TaskError) -> Decision | None:
        return Decision(final=True) if message.attempts > self.retries else None
