"""Quokka's input datasets (its `dataset` module of 2022 and 2023), for `TaskGraph.new_input_reader_node`.

Each names files that Conveyor's readers read inside Spark tasks: CSV split at byte offsets
(`stride` bytes per split), Parquet by row groups. As in Quokka, a reader's `batch_func` gets each
batch read as a pyarrow Table; a Table that goes on unchanged travels as a polars DataFrame.
`bucket` is a local directory, an `s3://` URL or an S3 bucket name (see docs/graph.md).

Any other object with Quokka's reader methods (`get_next_batch(channel, pos=None)` yielding
`(position, batch)`, and `set_num_channels(n)` or `set_num_mappers(n)`) is a reader too: each
channel runs a copy of it in a Spark task of its own. So is one of Quokka's 2023 protocol
(`get_own_state(n)` giving `{channel: [state, ...]}`, `execute(channel, state)` giving
`(next_state, batch)`: `TapedReader`), as `InputDiskJSONDataset` is.
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.json as pj

from ...graph import GraphError, Node, TaskGraph
from ...graph.filesystems import bucket_path
from .rest_inputs import InputRestGetAPIDataset, InputRestPostAPIDataset

MiB = 1024 * 1024
BatchFunc = Callable[[Any], Any]


@dataclass
class _Csv:
    """CSV files read by Conveyor's CSV reader: `key` in `bucket` (Quokka's form), or the path `key` when bucket is None.

    `names` None (with a header line): the names of the first file's header line, as Quokka's
    2023 readers took them. `columns` keeps only those columns (parsed alone: faster).
    """

    bucket: str | None
    key: str
    names: Sequence[str | None] | None
    sep: str
    stride: int
    header: bool
    columns: Sequence[str] | None = None

    def _names(self) -> Sequence[str | None]:
        if self.names is not None:
            return self.names
        path = self.key if self.bucket is None else bucket_path(self.bucket, self.key, type(self).__name__)
        first = _first_file(path)
        with open(first, encoding="utf-8", newline="") as f:
            line = f.readline().rstrip("\r\n")
        if not line:
            raise GraphError(f"{type(self).__name__}: {first} has no header line to take the column names from")
        return line.split(self.sep)

    def add_to(self, graph: TaskGraph, channels: int, batch_func: BatchFunc | None, dependents: Sequence[Any]) -> Node:
        names = self._names()
        columns = None if self.columns is None else list(self.columns)
        if self.bucket is not None:
            return graph.new_input_csv(
                self.bucket,
                self.key,
                names,
                channels,
                batch_func=batch_func,
                sep=self.sep,
                dependents=dependents,
                stride=self.stride,
                batch_format="object",
                header=self.header,
                columns=columns,
            )
        return graph.new_input_csv(
            self.key,
            names,
            channels,
            batch_func,
            self.sep,
            dependents,
            self.stride,
            batch_format="object",
            header=self.header,
            columns=columns,
        )


def _first_file(path: str) -> str:
    """`path`, or the first file (by name) of the directory `path`: where a header line is read from."""
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if os.path.isfile(os.path.join(path, f)))
        if not files:
            raise GraphError(f"no file in {path} to read a header line from")
        return files[0]
    if not os.path.isfile(path):
        raise GraphError(f"no file {path!r} to read a header line from (the column names of header=True without names)")
    return path


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
    """Quokka's local CSV input: `(filepath, names=None, sep=",", stride=16 MiB, header=False, window, columns=None)`.

    Without `names`, `header=True` takes them from the first line (Quokka's 2023 form).
    `window` (its look-back for line ends) is taken and unused; `sort_info` is not supported.
    """

    def __init__(
        self,
        filepath: str,
        names: Sequence[str | None] | None = None,
        sep: str = ",",
        stride: int = 16 * MiB,
        header: bool = False,
        window: int = 4 * 1024,
        columns: Sequence[str] | None = None,
        sort_info: Any = None,
    ) -> None:
        if names is None and not header:
            raise GraphError("InputDiskCSVDataset: give the column names, or header=True to read them from the file")
        if sort_info is not None:
            raise GraphError("InputDiskCSVDataset: sort_info (Quokka's sorted inputs) is not supported")
        super().__init__(None, os.fspath(filepath), names, sep, int(stride), header, columns)


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


class InputParquetDataset(InputMultiParquetDataset):
    """Quokka's later Parquet input: `(bucket, prefix, columns=None, filters=None)`, or 2023's `(filename, columns, filters)`."""

    def __init__(self, bucket: str, prefix: Any = None, columns: Sequence[str] | None = None, filters: Any = None) -> None:
        if isinstance(prefix, list | tuple):  # 2023's (filename, columns, ...)
            prefix, columns = None, prefix
        super().__init__(bucket, prefix, columns, filters)


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
    """Whether `obj` has Quokka's reader method of 2022."""
    return callable(getattr(obj, "get_next_batch", None))


def is_taped_reader(obj: Any) -> bool:
    """Whether `obj` has Quokka's reader methods of 2023: `get_own_state(n)` and `execute(channel, state)`."""
    return callable(getattr(obj, "get_own_state", None)) and callable(getattr(obj, "execute", None))


@dataclass
class TapedReader:
    """A reader of Quokka's 2023 protocol as a `conveyor.graph.SourceReader`.

    `get_own_state(n_channels)` was asked on the driver and gave `{channel: [state, ...]}`; channel
    c calls `execute(c, state)` for each of its states in order and sends the batch of each
    `(next_state, batch)` it returns (a None batch sends nothing). As in Quokka's taped inputs, the
    next state returned is not followed: the states listed are the channel's whole work.
    """

    reader: Any
    states: dict[int, list[Any]]

    def read(self, channel: int, n_channels: int) -> Iterator[Any]:
        for state in self.states.get(channel, []):
            out = self.reader.execute(channel, state)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError(
                    f"{type(self.reader).__name__}.execute(channel, state) must return (next_state, batch), "
                    f"got {type(out).__name__}"
                )
            if out[1] is not None:
                yield out[1]


def taped(reader: Any, n_channels: int, what: str) -> TapedReader:
    """A 2023 reader with its channels' states, asked of it now (on the driver, as Quokka did)."""
    states = reader.get_own_state(n_channels)
    if not isinstance(states, Mapping) or not all(isinstance(v, list | tuple) for v in states.values()):
        raise GraphError(f"{what}: {type(reader).__name__}.get_own_state(n) must return {{channel: [state, ...]}}")
    outside = [c for c in states if not (isinstance(c, int) and 0 <= c < n_channels)]
    if outside:
        raise GraphError(f"{what}: {type(reader).__name__}.get_own_state({n_channels}) names channels {outside}")
    return TapedReader(reader, {c: list(v) for c, v in states.items()})


class InputDiskJSONDataset:
    """Quokka's local newline-delimited JSON input: `(filepath, names=None, stride=16 MiB, window, keys=None, schema=None)`.

    A file, or every file of a directory, cut into runs of about `stride` bytes at line ends and
    parsed by pyarrow (`schema`: a `pyarrow.schema` to parse with; `keys`: the columns kept).
    A reader of Quokka's 2023 protocol (`get_own_state`, `execute`). `names`, `window` and
    `sort_info` are taken and unused (`sort_info` must be None).
    """

    def __init__(
        self,
        filepath: str,
        names: Sequence[str] | None = None,
        stride: int = 16 * MiB,
        window: int = 4 * 1024,
        keys: Sequence[str] | None = None,
        sort_info: Any = None,
        schema: Any = None,
    ) -> None:
        if sort_info is not None:
            raise GraphError("InputDiskJSONDataset: sort_info (Quokka's sorted inputs) is not supported")
        if int(stride) < 1:
            raise GraphError(f"InputDiskJSONDataset: stride must be at least 1 byte, got {stride!r}")
        self.filepath = os.fspath(filepath)
        self.stride = int(stride)
        self.keys = None if keys is None else list(keys)
        self.schema = schema

    def _files(self) -> list[str]:
        if os.path.isdir(self.filepath):
            return sorted(os.path.join(self.filepath, f) for f in os.listdir(self.filepath) if not f.startswith("."))
        if not os.path.isfile(self.filepath):
            raise GraphError(f"InputDiskJSONDataset: no file or directory {self.filepath!r}")
        return [self.filepath]

    def get_own_state(self, num_channels: int) -> dict[int, list[tuple[str, int, int]]]:
        """Runs `(file, start, end)` of whole lines, dealt to the channels in contiguous blocks."""
        runs: list[tuple[str, int, int]] = []
        for path in self._files():
            size = os.path.getsize(path)
            cuts = [0]
            with open(path, "rb") as f:
                while cuts[-1] + self.stride < size:
                    f.seek(cuts[-1] + self.stride)
                    f.readline()  # to the end of the line the cut falls in
                    cuts.append(min(f.tell(), size))
            if cuts[-1] < size:
                cuts.append(size)
            runs.extend((path, a, b) for a, b in itertools.pairwise(cuts) if b > a)
        per = -(-len(runs) // num_channels) if runs else 0
        return {c: runs[c * per : (c + 1) * per] for c in range(num_channels) if runs[c * per : (c + 1) * per]}

    def execute(self, channel: int, state: tuple[str, int, int]) -> tuple[None, Any]:
        """The lines of one run, parsed."""
        path, start, end = state
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
        options = pj.ParseOptions(explicit_schema=self.schema) if self.schema is not None else pj.ParseOptions()
        table = pj.read_json(io.BytesIO(data), parse_options=options)
        return None, table.select(self.keys) if self.keys is not None else table


__all__ = [
    "InputCSVDataset",
    "InputDiskCSVDataset",
    "InputDiskJSONDataset",
    "InputMultiCSVDataset",
    "InputMultiParquetDataset",
    "InputParquetDataset",
    "InputRestGetAPIDataset",
    "InputRestPostAPIDataset",
    "InputS3CSVDataset",
    "InputSingleParquetDataset",
]
