"""Batches and channels: normalising executor outputs, and routing rows to channels (Arrow IPC: `conveyor.arrow_ipc`).

Routing rule (a partition key per edge):
- `None`: the batch goes whole to every channel of the consumer (broadcast).
- a column of an integer type: row -> `key % n_channels` (Python's modulo: never negative).
- a column of any other type: row -> `stable_hash(key) % n_channels`, where `stable_hash` is
  `pandas.util.hash_array` (SipHash-2-4 with pandas' fixed default key, over the UTF-8 bytes of
  strings, the bytes of other values), the same in every process, run and machine.
- a callable `(batch, n_channels) -> channel per row` (anything numpy can turn into integers).
Rows whose key is null go to channel 0.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..arrow_ipc import decode, encode
from .errors import raise_in_task
from .layout import IPC_COMPRESSION

Batch = pa.Table | pa.RecordBatch | pd.DataFrame


@dataclass(frozen=True)
class Router:
    """A partition key for batches of any type: `func(value, source_channel, n_channels)` says where each part goes.

    It yields (or returns) `(channel, part)` pairs; a channel may get several parts, or none.
    `source_channel` is the producer's channel: for a file or `SourceReader` input, the channel that
    read the batch; for an input Spark reads (or a Dataset's), the Spark partition reading it.
    """

    func: Callable[[Any, int, int], Iterable[tuple[int, Any]]]
    # it takes a Parquet input's string columns as read, Arrow dictionaries (named in the table's
    # schema metadata, `DICTIONARIES_KEY`), and decodes them itself, as late as it can
    dictionaries: bool = False

    def __call__(self, value: Any, source_channel: int, n_channels: int) -> Iterable[tuple[int, Any]]:
        return self.func(value, source_channel, n_channels)


PartitionKey = None | str | Router | Callable[[pa.Table, int], Any]

# the first byte of a pickle (protocol 2 and later); an Arrow IPC stream starts with 0xFF
_PICKLE_OPCODE = 0x80


def encode_value(value: Any) -> bytes:
    """A batch as bytes: a pyarrow Table as an Arrow IPC stream, anything else pickled."""
    if isinstance(value, pa.Table):
        return encode(value, IPC_COMPRESSION)
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def decode_value(data: pa.Buffer | bytes) -> Any:
    """The batch `encode_value` made."""
    first = bytes(memoryview(data)[:1])[0] if len(data) else 0
    if first == _PICKLE_OPCODE:
        return pickle.loads(data)
    return decode(data)


def to_table(value: object, where: str, keep_index: bool = False) -> pa.Table | None:
    """An executor's or batch function's return value as a pyarrow Table (None stays None).

    With `keep_index` (a pandas executor's output), a DataFrame's named index levels (a groupby's
    keys) become columns, but for a RangeIndex and a name that is already a column.
    """
    if value is None:
        return None
    if isinstance(value, pa.Table):
        return value
    if isinstance(value, pa.RecordBatch):
        return pa.Table.from_batches([value])
    if isinstance(value, pd.DataFrame):
        if keep_index and not isinstance(value.index, pd.RangeIndex):
            # a named index holds data (a groupby's keys); an unnamed one only positions
            named = [n for n in value.index.names if n is not None and n not in value.columns]
            if len(set(named)) != len(named):
                raise_in_task(f"{where} returned a DataFrame whose index repeats a level name: {list(value.index.names)}")
            if named:
                value = value.reset_index(level=named)
        # pandas' Arrow-backed strings come back as large_string: make them plain strings like the
        # readers', and drop the pandas metadata (it would travel with every batch)
        table = pa.Table.from_pandas(value, preserve_index=False).replace_schema_metadata(None)
        if any(pa.types.is_large_string(f.type) for f in table.schema):
            plain = [f.with_type(pa.string()) if pa.types.is_large_string(f.type) else f for f in table.schema]
            table = table.cast(pa.schema(plain))
        return table
    raise_in_task(
        f"{where} returned a {type(value).__name__}; expected a pyarrow Table or RecordBatch, a pandas DataFrame, or None"
    )


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """A table as the pandas DataFrame a batch function gets.

    Strings stay Arrow-backed (`string[pyarrow]`, no Python object per value: ~5x faster than
    object columns) and dates become `datetime64`, so comparisons with `pd.Timestamp` work.
    """
    mapper = {pa.string(): pd.StringDtype("pyarrow"), pa.large_string(): pd.StringDtype("pyarrow")}
    return table.to_pandas(date_as_object=False, types_mapper=mapper.get)


def stable_hash(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A uint64 hash per value that is the same in every process (see the module docstring).

    Only the distinct values are hashed (dictionary encoding first), so low-cardinality keys cost
    little. Nulls hash to 0.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = pc.dictionary_encode(values)
    uniques = encoded.dictionary.to_numpy(zero_copy_only=False)
    hashes = pd.util.hash_array(np.asarray(uniques, dtype=object)) if len(uniques) else np.zeros(0, np.uint64)
    indices = encoded.indices.fill_null(-1).to_numpy()
    out = np.zeros(len(indices), dtype=np.uint64)
    valid = indices >= 0
    out[valid] = hashes[indices[valid]]
    return out


def channels_of(table: pa.Table, key: PartitionKey, n_channels: int, where: str) -> np.ndarray | None:
    """The channel of each row of `table` under `key`, or None for a broadcast."""
    if key is None:
        return None
    if isinstance(key, Router):
        raise_in_task(f"{where}: a Router routes whole batches; it gives no channel per row")
    if callable(key):
        try:
            result = np.asarray(key(table, n_channels))
        except Exception as exc:  # a user function: say which edge it belongs to
            raise_in_task(f"{where}: the partition function raised {type(exc).__name__}: {exc}")
        if result.shape != (table.num_rows,) or not np.issubdtype(result.dtype, np.integer):
            raise_in_task(
                f"{where}: the partition function must return one integer channel per row "
                f"({table.num_rows} rows), got shape {result.shape} of {result.dtype}"
            )
        if len(result) and (result.min() < 0 or result.max() >= n_channels):
            raise_in_task(f"{where}: the partition function returned a channel outside 0..{n_channels - 1}")
        return result.astype(np.int64, copy=False)
    if key not in table.column_names:
        raise_in_task(f"{where}: partition key column {key!r} is missing from the batch (columns: {table.column_names})")
    column = table.column(key)
    if pa.types.is_integer(column.type):
        keys: np.ndarray = column.fill_null(0).to_numpy() if column.null_count else column.to_numpy()
        return np.mod(keys.astype(np.int64, copy=False), n_channels)
    hashes: np.ndarray = stable_hash(column) % np.uint64(n_channels)
    return hashes.astype(np.int64)


def split_by_channel(table: pa.Table, channels: np.ndarray | None, n_channels: int) -> Iterator[tuple[int, pa.Table]]:
    """(channel, rows of that channel) for every channel that gets rows; a broadcast goes to all."""
    if channels is None:
        for channel in range(n_channels):
            yield channel, table
        return
    if n_channels == 1:
        if table.num_rows:
            yield 0, table
        return
    # numpy sorts integers of 16 bits or fewer by radix (stable, linear): 3x faster than int64's merge sort
    small = channels.astype(np.uint16, copy=False) if n_channels <= 1 << 16 else channels
    order = np.argsort(small, kind="stable")
    counts = np.bincount(channels, minlength=n_channels)
    ordered = table.take(pa.array(order))
    start = 0
    for channel, count in enumerate(counts.tolist()):
        if count:
            yield channel, ordered.slice(start, count)
            start += count
