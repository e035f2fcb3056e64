"""What a Spark entry point supplies to its queue job (`conveyor.spark.job`): a `JobForm`.

The job is the same for every entry point (the queue, the put, the consumers, the read-back, the
stats, the cleanup); the form is what differs: the task every message runs, how an Arrow batch of
input becomes the messages' arguments, and how one server's outcomes (`ServerOutcomes`, walked by
the job) become output rows, any number per message. `conveyor.spark.map`'s form is in
`conveyor.spark.rows`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from conveyor.client.sharded import ShardedQueues
from conveyor.message import DeadLetter
from conveyor.spark.records import ReadCounts
from conveyor.tasks.options import TaskOptions

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from conveyor.client.queue_client import QueueClient

READ_PAGE = 10_000  # results, or dead letters, fetched from a server per request


@dataclass(frozen=True, slots=True)
class Parcel:
    """What one message of input carries: its task's arguments, and how many input rows they hold."""

    args: tuple[Any, ...]
    rows: int


class Result(NamedTuple):
    """One message's result as a server holds it."""

    id: int  # the message's id across the pool
    data: bytes  # the task's encoded result (`decode_result`)


@dataclass(frozen=True)
class ServerOutcomes:
    """What one server holds of a job's queue once its consumers have ended: its messages' results and dead letters.

    The job's read-back task of server `shard` hands it to the form's `read`: walking the server
    (its pages, the ids across the pool) is the job's, what a result means is the form's. Each walk
    starts afresh, so a form may take either more than once.
    """

    client: QueueClient
    queue: str
    shard: int

    def results(self) -> Iterator[Result]:
        """Each message's result, in id order."""
        for i, r in self.client.iter_results(self.queue, page=READ_PAGE):
            yield Result(ShardedQueues.global_id(self.shard, i), r)

    def dead_letters(self) -> Iterator[DeadLetter]:
        """Each dead letter, in id order, its message's id the one across the pool."""
        for d in self.client.iter_dead_letters(self.queue, page=READ_PAGE):
            pool_id = ShardedQueues.global_id(self.shard, d.message.id)
            yield dataclasses.replace(d, message=dataclasses.replace(d.message, id=pool_id))


MakeParcels = Callable[["pa.RecordBatch"], list[Parcel]]  # an Arrow batch of input -> its messages' parcels
# one server's outcomes -> its output batches, then what it read (the inputs they stood for, each message once)
ReadShard = Callable[[ServerOutcomes], Generator["pa.RecordBatch", None, ReadCounts]]


@dataclass(frozen=True, slots=True)
class JobTask:
    """The task every message of a job runs."""

    run: Callable[..., Any]  # called with a parcel's args; stored once on the servers (cloudpickled)
    options: TaskOptions  # each message's: the job's queue, its time limit and retries


@dataclass(frozen=True)
class JobForm:
    """What an entry point supplies to its `QueueJob`: how its input becomes messages and its results rows.

    `parcels` and `read` travel in every Spark task of the job (cloudpickled): they hold no more
    than they need. The function that runs belongs in `task`, stored once on the servers.
    """

    task: JobTask
    parcels: MakeParcels
    read: ReadShard
    output: StructType  # the columns of the batches `read` yields, and of the output
    message_rows: int  # the most input rows `parcels` puts in one message (a resumable job cuts its input in whole messages)
