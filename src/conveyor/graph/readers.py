"""Readers of input nodes: CSV by byte ranges and Parquet by row groups, read with pyarrow; and `SourceReader`.

A local file (a plain path or a `file:` URI) or an S3 object (`s3://`, see `filesystems`) is cut
into splits on the driver; Spark tasks read them in Python, streaming one block at a time, so a
consumer that stops early stops the reading. Other paths (`s3a://`, `hdfs://`, ...) are read by
Spark's own readers instead (see `runtime`).
Column types of a CSV input are inferred once, on the driver, from the start of the first file,
so that every split parses to the same schema.
A `SourceReader` is the user's own source: one object, copied to every channel, that yields its batches.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pv
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .errors import GraphError, raise_in_task
from .layout import BATCH_MAX_BYTES, CSV_BLOCK_BYTES, CSV_SAMPLE_BYTES, DICTIONARY_PAGE_BYTES, PARQUET_BATCH_ROWS


@runtime_checkable
class SourceReader(Protocol):
    """An input of the user's own: `read(channel, n_channels)` yields the batches of one channel.

    Each channel gets a copy of the object (it is pickled into the Spark tasks); together the
    channels read the whole input once. Batches may be of any picklable type.
    """

    def read(self, channel: int, n_channels: int) -> Iterable[Any]: ...


PLACEHOLDERS = (None, "")  # a last name like these stands for the empty field after a trailing delimiter
TRAILING = "__conveyor_trailing"  # the column name of that empty field (never kept)


def list_files(fs: pafs.FileSystem, path: str, suffixes: Sequence[str] = ()) -> list[str]:
    """The data files at `path`, sorted.

    The file itself, or the visible files under a directory; in an object store (S3) also those
    whose key starts with `path` (a prefix, as Quokka's keys were). Locally, symbolic links to
    directories are not followed (a link loop would list forever).
    """
    if isinstance(fs, pafs.LocalFileSystem):
        return _local_files(path, suffixes)
    try:
        kind = fs.get_file_info(path).type
        if kind is pafs.FileType.File:
            return [path]
        root = path if kind is pafs.FileType.Directory else path.rpartition("/")[0]
        if kind is pafs.FileType.NotFound and (not root or fs.get_file_info(root).type is not pafs.FileType.Directory):
            raise GraphError(f"no such file or directory: {path}")
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    except (OSError, pa.ArrowException) as exc:
        raise GraphError(f"cannot list {path}: {exc}") from exc
    found = [
        i.path
        for i in infos
        if i.type is pafs.FileType.File and i.path.startswith(path) and _visible(i.path[len(root) :].split("/"), suffixes)
    ]
    if not found:
        missing = kind is pafs.FileType.NotFound
        raise GraphError(f"no such file or directory: {path}" if missing else f"no data files under {path}")
    return sorted(found)


def _local_files(path: str, suffixes: Sequence[str]) -> list[str]:
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise GraphError(f"no such file or directory: {path}")
    found: list[str] = []
    for root, dirs, files in os.walk(path):  # never into symbolic links to directories (followlinks=False)
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        found.extend(os.path.join(root, name) for name in sorted(files) if _visible([name], suffixes))
    if not found:
        raise GraphError(f"no data files under {path}")
    return found


def _visible(parts: Sequence[str], suffixes: Sequence[str]) -> bool:
    """A data file: no part of its path below the root hidden (. or _), and one of `suffixes` if given."""
    return not any(p.startswith((".", "_")) for p in parts if p) and (not suffixes or parts[-1].endswith(tuple(suffixes)))


@dataclass(frozen=True)
class CsvFormat:
    """How a CSV input parses: all field names (a placeholder included), the ones kept, their types."""

    names: tuple[str, ...]
    keep: tuple[str, ...]
    types: tuple[tuple[str, pa.DataType], ...]
    sep: str
    header: bool = False  # each file starts with a line of column names, not read as data


def csv_format(
    sample: bytes, names: Sequence[str | None], sep: str, columns: Sequence[str] | None, node: str, header: bool = False
) -> CsvFormat:
    """Infer the types of a CSV input from a sample of its first lines (after its header line, if it has one)."""
    if header:
        sample = sample.split(b"\n", 1)[1] if b"\n" in sample else b""
    given = list(names)
    first = sample.split(b"\n", 1)[0].rstrip(b"\r")
    fields = first.split(sep.encode()) if first else []
    if given and given[-1] in PLACEHOLDERS:
        given[-1] = TRAILING
    elif fields and len(fields) == len(given) + 1 and first.endswith(sep.encode()):
        given.append(TRAILING)  # a trailing delimiter (TPC-H .tbl): an empty last field
    if any(not isinstance(n, str) or not n for n in given):
        raise GraphError(f"node {node}: names must be non-empty strings (only the last may be a placeholder), got {given}")
    full = [n for n in given if n]  # all of them: every name is a non-empty string
    if len(set(full)) != len(full):
        raise GraphError(f"node {node}: names repeat a column: {full}")
    if fields and len(fields) != len(full):
        raise GraphError(
            f"node {node}: the first line has {len(fields)} fields but {len(full)} names were given "
            f"(a line ending in {sep!r} needs a placeholder name at the end)"
        )
    keep = [n for n in full if n != TRAILING]
    if columns is not None:
        missing = [c for c in columns if c not in keep]
        if missing:
            raise GraphError(f"node {node}: columns {missing} are not among the names {keep}")
        keep = list(columns)
    types: dict[str, pa.DataType] = {n: pa.string() for n in keep}
    if sample:
        try:
            table = pv.read_csv(
                io.BytesIO(sample),
                read_options=pv.ReadOptions(column_names=full, use_threads=False),
                parse_options=pv.ParseOptions(delimiter=sep),
                convert_options=pv.ConvertOptions(include_columns=keep),
            )
        except pa.ArrowInvalid as exc:
            raise GraphError(f"node {node}: cannot parse the first lines as CSV with sep={sep!r}: {exc}") from exc
        for f in table.schema:
            types[f.name] = pa.string() if pa.types.is_null(f.type) else f.type
    return CsvFormat(tuple(full), tuple(keep), tuple((n, types[n]) for n in keep), sep, header)


def read_sample(fs: pafs.FileSystem, path: str, size: int = CSV_SAMPLE_BYTES) -> bytes:
    """The first whole lines of a file, about `size` bytes of them."""
    with fs.open_input_file(path) as f:
        data: bytes = f.read(size)
    if len(data) == size:
        data = data[: data.rfind(b"\n") + 1]
    return data


@dataclass(frozen=True)
class CsvSplit:
    """A byte range of a file; it holds the lines that start inside it."""

    path: str
    start: int
    end: int


def csv_splits(fs: pafs.FileSystem, files: Sequence[str], stride: int) -> list[CsvSplit]:
    """Cut files into ranges of `stride` bytes (line boundaries are found when a range is read)."""
    splits: list[CsvSplit] = []
    for path, info in zip(files, fs.get_file_info(list(files)), strict=True):
        size = info.size or 0
        splits.extend(CsvSplit(path, start, min(start + stride, size)) for start in range(0, size, stride))
    return splits


def _line_start(mm: pa.NativeFile, pos: int, size: int) -> int:
    """The offset of the first line that starts at or after `pos`."""
    if pos <= 0:
        return 0
    probe = pos - 1  # a line starts at pos exactly when the byte before it ends a line
    while probe < size:
        chunk = mm.read_at(min(65536, size - probe), probe)
        at: int = chunk.find(b"\n")
        if at >= 0:
            return probe + at + 1
        probe += len(chunk)
    return size


@dataclass
class CsvReader:
    """Reads the splits of one CSV input; picklable, so it runs inside Spark tasks."""

    node: str
    fmt: CsvFormat
    fs: pafs.FileSystem
    splits: list[CsvSplit] = field(default_factory=list)
    block_bytes: int = CSV_BLOCK_BYTES

    def __len__(self) -> int:
        return len(self.splits)

    def read_run(self, indexes: Iterable[int]) -> Iterator[tuple[int, pa.Table]]:
        """(split, batch) of each split of `indexes` in turn, one parsed block at a time."""
        for index in indexes:
            for table in self.read(index):
                yield index, table

    def read(self, index: int) -> Iterator[pa.Table]:
        """The batches of split `index`, one parsed block at a time."""
        split = self.splits[index]
        # a local file is mapped (the block is a zero-copy view of it); a remote one is read by range
        local = isinstance(self.fs, pafs.LocalFileSystem)
        with pa.memory_map(split.path, "r") if local else self.fs.open_input_file(split.path) as mm:
            size = mm.size()
            start, end = _line_start(mm, split.start, size), _line_start(mm, split.end, size)
            if self.fmt.header:
                start = max(start, _line_start(mm, 1, size))  # the header line is no row
            if end <= start:
                return
            mm.seek(start)
            data = mm.read_buffer(end - start)
            try:
                reader = pv.open_csv(
                    pa.BufferReader(data),
                    read_options=pv.ReadOptions(
                        column_names=list(self.fmt.names), use_threads=False, block_size=self.block_bytes
                    ),
                    parse_options=pv.ParseOptions(delimiter=self.fmt.sep),
                    convert_options=pv.ConvertOptions(include_columns=list(self.fmt.keep), column_types=dict(self.fmt.types)),
                )
                for batch in reader:
                    if batch.num_rows:
                        yield pa.Table.from_batches([batch])
            except pa.ArrowInvalid as exc:
                raise_in_task(
                    f"node {self.node!r}: {split.path} bytes {start}..{end}: {exc} "
                    "(column types were inferred from the start of the first file)"
                )


DICTIONARIES_KEY = b"conveyor.dictionaries"  # a table's schema metadata: its columns still Arrow dictionaries


def dictionary_columns(table: pa.Table) -> list[str]:
    """The columns of a table from a Parquet input that are still dictionaries for its routes to decode."""
    names = (table.schema.metadata or {}).get(DICTIONARIES_KEY)
    return names.decode().split(",") if names else []


@dataclass(frozen=True)
class ParquetSplit:
    path: str
    row_group: int


@dataclass
class ParquetReader:
    """Reads the row groups of one Parquet input; picklable, so it runs inside Spark tasks.

    `dictionary` names the string columns read as Arrow dictionaries: a column of few distinct
    values (TPC-H's flags, ship modes, priorities) is then read as its dictionary and indexes, six
    times faster than as one string per row, and filtered as that; only the rows kept are decoded,
    into the column's own type, here, or, with `decode` off, by the routes that filter them further
    (`Router.dictionaries`; the tables name those columns: `dictionary_columns`).
    """

    node: str
    columns: list[str] | None
    filter: pc.Expression | None
    fs: pafs.FileSystem
    splits: list[ParquetSplit] = field(default_factory=list)
    dictionary: frozenset[str] = frozenset()
    decode: bool = True  # False: dictionary columns left to the routes (named under DICTIONARIES_KEY)
    _files: dict[str, ds.ParquetFileFragment] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.splits)

    def _row_group(self, split: ParquetSplit) -> ds.ParquetFileFragment:
        # the file's footer is parsed once per reader: a fragment per row group parses it at every read
        # (a third of the time of reading TPC-H lineitem's row groups)
        if split.path not in self._files:
            options = ds.ParquetReadOptions(dictionary_columns=set(self.dictionary))
            self._files[split.path] = ds.ParquetFileFormat(read_options=options).make_fragment(split.path, self.fs)
        return self._files[split.path].subset(row_group_ids=[split.row_group])

    def _table(self, batches: list[pa.RecordBatch]) -> pa.Table:
        """`batches` as one table, its dictionary columns decoded (the rows the filter kept)."""
        table = pa.Table.from_batches(batches)
        if not self.dictionary:
            return table
        if not self.decode:
            coded = [f.name for f in table.schema if f.name in self.dictionary and pa.types.is_dictionary(f.type)]
            return table.replace_schema_metadata({**(table.schema.metadata or {}), DICTIONARIES_KEY: ",".join(coded)})
        for i, f in enumerate(table.schema):
            if f.name in self.dictionary and pa.types.is_dictionary(f.type):
                # a take from the dictionary: twice as fast as a cast to its values' type
                chunks = [chunk.dictionary.take(chunk.indices) for chunk in table.column(i).chunks]
                table = table.set_column(i, f.with_type(f.type.value_type), pa.chunked_array(chunks, f.type.value_type))
        return table

    def read_run(self, indexes: Iterable[int]) -> Iterator[tuple[int, pa.Table]]:
        """The rows of row groups `indexes`, filtered (on any column, kept or not) then projected.

        Read in turn and merged into tables of up to PARQUET_BATCH_ROWS rows and BATCH_MAX_BYTES
        bytes: the work per batch downstream (batch functions, routing, an executor call per batch)
        is then spent on fewer, larger batches. Each table comes with the split its first rows are
        of. A run whose rows are all filtered out gives one empty table (its columns).
        """
        held: list[pa.RecordBatch] = []
        first, rows, size, given = 0, 0, 0, False
        empty: tuple[int, pa.Table] | None = None
        options = {"columns": self.columns, "filter": self.filter, "batch_size": PARQUET_BATCH_ROWS, "use_threads": False}
        for index in indexes:
            for batch in self._row_group(self.splits[index]).to_batches(**options):
                if not batch.num_rows:
                    empty = empty or (index, self._table([batch]))
                    continue
                if held and batch.schema != held[0].schema:
                    yield first, self._table(held)
                    held, rows, size, given = [], 0, 0, True
                if not held:
                    first = index
                held.append(batch)
                rows, size = rows + batch.num_rows, size + batch.nbytes
                if rows >= PARQUET_BATCH_ROWS or size >= BATCH_MAX_BYTES:
                    yield first, self._table(held)
                    held, rows, size, given = [], 0, 0, True
        if held:
            yield first, self._table(held)
        elif not given and empty is not None:
            yield empty


def parquet_reader(
    node: str, fs: pafs.FileSystem, files: Sequence[str], columns: Sequence[str] | None, filters: object
) -> ParquetReader:
    """A reader over every row group of `files`, checking the columns against the first file's schema."""
    schema = pq.read_schema(files[0], filesystem=fs)
    if columns is not None:
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise GraphError(f"node {node}: columns {missing} are not in {files[0]} (columns: {schema.names})")
    strings = {f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)}
    splits: list[ParquetSplit] = []
    for path in files:
        metadata = pq.ParquetFile(fs.open_input_file(path)).metadata
        splits += [ParquetSplit(path, rg) for rg in range(metadata.num_row_groups)]
        strings &= small_dictionaries(metadata)
    kept = list(columns) if columns is not None else None
    return ParquetReader(node, kept, parquet_filter(filters, node), fs, splits, frozenset(strings))


def small_dictionaries(metadata: pq.FileMetaData) -> set[str]:
    """The top-level columns of a Parquet file whose every chunk is dictionary-encoded with a small dictionary.

    Small: at most DICTIONARY_PAGE_BYTES, far under the writers' limit on a dictionary page (1 MiB
    in Arrow's and parquet-mr's) past which a chunk falls back to plain pages, and at most an eighth
    of its chunk, the rest being the indexes of values that repeat. Such chunks hold few distinct
    values, and reading them as a dictionary costs next to nothing.
    """
    found: set[str] | None = None
    for rg in range(metadata.num_row_groups):
        group = metadata.row_group(rg)
        small = set()
        for i in range(group.num_columns):
            chunk = group.column(i)
            start = chunk.dictionary_page_offset
            if not chunk.has_dictionary_page or start is None:
                continue
            size = chunk.data_page_offset - start
            if 0 < size <= min(DICTIONARY_PAGE_BYTES, chunk.total_compressed_size // 8):
                small.add(chunk.path_in_schema)
        found = small if found is None else found & small
    return found or set()


def parquet_filter(filters: object, node: str) -> pc.Expression | None:
    """`filters` (a pyarrow Expression, or DNF tuples as pyarrow.parquet takes them) as an Expression."""
    if filters is None or isinstance(filters, pc.Expression):
        return filters
    try:
        return pq.filters_to_expression(filters)
    except (TypeError, ValueError) as exc:
        raise GraphError(f"node {node}: bad filters {filters!r}: {exc}") from exc
