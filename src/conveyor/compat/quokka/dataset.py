"""Quokka's input datasets (its `dataset` module of 2022), for `TaskGraph.new_input_reader_node`.

Each names files that Conveyor's readers read inside Spark tasks: CSV split at byte offsets
(`stride` bytes per split), Parquet by row groups. As in Quokka, a reader's `batch_func` gets each
batch read as a pyarrow Table; a Table that goes on unchanged travels as a polars DataFrame.
`bucket` is a local directory, an `s3://` URL or an S3 bucket name (see docs/graph.md).

Any other object with Quokka's reader methods (`get_next_batch(channel, pos=None)` yielding
`(position, batch)`, and `set_num_channels(n)` or `set_num_mappers(n)`) is a reader too: each
channel runs a copy of it in a Spark task of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ...graph import GraphError, Node, TaskGraph
from ...graph.filesystems import bucket_path

MiB = 1024 * 1024
BatchFunc = Callable[[Any], Any]


@dataclass
class _Csv:
    """CSV files read by Conveyor's CSV reader: `key` in `bucket` (Quokka's form), or the path `key` when bucket is None."""

    bucket: str | None
    key: str
    names: Sequence[str | None]
    sep: str
    stride: int
    header: bool

    def add_to(self, graph: TaskGraph, channels: int, batch_func: BatchFunc | None, dependents: Sequence[Any]) -> Node:
        if self.bucket is not None:
            return graph.new_input_csv(
                self.bucket,
                self.key,
                self.names,
                channels,
                batch_func=batch_func,
                sep=self.sep,
                dependents=dependents,
                stride=self.stride,
                batch_format="object",
                header=self.header,
            )
        return graph.new_input_csv(
            self.key,
            self.names,
            channels,
            batch_func,
            self.sep,
            dependents,
            self.stride,
            batch_format="object",
            header=self.header,
        )


class InputCSVDataset(_Csv):
    """Quokka's CSV input of spring 2022: `(bucket, key, names, sep=",", stride=64 MiB)`."""

    def __init__(self, bucket: str, key: str, names: Sequence[str | None], sep: str = ",", stride: int = 64 * MiB) -> None:
        super().__init__(bucket, key, names, sep, stride, False)


class InputS3CSVDataset(_Csv):
    """Quokka's CSV input in a bucket: `(bucket, names, prefix=None, key=None, sep=",", stride=64 MiB, header=False)`."""

    def __init__(
        self,
        bucket: str,
        names: Sequence[str | None],
        prefix: str | None = None,
        key: str | None = None,
        sep: str = ",",
        stride: int = 64 * MiB,
        header: bool = False,
    ) -> None:
        if (prefix is None) == (key is None):
            raise GraphError("InputS3CSVDataset: give a key (one file) or a prefix (the files under it), not both or neither")
        super().__init__(bucket, key or prefix or "", names, sep, stride, header)


class InputMultiCSVDataset(_Csv):
    """Quokka's many-file CSV input: `(bucket, prefix, names, sep=",", stride=64 MiB)`; prefix None: the whole bucket."""

    def __init__(
        self, bucket: str, prefix: str | None, names: Sequence[str | None], sep: str = ",", stride: int = 64 * MiB
    ) -> None:
        if prefix is None:
            super().__init__(None, bucket, names, sep, stride, False)
        else:
            super().__init__(bucket, prefix, names, sep, stride, False)


class InputDiskCSVDataset(_Csv):
    """Quokka's local CSV input: `(filepath, names, sep=",", stride=16 MiB, header=False)`."""

    def __init__(
        self, filepath: str, names: Sequence[str | None], sep: str = ",", stride: int = 16 * MiB, header: bool = False
    ) -> None:
        super().__init__(None, os.fspath(filepath), names, sep, stride, header)


@dataclass
class _Parquet:
    """Parquet files read by Conveyor's Parquet reader."""

    path: str
    columns: Sequence[str] | None
    filters: Any

    def add_to(self, graph: TaskGraph, channels: int, batch_func: BatchFunc | None, dependents: Sequence[Any]) -> Node:
        return graph.new_input_parquet(
            self.path, channels, self.columns, self.filters, batch_func, dependents, batch_format="object"
        )


class InputMultiParquetDataset(_Parquet):
    """Quokka's Parquet input: `(bucket, prefix, columns=None, filters=None)`; `filters` in pyarrow's DNF form."""

    def __init__(self, bucket: str, prefix: str | None = None, columns: Sequence[str] | None = None, filters: Any = None) -> None:
        path = bucket_path(bucket, prefix, "InputMultiParquetDataset") if prefix is not None else bucket
        super().__init__(path, columns, filters)


InputParquetDataset = InputMultiParquetDataset  # its later name, same arguments


class InputSingleParquetDataset(_Parquet):
    """Quokka's one-file Parquet input: `(bucket, filename, columns=None)`."""

    def __init__(self, bucket: str, filename: str, columns: Sequence[str] | None = None) -> None:
        super().__init__(bucket_path(bucket, filename, "InputSingleParquetDataset"), columns, None)


FileInput = _Csv | _Parquet


@dataclass
class QuokkaReader:
    """A reader object of Quokka's shape as a `conveyor.graph.SourceReader`."""

    reader: Any

    def read(self, channel: int, n_channels: int) -> Iterator[Any]:
        for setter in ("set_num_channels", "set_num_mappers"):
            if callable(getattr(self.reader, setter, None)):
                getattr(self.reader, setter)(n_channels)
                break
        for item in self.reader.get_next_batch(channel):
            # Quokka's readers yield (position, batch): the position served its checkpoints
            yield item[1] if isinstance(item, tuple) and len(item) == 2 else item


def is_reader(obj: Any) -> bool:
    """Whether `obj` has Quokka's reader method."""
    return callable(getattr(obj, "get_next_batch", None))


__all__ = [
    "InputCSVDataset",
    "InputDiskCSVDataset",
    "InputMultiCSVDataset",
    "InputMultiParquetDataset",
    "InputParquetDataset",
    "InputS3CSVDataset",
    "InputSingleParquetDataset",
]
