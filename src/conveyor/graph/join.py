"""Hash indexes for the streaming hash join: key -> rows, built with pandas' hash tables.

A side of a join keeps its batches as a few chunks, each with an index built when first probed.
Chunks merge like a binary counter (a chunk absorbs the newer one once it is at most twice its
size), so a side that grows batch by batch is re-indexed O(log n) times per row rather than once
per batch, and a probe visits O(log n) chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, pd.Index]:
    """Factorised values: a code per row (-1 for null) and the distinct values."""
    values = column.to_pandas() if not pa.types.is_dictionary(column.type) else column.cast(column.type.value_type).to_pandas()
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    return codes.astype(np.int64, copy=False), pd.Index(uniques)


def _lookup(column: pa.ChunkedArray, uniques: pd.Index) -> np.ndarray:
    """The code of each value in `uniques` (-1 when absent or null)."""
    values = column.to_pandas() if not pa.types.is_dictionary(column.type) else column.cast(column.type.value_type).to_pandas()
    codes: np.ndarray = uniques.get_indexer(values)
    if column.null_count:
        codes[column.is_null().to_numpy(zero_copy_only=False)] = -1
    return codes.astype(np.int64, copy=False)


@dataclass
class KeyIndex:
    """Rows of one table grouped by their key: group g holds rows order[starts[g]:starts[g]+counts[g]]."""

    uniques: list[pd.Index]
    sizes: list[int]
    groups: pd.Index  # combined code of each group
    order: np.ndarray
    starts: np.ndarray
    counts: np.ndarray

    @classmethod
    def build(cls, table: pa.Table, keys: Sequence[str]) -> KeyIndex:
        combined = np.zeros(table.num_rows, dtype=np.int64)
        valid = np.ones(table.num_rows, dtype=bool)
        uniques, sizes = [], []
        for key in keys:
            codes, u = _codes(table.column(key))
            valid &= codes >= 0
            combined = combined * (len(u) + 1) + codes
            uniques.append(u)
            sizes.append(len(u) + 1)
        if float(np.prod([float(s) for s in sizes])) >= 2.0**62:
            raise ValueError(f"join keys {list(keys)} have too many distinct combinations to index in one chunk")
        rows = np.flatnonzero(valid)  # null keys never match: their rows are left out
        group_of_row, groups = pd.factorize(combined[rows])
        order = rows[np.argsort(group_of_row, kind="stable")]
        counts = np.bincount(group_of_row, minlength=len(groups))
        starts = np.cumsum(counts) - counts
        return cls(uniques, sizes, pd.Index(groups), order, starts, counts)

    def probe(self, table: pa.Table, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(rows of `table`, matching rows of the indexed table): every pair with equal keys."""
        combined = np.zeros(table.num_rows, dtype=np.int64)
        valid = np.ones(table.num_rows, dtype=bool)
        for key, u, size in zip(keys, self.uniques, self.sizes, strict=True):
            codes = _lookup(table.column(key), u)
            valid &= codes >= 0
            combined = combined * size + codes
        group = self.groups.get_indexer(combined)
        group[~valid] = -1
        probe_rows = np.flatnonzero(group >= 0)
        group = group[probe_rows]
        counts = self.counts[group]
        total = int(counts.sum())
        left = np.repeat(probe_rows, counts)
        offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        right = self.order[np.repeat(self.starts[group], counts) + offsets]
        return left, right


@dataclass
class Chunk:
    table: pa.Table
    index: KeyIndex | None = None


@dataclass
class JoinSide:
    """The stored batches of one side of a join, indexed on its key columns."""

    keys: tuple[str, ...]
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return sum(c.table.num_rows for c in self.chunks)

    def add(self, table: pa.Table) -> None:
        self.chunks.append(Chunk(table))
        while len(self.chunks) >= 2 and self.chunks[-2].table.num_rows <= 2 * self.chunks[-1].table.num_rows:
            newer = self.chunks.pop()
            older = self.chunks.pop()
            self.chunks.append(Chunk(pa.concat_tables([older.table, newer.table], promote_options="permissive")))

    def compact(self) -> None:
        """Merge every chunk into one (a complete build side is indexed once)."""
        if len(self.chunks) > 1:
            self.chunks = [Chunk(pa.concat_tables([c.table for c in self.chunks], promote_options="permissive"))]

    def matches(self, probe: pa.Table, probe_keys: Sequence[str]) -> list[tuple[pa.Table, np.ndarray, np.ndarray]]:
        """For each chunk: (chunk table, probe rows, chunk rows) of the matching pairs."""
        out = []
        for chunk in self.chunks:
            if chunk.index is None:
                chunk.index = KeyIndex.build(chunk.table, self.keys)
            left, right = chunk.index.probe(probe, probe_keys)
            if len(left):
                out.append((chunk.table, left, right))
        return out


def combine(left: pa.Table, left_rows: np.ndarray, right: pa.Table, right_rows: np.ndarray, suffix: str) -> pa.Table:
    """The joined rows: the left columns, then the right ones (a right name already taken gets `suffix`)."""
    lt = left.take(pa.array(left_rows))
    rt = right.take(pa.array(right_rows))
    names = list(lt.column_names)
    columns = list(lt.columns)
    for name, column in zip(rt.column_names, rt.columns, strict=True):
        out = name
        while out in names:
            out += suffix
        names.append(out)
        columns.append(column)
    return pa.Table.from_arrays(columns, names=names)
