"""What runs inside Spark tasks: input readers and task-node channels, as `mapInArrow` functions.

Both are picklable objects called with the partition's iterator of Arrow batches. A reader yields
routed rows (`ROUTE_DDL`); a task node gets its input rows sorted by (channel, level, seq,
edge), runs one executor per channel, and yields routed rows, or Dataset rows when blocking.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import types
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..arrow_ipc import encode, slices
from .channels import PartitionKey, Router, channels_of, decode_value, encode_value, split_by_channel, to_pandas, to_table
from .errors import NodeTaskError, raise_in_task
from .executors import Executor
from .layout import BATCH_MAX_BYTES, DATASET_SCHEMA, FLUSH_BYTES, IPC_COMPRESSION, ROUTE_SCHEMA, SEQ_SHIFT
from .readers import CsvReader, ParquetReader, SourceReader

Row = tuple[int, int, int, int, Any]  # channel, level, seq, edge, batch (encoded bytes, or Decoded when read in-task)


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

    def route(self, value: Any, edges: Iterable[OutEdge], seq: Callable[[], int], source: int) -> Iterator[pa.RecordBatch]:
        """Split a batch over the channels of each edge and add a row per piece.

        A pyarrow Table goes by its edge's key (an empty one nowhere); any other value by a
        `Router` or whole to every channel (key None). `source` is the producer's channel.
        """
        for edge in edges:
            for channel, piece in _pieces(value, edge, source):
                out = self.add(edge.id, channel, edge.level, seq(), piece)
                if out is not None:
                    yield out


def _routed(value: Any, edge: OutEdge, source: int) -> Iterator[tuple[int, Any]]:
    """(channel, part) pairs of a batch on an edge routed by a Router, checked."""
    assert isinstance(edge.key, Router)
    try:
        parts = list(edge.key(value, source, edge.n_channels))
    except NodeTaskError:
        raise
    except Exception as exc:  # a user function: say which edge it belongs to
        raise_in_task(f"{edge.label}: the partition function raised {type(exc).__name__}: {exc}")
    for channel, part in parts:
        if not isinstance(channel, int) or not 0 <= channel < edge.n_channels:
            raise_in_task(
                f"{edge.label}: the partition function sent a part to channel {channel!r}, outside 0..{edge.n_channels - 1}"
            )
        if part is not None:
            yield channel, part


def _pieces(value: Any, edge: OutEdge, source: int) -> Iterator[tuple[int, bytes]]:
    """(channel, encoded piece) of one batch on one edge."""
    if isinstance(edge.key, Router):
        for channel, part in _routed(value, edge, source):
            yield from _encoded(channel, part)
        return
    if not isinstance(value, pa.Table):
        if edge.key is not None:
            raise_in_task(
                f"{edge.label}: a {type(value).__name__} is routed by a Router or whole (key None); "
                "a column or a function of a table routes pyarrow Tables"
            )
        encoded = encode_value(value)
        for channel in range(edge.n_channels):
            yield channel, encoded
        return
    if value.num_rows == 0:
        return
    channels = channels_of(value, edge.key, edge.n_channels, edge.label)
    if channels is None:  # a broadcast: the same pieces for every channel, encoded once
        pieces = [piece for _, piece in _encoded(0, value)]
        for channel in range(edge.n_channels):
            for piece in pieces:
                yield channel, piece
        return
    for channel, part in split_by_channel(value, channels, edge.n_channels):
        yield from _encoded(channel, part)


def _encoded(channel: int, value: Any) -> Iterator[tuple[int, bytes]]:
    """A piece as rows of at most BATCH_MAX_BYTES (a table is sliced; another value goes whole)."""
    if isinstance(value, pa.Table):
        for piece in slices(value, BATCH_MAX_BYTES):
            yield channel, encode(piece, IPC_COMPRESSION)
    else:
        yield channel, encode_value(value)


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
    """Reads an input node: file splits (`reader`), Spark-read rows, a Dataset's rows, or a `SourceReader`.

    `batch_format` says what `batch_func` gets: "pandas" (a DataFrame; it returns a table-like
    batch or None) or "object" (the batch as read, a pyarrow Table for files; it returns anything).
    """

    name: str
    source: str  # "files" | "spark" | "dataset" | "reader"
    reader: CsvReader | ParquetReader | SourceReader | None
    batch_func: Callable[[Any], Any] | None
    out_edges: list[OutEdge]
    level: int
    read_counter: Any = None  # a Spark accumulator of batches read, when the session has one
    batch_format: str = "pandas"
    n_channels: int = 1

    def _prepare(self, batch: Any) -> Any:
        if self.read_counter is not None:
            self.read_counter.add(1)
        if self.batch_func is None:
            return batch
        where = f"node {self.name!r}: batch_func"
        if self.batch_format == "object":
            return _call(where, self.batch_func, batch)
        return to_table(_call(where, self.batch_func, to_pandas(batch)), where)

    def tables(self, splits: Iterable[int]) -> Iterator[tuple[Callable[[], int], Any]]:
        """(sequence numbers, prepared batch) of a run of file splits one channel reads (empty tables dropped).

        A batch may hold rows of several splits (Parquet row groups are merged); it is numbered in
        the sequence of the first.
        """
        assert isinstance(self.reader, CsvReader | ParquetReader)
        seqs: dict[int, Callable[[], int]] = {}
        for split, table in self.reader.read_run(splits):
            out = self._prepare(table)
            if out is not None and not (isinstance(out, pa.Table) and out.num_rows == 0):
                yield seqs.setdefault(split, counter(split)), out

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writer = RowWriter(ROUTE_SCHEMA)
        if self.source == "files":
            splits = [split for rb in batches for split in rb.column(0).to_pylist()]
            # the channel that reads these splits: a Spark partition id counts the tasks of every input read in the stage
            for source, run in itertools.groupby(splits, key=self.reading_channel):
                for seq, out in self.tables(run):
                    yield from writer.route(out, self.out_edges, seq, source)
        elif self.source == "reader":
            for rb in batches:
                for channel in rb.column(0).to_pylist():
                    seq = counter(channel)
                    for out in (self._prepare(b) for b in self._read(channel)):
                        if out is not None:
                            yield from writer.route(out, self.out_edges, seq, channel)
        else:
            partition = partition_id()
            seq = counter(partition)
            for rb in batches:
                if self.source == "spark":
                    values: Iterable[Any] = [pa.Table.from_batches([rb])]
                else:
                    column = rb.column(rb.schema.get_field_index("batch"))
                    values = (decode_value(column[i].as_buffer()) for i in range(rb.num_rows))
                for value in values:
                    out = self._prepare(value)
                    if out is not None:
                        yield from writer.route(out, self.out_edges, seq, partition)
        last = writer.flush()
        if last is not None:
            yield last

    def reading_channel(self, split: int) -> int:
        """The channel of the input that reads file split `split`.

        The runtime reads n splits with `spark.range(n)` over min(channels, n) partitions, which
        Spark cuts into contiguous runs: partition i starts at split i * n // readers.
        """
        assert isinstance(self.reader, CsvReader | ParquetReader)
        n = len(self.reader)
        readers = max(1, min(self.n_channels, n))
        return max(i for i in range(readers) if i * n // readers <= split)

    def _read(self, channel: int) -> Iterator[Any]:
        """What a `SourceReader` gives for one channel (a fresh copy of it per channel, as each had its own)."""
        assert self.reader is not None and not isinstance(self.reader, CsvReader | ParquetReader)
        reader = copy.deepcopy(self.reader)
        where = f"node {self.name!r}: {type(reader).__name__}.read (channel {channel})"
        items = iter(_call(where, reader.read, channel, self.n_channels))
        while True:
            try:
                item = next(items)
            except StopIteration:
                return
            except Exception as exc:
                raise_in_task(f"{where} raised {type(exc).__name__}: {exc}")
            yield item

    def rows(self, edge: OutEdge) -> Iterator[Row]:
        """Every split read in order inside the consumer's task (a fused input), as unencoded rows."""
        assert isinstance(self.reader, CsvReader | ParquetReader)
        for source, run in itertools.groupby(range(len(self.reader)), key=self.reading_channel):
            for seq, value in self.tables(run):
                for part in _in_task(value, edge, source):
                    yield (0, edge.level, seq(), edge.id, Decoded(part))


