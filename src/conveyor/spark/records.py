"""A Spark job's records: a small queue where each of its tasks records once what it did.

A Spark task may run more than once (retried after a failure, or run again when an executor is
lost); its record goes on the queue once whatever its attempts (an idempotency key names the task),
so the driver counts each task once. The fed consumers of a `SparkConsumerPool` record the rows
they put (`RowsPut`), and the read-back tasks of a `QueueJob` what they read (`ReadCounts`). The
records are taken, never acked: the queue is dropped once they are read, where the servers answer
(`drop_where_answering`, as the job drops its own queues).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from conveyor.constants import H_IDEMPOTENCY_KEY
from conveyor.message import Message
from conveyor.protocol import requests as calls

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from conveyor.client.queue_client import QueueClient
    from conveyor.client.sharded import ShardedQueues
    from conveyor.protocol.requests import Call

log = logging.getLogger("conveyor.spark")

TAKE_AT_ONCE = 1000  # records taken per request when they are read
R = TypeVar("R", bound="DataclassInstance")


@dataclasses.dataclass(frozen=True, slots=True)
class RowsPut:
    """What a fed consumer task put on the queue before consuming."""

    rows: int


@dataclasses.dataclass(frozen=True, slots=True)
class ReadCounts:
    """What a read-back task read of one server's results: the input rows they stood for, the output rows, the failed ones.

    `inputs` counts each message read once, as the rows it carried when put (`Parcel.rows`), so
    the job can check that every input came back; `rows` may differ from it (a form may give any
    number of output rows per message), and `failed` counts output rows. `instances` counts what
    the results say of the instances built of a class given as the function.
    """

    inputs: int
    rows: int
    failed: int
    instances: int = 0  # instances of the function's class its results say were built (`Instances.take_built`)

    def __add__(self, other: ReadCounts) -> ReadCounts:
        return ReadCounts(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))


class TaskRecords(Generic[R]):
    """The records queue `queue`, each record an `R` (a dataclass of plain fields) by task index."""

    def __init__(self, queue: str, kind: Callable[..., R]) -> None:
        self.queue = queue
        self._kind = kind

    def declare(self, pool: ShardedQueues) -> None:
        """Declare the queue on every server, its writes left to the OS (fsync="never").

        A record lives as long as its job; one lost with a host that lost power is missed by the
        driver's count, which fails the job saying so, and costs no fsync on the job's path (after a
        job's bulk writes, each fsync waited 10-30 ms for the disk).
        """
        pool.declare(self.queue, fsync="never")

    def record(self, backend: ShardedQueues | QueueClient, task: int, record: R) -> None:
        """Task `task` says `record`, once whatever its attempts."""
        fields = {"task": task, **dataclasses.asdict(record)}
        message = Message(payload=json.dumps(fields).encode(), headers={H_IDEMPOTENCY_KEY: f"{self.queue}:{task}"})
        backend.put(self.queue, [message])

    def count(self, pool: ShardedQueues) -> int:
        """How many tasks have recorded so far (the queue's pending messages: one per task)."""
        st = pool.wait_drained([self.queue], 0.0).get(self.queue)
        return 0 if st is None else st.pending

    def read(self, pool: ShardedQueues) -> dict[int, R]:
        """Every task's record, by task index."""
        out: dict[int, R] = {}
        while got := pool.get(self.queue, TAKE_AT_ONCE):
            for m in got:
                fields = json.loads(m.payload)
                task = fields.pop("task")
                out[task] = self._kind(**fields)
        return out

    def drop(self, pool: ShardedQueues) -> None:
        """Drop the queue where the servers answer: what one out of reach keeps is a small queue."""
        left = drop_where_answering(pool, self.queue)
        if left:
            log.warning("the records queue %s may be left on %s (a small queue)", self.queue, ", ".join(left))


def where_answering(pool: ShardedQueues, call: Call[Any], what: str) -> list[str]:
    """`call` on each server that answers, all at once; returns the addresses of those where it was not done.

    Those are the servers out of reach, not waited on (a failed job may have lost one), and those
    where `call` failed (logged, saying `what` it was). At once: a drop waits on the server's fsyncs,
    which right after a job wrote its data took ~30 ms each.
    """
    up = pool.health.answering()
    left = [c.address for c in pool.clients if c not in up]
    for c, outcome in zip(up, pool.on_every_server(call, up), strict=True):
        if isinstance(outcome, Exception):
            log.info("could not %s on %s: %s", what, c.address, outcome)
            left.append(c.address)
    return left


def drop_where_answering(pool: ShardedQueues, queue: str) -> list[str]:
    """Drop `queue` on each server that answers; returns the addresses where it may be left."""
    return where_answering(pool, calls.drop(queue), f"drop the queue {queue}")
