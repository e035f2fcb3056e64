"""What runs inside Spark tasks: input readers and task-node channels, as `mapInArrow` functions.

Both are picklable objects called with the partition's iterator of Arrow batches. A reader yields
routed rows (`ROUTE_DDL`); a task node gets its input rows sorted by (channel, level, seq,
edge), runs one executor per channel, and yields routed rows, or Dataset rows when blocking.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..arrow_ipc import decode, encode, slices
from .channels import PartitionKey, channels_of, split_by_channel, to_pandas, to_table
from .errors import NodeTaskError, raise_in_task
from .executors import Executor
from .layout import BATCH_MAX_BYTES, DATASET_SCHEMA, FLUSH_BYTES, ROUTE_SCHEMA, SEQ_SHIFT
from .readers import CsvReader, ParquetReader

Row = tuple[int, int, int, int, Any]  # channel, level, seq, edge, batch (IPC bytes, or a Table when read in-task)


@dataclass(frozen=True)
class OutEdge:
    id: int
    key: PartitionKey
    n_channels: int
    level: int
    label: str


class RowWriter:
    """Collects output rows and hands them to Spark as RecordBatches of a bounded size."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.columns: list[list[Any]] = [[] for _ in schema]
        self.nbytes = 0

    def add(self, *values: Any) -> pa.RecordBatch | None:
        for column, value in zip(self.columns, values, strict=True):
            column.append(value)
        self.nbytes += len(values[-1])
        return self.flush() if self.nbytes >= FLUSH_BYTES else None

    def flush(self) -> pa.RecordBatch | None:
        if not self.columns[0]:
            return None
        arrays = [pa.array(c, f.type) for c, f in zip(self.columns, self.schema, strict=True)]
        self.columns = [[] for _ in self.schema]
        self.nbytes = 0
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def route(self, table: pa.Table, edges: Iterable[OutEdge], seq: Callable[[], int]) -> Iterator[pa.RecordBatch]:
        """Split `table` over the channels of each edge and add a row per piece."""
        if table.num_rows == 0:
            return
        for edge in edges:
            for channel, part in split_by_channel(
                table, channels_of(table, edge.key, edge.n_channels, edge.label), edge.n_channels
            ):
                for piece in slices(part, BATCH_MAX_BYTES):
                    out = self.add(edge.id, channel, edge.level, seq(), encode(piece))
                    if out is not None:
                        yield out


def counter(base: int) -> Callable[[], int]:
    """Sequence numbers base << SEQ_SHIFT, +1, +2, ..."""
    numbers = itertools.count(base << SEQ_SHIFT)
    return lambda: next(numbers)


def partition_id() -> int:
    """The Spark partition the running task computes (called inside Spark tasks only)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None, "not in a Spark task"
    return context.partitionId()


def _call(where: str, func: Callable[..., Any], *args: Any) -> Any:
    """Call user code; an exception becomes a task error naming the node."""
    try:
        return func(*args)
    except NodeTaskError:
        raise
    except Exception as exc:
        raise_in_task(f"{where} raised {type(exc).__name__}: {exc}")


@dataclass
class InputTask:
    """Reads an input node: file splits (`reader`), Spark-read rows, or a Dataset's rows."""

    name: str
    source: str  # "files" | "spark" | "dataset"
    reader: CsvReader | ParquetReader | None
    batch_func: Callable[[Any], Any] | None
    out_edges: list[OutEdge]
    level: int
    read_counter: Any = None  # a Spark accumulator of batches read, when the session has one

    def _prepare(self, table: pa.Table) -> pa.Table | None:
        if self.read_counter is not None:
            self.read_counter.add(1)
        if self.batch_func is None:
            return table
        out = _call(f"node {self.name!r}: batch_func", self.batch_func, to_pandas(table))
        return to_table(out, f"node {self.name!r}: batch_func")

    def tables(self, split: int) -> Iterator[pa.Table]:
        """The prepared batches of one file split."""
        assert self.reader is not None
        for table in self.reader.read(split):
            out = self._prepare(table)
            if out is not None and out.num_rows:
                yield out

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writer = RowWriter(ROUTE_SCHEMA)
        if self.source == "files":
            for rb in batches:
                for split in rb.column(0).to_pylist():
                    seq = counter(split)
                    for table in self.tables(split):
                        yield from writer.route(table, self.out_edges, seq)
        else:
            seq = counter(partition_id())
            for rb in batches:
                if self.source == "spark":
                    tables: Iterable[pa.Table] = [pa.Table.from_batches([rb])]
                else:
                    column = rb.column(rb.schema.get_field_index("batch"))
                    tables = (decode(column[i].as_buffer()) for i in range(rb.num_rows))
                for table in tables:
                    out = self._prepare(table)
                    if out is not None:
                        yield from writer.route(out, self.out_edges, seq)
        last = writer.flush()
        if last is not None:
            yield last

    def rows(self, edge: OutEdge) -> Iterator[Row]:
        """Every split read in order inside the consumer's task (a fused input), as unencoded rows."""
        assert self.reader is not None
        for split in range(len(self.reader)):
            seq = counter(split)
            for table in self.tables(split):
                channels_of(table, edge.key, 1, edge.label)  # checks the key column exists
                yield (0, edge.level, seq(), edge.id, table)