@dataclass(frozen=True)
class Decoded:
    """A batch that never left the task (a fused input's), where other rows hold encoded bytes."""

    value: Any


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


def _format(executor: Executor) -> str:
    """What the executor takes and gives (`batch_format`): "arrow", "pandas" (as Quokka's do) or "object"."""
    return str(getattr(executor, "batch_format", "arrow"))


def make_executor(template: Any) -> Executor:
    """One executor for one channel: a copy of an instance, or a call of a class or factory."""
    return copy.deepcopy(template) if isinstance(template, Executor) else template()


@dataclass
class Chained:
    """A one-channel task node run inside its one-channel consumer's task: its outputs go straight to the consumer."""

    name: str
    executor: Any
    streams: dict[int, Hashable]  # edge id -> stream id, of the edges it reads
    edge: OutEdge  # the edge to its consumer (its level is this node's)


def _outputs(executor: Executor, value: Any, where: str) -> Iterator[Any]:
    """The batches an executor's return value holds, as they travel (tables, unless its format is "object")."""
    fmt = _format(executor)
    if fmt == "object":
        # any value is one batch, but a generator (Quokka's done() may be one) gives several
        values: Iterable[Any] = value if isinstance(value, types.GeneratorType) else [value]
    elif isinstance(value, (list, tuple)):  # several batches at once (Quokka's executors return lists)
        values = value
    else:
        values = [value]
    for v in values:
        out = v if fmt == "object" else to_table(v, where, keep_index=fmt == "pandas")
        if out is not None:
            yield out


