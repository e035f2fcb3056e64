"""A resumable job's input: cut into chunks at fixed offsets, each named by a key that says what it holds.

A resumable job (`map(..., job="name")`) must know, in a run after its driver died, which of its
input the servers already hold, without sending the input again: its input is put first, by the
input's own partitions, cut into chunks of `rows` rows at fixed offsets of each partition
(`fixed_chunks`). A chunk's key names the job, its partition, its offset and a digest of its rows;
its messages' keys are the chunk's and their place in it. Once every message of a chunk is stored,
the put stores a marker under the chunk's key in the job's marker queue (`<entry>-chunks-<name>`),
delayed for ever so that nothing consumes it.

The digest is Spark's: each row's `xxhash64` of its columns and its position (`monotonically_increasing_id`,
its partition and offset), computed in the JVM as a column of the input (`hashed_input`), and a
chunk's digest the XOR of its rows'. The put reads it off the rows it puts; a later run computes
the chunks' keys in the JVM alone (`input_chunks`: no row goes through Python) and asks the servers
which markers they hold (`stored`): all of them, and nothing to put; markers of chunks this input
does not have, and the input changed (`JobInputChangedError`, before anything is put).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conveyor.constants import H_IDEMPOTENCY_KEY, MAX_DELAY_S
from conveyor.message import Message

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

ROW_HASH = "__conveyor_row_hash"  # the column of each row's hash the put reads and drops
CHUNK_ROWS = 8192  # a chunk holds about this many rows (a whole number of messages)
ROW_BITS = 33  # monotonically_increasing_id(): the partition above these bits, the row's offset in them
_U64 = (1 << 64) - 1


def chunk_rows_for(message_rows: int) -> int:
    """A resumable job's chunk: about CHUNK_ROWS rows, a whole number of messages of `message_rows` rows."""
    return message_rows * max(1, round(CHUNK_ROWS / message_rows))


@dataclass(frozen=True)
class Chunk:
    """One chunk of a resumable job's input, as the JVM sees it: where it is, its rows, its key."""

    key: str
    rows: int


@dataclass(frozen=True)
class ChunkedInput:
    """How a resumable job's put cuts its input into chunks and names them (it travels in the put's tasks).

    `skip_landed`: a run after another asks the servers, chunk by chunk, whether the chunk's
    marker is stored, and puts only the chunks whose marker is not.
    """

    job: str
    rows: int  # per chunk
    schema_tag: str  # a digest of the input's columns and types: other columns, other keys
    markers: str  # the queue of the markers of chunks put whole
    skip_landed: bool = False

    def key(self, partition: int, offset: int, digest: int) -> str:
        return f"{self.job}:{partition}:{offset}:{self.schema_tag}{digest & _U64:016x}"

    def chunks(self, batches: Iterator[pa.RecordBatch], partition: int) -> Iterator[tuple[str, pa.RecordBatch]]:
        """(key, rows without the hash column) of each chunk of a partition's input (`hashed_input`'s)."""
        import numpy as np

        offset = 0
        for chunk in fixed_chunks(batches, self.rows):
            at = chunk.schema.get_field_index(ROW_HASH)
            digest = int(np.bitwise_xor.reduce(chunk.column(at).to_numpy()))
            yield self.key(partition, offset, digest), chunk.remove_column(at)
            offset += chunk.num_rows

    def marker(self, key: str) -> Message:
        """The marker of a chunk put whole: stored under its key, never due."""
        return Message(payload=b"", not_before=MAX_DELAY_S, headers={H_IDEMPOTENCY_KEY: key})

    def landed_too(self) -> ChunkedInput:
        """The same, for a run that puts only the chunks whose marker is not stored."""
        return dataclasses.replace(self, skip_landed=True)


def chunked_input(df: DataFrame, job: str, message_rows: int, markers: str) -> ChunkedInput:
    """How a resumable job over `df` cuts and names its input."""
    tag = hashlib.blake2b(df.schema.json().encode(), digest_size=4).hexdigest()
    return ChunkedInput(job, chunk_rows_for(message_rows), tag, markers)


def hashed_input(df: DataFrame) -> DataFrame:
    """`df` with the column ROW_HASH: each row's hash of its columns and its position in its partition."""
    from pyspark.sql import functions as F

    columns = [_hashable(df[i], f.dataType) for i, f in enumerate(df.schema.fields)]
    return df.select("*", F.xxhash64(*columns, F.monotonically_increasing_id()).alias(ROW_HASH))


def input_chunks(hashed: DataFrame, chunked: ChunkedInput) -> list[Chunk]:
    """The chunks of `hashed_input(df)`, their keys as the put makes them, computed in the JVM alone."""
    from pyspark.sql import functions as F

    row = F.monotonically_increasing_id()
    counted = hashed.select(
        F.shiftright(row, ROW_BITS).alias("partition"),
        F.floor(row.bitwiseAND(F.lit((1 << ROW_BITS) - 1)) / chunked.rows).alias("chunk"),
        ROW_HASH,
    )
    per_chunk = counted.groupBy("partition", "chunk").agg(F.count(F.lit(1)).alias("rows"), F.bit_xor(ROW_HASH).alias("digest"))
    return [Chunk(chunked.key(r["partition"], r["chunk"] * chunked.rows, r["digest"]), r["rows"]) for r in per_chunk.collect()]


def fixed_chunks(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """The rows of `batches` again, in batches of `rows` rows (the last one fewer), each a copy of its own."""
    import pyarrow as pa

    pieces: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        while batch.num_rows:
            take = min(rows - held, batch.num_rows)
            pieces.append(batch.slice(0, take))
            held += take
            batch = batch.slice(take)
            if held == rows:
                yield pa.concat_batches(pieces)
                pieces, held = [], 0
    if held:
        yield pa.concat_batches(pieces)


def _hashable(column: Column, kind: DataType) -> Column:
    """A column Spark's hash takes: a map (which it refuses), anywhere inside, hashed as its JSON."""
    from pyspark.sql import functions as F

    return F.to_json(F.struct(column)) if _holds_map(kind) else column


def _holds_map(kind: DataType) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(kind, MapType):
        return True
    if isinstance(kind, ArrayType):
        return _holds_map(kind.elementType)
    if isinstance(kind, StructType):
        return any(_holds_map(f.dataType) for f in kind.fields)
    return False
