"""Arrow tables as IPC stream bytes, and tables cut to a byte bound: how batches travel, for graph and spark alike.

Nothing of conveyor is imported here, and pyarrow only when a function runs, so that any layer may
use it and importing it costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import pyarrow as pa


def encode(data: pa.Table | pa.RecordBatch, compression: str | None = None) -> bytes:
    """Rows as one Arrow IPC stream, its buffers compressed with `compression` ("lz4" or "zstd") if given.

    `decode` reads either: an IPC stream says how its buffers are compressed.
    """
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write(data)
    return cast(bytes, sink.getvalue().to_pybytes())


def decode(data: pa.Buffer | bytes) -> pa.Table:
    """The rows an `encode`d stream holds."""
    import pyarrow as pa

    return pa.ipc.open_stream(data).read_all()


def slices(table: pa.Table, max_bytes: int) -> Iterator[pa.Table]:
    """The table cut into runs of consecutive rows of at most `max_bytes` each, or of one row (one run when small).

    Cut in runs of equal rows first, then any run still over (its rows larger than the others) in
    halves, down to one row: a single row over `max_bytes` comes alone, for the caller to judge.
    """
    size = table.nbytes
    if size <= max_bytes or table.num_rows <= 1:
        yield table
        return
    step = -(-table.num_rows // -(-size // max_bytes))
    for start in range(0, table.num_rows, step):
        yield from _halved(table.slice(start, step), max_bytes)


def _halved(table: pa.Table, max_bytes: int) -> Iterator[pa.Table]:
    if table.nbytes <= max_bytes or table.num_rows <= 1:
        yield table
        return
    half = table.num_rows // 2
    yield from _halved(table.slice(0, half), max_bytes)
    yield from _halved(table.slice(half), max_bytes)