def _in_task(value: Any, edge: OutEdge, source: int) -> Iterator[Any]:
    """What an edge to a one-channel consumer in the same task carries of a batch: what routing would send it."""
    if isinstance(edge.key, Router):
        for _, part in _routed(value, edge, source):
            yield part
        return
    if isinstance(value, pa.Table):
        if value.num_rows == 0:
            return
        channels_of(value, edge.key, 1, edge.label)  # checks the key column exists
    elif edge.key is not None:
        raise_in_task(
            f"{edge.label}: a {type(value).__name__} is routed by a Router or whole (key None); "
            "a column or a function of a table routes pyarrow Tables"
        )
    yield value


@dataclass
class NodeTask:
    """Runs the channels of a task node held by one Spark partition (and the nodes chained into it)."""

    name: str
    executor: Any
    n_channels: int
    blocking: bool
    streams: dict[int, Hashable]  # edge id -> stream id
    out_edges: list[OutEdge]
    has_shuffled_input: bool
    fused: list[tuple[InputTask, OutEdge]] = field(default_factory=list)
    chained: list[Chained] = field(default_factory=list)  # producers before their consumers

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = partition_id()
        if not self.has_shuffled_input:
            # the one placeholder row Spark hands a task whose inputs are all read in it: read to the end,
            # or Spark cannot reuse this Python worker and starts a new one (~0.5 s) for the next stage
            for _ in batches:
                pass
        rows: Iterator[Row] = _shuffled_rows(batches) if self.has_shuffled_input else iter(())
        if self.fused:
            rows = _merge_fused(rows, [(edge.level, task.rows(edge)) for task, edge in self.fused])
        writer = RowWriter(DATASET_SCHEMA if self.blocking else ROUTE_SCHEMA)
        executors: dict[int, Executor] = {}
        seqs: dict[int, Callable[[], int]] = {}
        empty: dict[int, pa.Table] = {}  # channel -> an empty output, kept while the channel emitted no rows
        nonempty: set[int] = set()
        reader_of = {edge: node for node in self.chained for edge in node.streams}
        inner: dict[str, Executor] = {}  # a chained node's executor, by name
        # the chained nodes whose done() is to come, by level (a producer's is at most its consumer's)
        pending = sorted(self.chained, key=lambda node: node.edge.level)

        def emit(channel: int, value: Any, where: str) -> Iterator[pa.RecordBatch]:
            for v in _outputs(executors[channel], value, where):
                yield from emit_one(channel, v)

        def emit_one(channel: int, value: Any) -> Iterator[pa.RecordBatch]:
            if channel not in seqs:
                seqs[channel] = counter(channel)
            if not self.blocking:
                yield from writer.route(value, self.out_edges, seqs[channel], channel)
                return
            if isinstance(value, pa.Table) and value.num_rows == 0:
                empty.setdefault(channel, value)
                return
            nonempty.add(channel)
            for _, piece in _encoded(channel, value):
                out = writer.add(channel, seqs[channel](), piece)
                if out is not None:
                    yield out

        def executor_for(channel: int) -> Executor:
            if channel not in executors:
                executors[channel] = _call(f"node {self.name!r}: making the executor", make_executor, self.executor)
            return executors[channel]

        def execute(ex: Executor, name: str, channel: int, stream: Hashable, payload: Any) -> tuple[Any, str]:
            value = payload.value if isinstance(payload, Decoded) else decode_value(payload.as_buffer())
            where = f"node {name!r}: {type(ex).__name__}.execute (channel {channel}, stream {stream!r})"
            batch = to_pandas(value) if _format(ex) == "pandas" and isinstance(value, pa.Table) else value
            return _call(where, ex.execute, batch, stream, channel), where

        def inner_executor(node: Chained) -> Executor:
            if node.name not in inner:
                inner[node.name] = _call(f"node {node.name!r}: making the executor", make_executor, node.executor)
            return inner[node.name]

        def deliver(edge: int, payload: Any, channel: int = 0) -> Iterator[pa.RecordBatch]:
            node = reader_of.get(edge)
            if node is None:  # an edge of this node's own
                ex = executor_for(channel)
                if not ex.finished:
                    out, where = execute(ex, self.name, channel, self.streams[edge], payload)
                    yield from emit(channel, out, where)
                return
            ex = inner_executor(node)
            if not ex.finished:
                out, where = execute(ex, node.name, 0, node.streams[edge], payload)
                yield from passed_on(node, ex, out, where)

        def passed_on(node: Chained, ex: Executor, out: Any, where: str) -> Iterator[pa.RecordBatch]:
            for value in _outputs(ex, out, where):
                for part in _in_task(value, node.edge, 0):
                    yield from deliver(node.edge.id, Decoded(part))

        def finish_chained(below: int | None) -> Iterator[pa.RecordBatch]:
            """done() of the chained nodes whose outputs' level is below `below` (None: all of them)."""
            while pending and (below is None or pending[0].edge.level < below):
                node = pending.pop(0)
                ex = inner_executor(node)
                where = f"node {node.name!r}: {type(ex).__name__}.done (channel 0)"
                yield from passed_on(node, ex, _call(where, ex.done, 0), where)

        for channel, level, _seq, edge, payload in rows:
            if pending:  # what a chained node emits at its end comes before anything of a higher level
                yield from finish_chained(level)
            if executor_for(channel).finished:
                if self.n_channels == 1:
                    break  # nothing else can come for another channel: stop reading
                continue
            yield from deliver(edge, payload, channel)
            if self.n_channels == 1 and executor_for(channel).finished:
                # stop now, before pulling (maybe reading) another batch; a chained node's input stops
                # too, as a fused input's does: what it would emit has nowhere to go
                break
        yield from finish_chained(None)
        channels = set(executors)
        if partition < self.n_channels:
            channels.add(partition)  # channel c is partition c: it gets its done() even without input
        for channel in sorted(channels):
            ex = executor_for(channel)
            where = f"node {self.name!r}: {type(ex).__name__}.done (channel {channel})"
            yield from emit(channel, _call(where, ex.done, channel), where)
            if self.blocking and channel in empty and channel not in nonempty:
                # an output with no rows still tells the Dataset its columns
                out = writer.add(channel, seqs[channel](), encode(empty[channel], IPC_COMPRESSION))
                if out is not None:
                    yield out
        last = writer.flush()
        if last is not None:
            yield last
