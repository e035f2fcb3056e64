"""What a Spark entry point supplies to its queue job (`conveyor.spark.job`): a `JobForm`.

The job is the same for every entry point (the queue, the put, the consumers, the read-back, the
stats, the cleanup); the form is what differs: the task every message runs, how an Arrow batch of
input becomes the messages' arguments, and how one server's results become output rows.
`conveyor.spark.map`'s form is in `conveyor.spark.rows`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.spark.records import ReadCounts
from conveyor.tasks.options import TaskOptions

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from conveyor.client.sharded import ShardedQueues


@dataclass(frozen=True, slots=True)
class Parcel:
    """What one message of input carries: its task's arguments, and how many input rows they hold."""

    args: tuple[Any, ...]
    rows: int


MakeParcels = Callable[["pa.RecordBatch"], list[Parcel]]  # an Arrow batch of input -> its messages' parcels
# (the servers, the job's queue, a server's index) -> that server's output batches, then what it read
ReadShard = Callable[["ShardedQueues", str, int], Generator["pa.RecordBatch", None, ReadCounts]]


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