def _shuffled_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[Row]:
    """The routed rows Spark hands a task node, one by one (batches stay undecoded until used)."""
    for rb in batches:
        cols = [rb.column(rb.schema.get_field_index(n)) for n in ("channel", "level", "seq", "edge", "batch")]
        channel, level, seq, edge = (c.to_pylist() for c in cols[:4])
        blobs = cols[4]
        for i in range(rb.num_rows):
            yield (channel[i], level[i], seq[i], edge[i], blobs[i])


def _merge_fused(shuffled: Iterator[Row], fused: list[tuple[int, Iterator[Row]]]) -> Iterator[Row]:
    """Merge sorted shuffled rows with fused inputs, each started only when its level comes up.

    A dependent input is not even opened before what it depends on is consumed.
    """
    pending: list[Row] = []
    shuffled = iter(shuffled)

    def take_below(level: int, inclusive: bool) -> Iterator[Row]:
        while True:
            if not pending:
                nxt = next(shuffled, None)
                if nxt is None:
                    return
                pending.append(nxt)
            if pending[0][1] < level or (inclusive and pending[0][1] == level):
                yield pending.pop()
            else:
                return

    key = lambda row: row[:4]  # noqa: E731
    for level, group in itertools.groupby(sorted(fused, key=lambda f: f[0]), key=lambda f: f[0]):
        yield from take_below(level, inclusive=False)
        yield from heapq.merge(take_below(level, inclusive=True), *(rows for _, rows in group), key=key)
    yield from pending
    yield from shuffled


def _pandas(executor: Executor) -> bool:
    """Whether the executor takes and gives pandas DataFrames (`batch_format`, as Quokka's do)."""
    return getattr(executor, "batch_format", "arrow") == "pandas"


def make_executor(template: Any) -> Executor:
    """One executor for one channel: a copy of an instance, or a call of a class or factory."""
    return copy.deepcopy(template) if isinstance(template, Executor) else template()


@dataclass
class NodeTask:
    """Runs the channels of a task node held by one Spark partition."""

    name: str
    executor: Any
    n_channels: int
    blocking: bool
    streams: dict[int, Hashable]  # edge id -> stream id
    out_edges: list[OutEdge]
    has_shuffled_input: bool
    fused: list[tuple[InputTask, OutEdge]] = field(default_factory=list)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = partition_id()
        rows: Iterator[Row] = _shuffled_rows(batches) if self.has_shuffled_input else iter(())
        if self.fused:
            rows = _merge_fused(rows, [(edge.level, task.rows(edge)) for task, edge in self.fused])
        writer = RowWriter(DATASET_SCHEMA if self.blocking else ROUTE_SCHEMA)
        executors: dict[int, Executor] = {}
        seqs: dict[int, Callable[[], int]] = {}
        empty: dict[int, pa.Table] = {}  # channel -> an empty output, kept while the channel emitted no rows
        nonempty: set[int] = set()

        def emit(channel: int, value: Any, where: str) -> Iterator[pa.RecordBatch]:
            if isinstance(value, (list, tuple)):  # several batches at once (Quokka's executors return lists)
                for v in value:
                    yield from emit(channel, v, where)
                return
            table = to_table(value, where, keep_index=_pandas(executors[channel]))
            if table is None:
                return
            if channel not in seqs:
                seqs[channel] = counter(channel)
            if not self.blocking:
                yield from writer.route(table, self.out_edges, seqs[channel])
                return
            if table.num_rows == 0:
                empty.setdefault(channel, table)
                return
            nonempty.add(channel)
            for piece in slices(table, BATCH_MAX_BYTES):
                out = writer.add(channel, seqs[channel](), encode(piece))
                if out is not None:
                    yield out

        def executor_for(channel: int) -> Executor:
            if channel not in executors:
                executors[channel] = _call(f"node {self.name!r}: making the executor", make_executor, self.executor)
            return executors[channel]

        for channel, _level, _seq, edge, payload in rows:
            ex = executor_for(channel)
            if ex.finished:
                if self.n_channels == 1:
                    break  # nothing else can come for another channel: stop reading
                continue
            table = payload if isinstance(payload, pa.Table) else decode(payload.as_buffer())
            stream = self.streams[edge]
            where = f"node {self.name!r}: {type(ex).__name__}.execute (channel {channel}, stream {stream!r})"
            batch = to_pandas(table) if _pandas(ex) else table
            yield from emit(channel, _call(where, ex.execute, batch, stream, channel), where)
            if ex.finished and self.n_channels == 1:
                break  # stop now, before pulling (maybe reading) another batch
        channels = set(executors)
        if partition < self.n_channels:
            channels.add(partition)  # channel c is partition c: it gets its done() even without input
        for channel in sorted(channels):
            ex = executor_for(channel)
            where = f"node {self.name!r}: {type(ex).__name__}.done (channel {channel})"
            yield from emit(channel, _call(where, ex.done, channel), where)
            if self.blocking and channel in empty and channel not in nonempty:
                # an output with no rows still tells the Dataset its columns
                out = writer.add(channel, seqs[channel](), encode(empty[channel]))
                if out is not None:
                    yield out
        last = writer.flush()
        if last is not None:
            yield last
