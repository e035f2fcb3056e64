"""Quokka's `TargetInfo` of 2023 (`pyquokka.target_info`): what happens to each batch on its way to a node.

`TargetInfo(partitioner, predicate, projection, batch_funcs)`, given per stream in a task node's
`source_target_info`, runs where the batch is made, as Quokka ran it: the batch as a polars
DataFrame, filtered by `predicate` (a sqlglot expression, see `predicates`), passed through each
of `batch_funcs` in order (polars in, polars out; an empty or None result sends nothing), split by
the partitioner, and cut to the `projection` columns (all columns when None), in name order as
Quokka sent them. Empty batches are not sent (Quokka's executors never saw them).

Partitioners: `PassThroughPartitioner()` (Quokka's default partition, `partitions.ByRatio`),
`BroadcastPartitioner()` (every channel gets the batch), `HashPartitioner(key)` (by a column:
numbers by `key % channels`, other types by a stable hash), `RangePartitioner(key, total_range)`
(channel `(key - 1) // (total_range // channels)`, clipped to the channels there are) and
`FunctionPartitioner(func)` (`func(frame, source_channel, n_channels) -> {channel: frame}`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ...graph import GraphError, Router
from ...graph.readers import dictionary_columns
from .frames import is_polars, polars_module, to_transit
from .partitions import ByColumn, ByRatio
from .predicates import polars_filter


class Partitioner:
    """Quokka's base class of the partitioners."""


@dataclass
class PassThroughPartitioner(Partitioner):
    """Quokka's default partition: source channel // ratio (or spread when the target has more channels)."""


@dataclass
class BroadcastPartitioner(Partitioner):
    """Every channel of the target gets every batch."""


@dataclass
class HashPartitioner(Partitioner):
    """Rows by the value of column `key`."""

    key: str


@dataclass
class RangePartitioner(Partitioner):
    """Rows by ranges of column `key` over 1..total_range."""

    key: str
    total_range: int


@dataclass
class FunctionPartitioner(Partitioner):
    """`func(frame, source_channel, n_channels) -> {channel: frame}`."""

    func: Callable[[Any, int, int], Mapping[int, Any]]


class TargetInfo:
    """One stream's partitioner, predicate (sqlglot, or None), projection (columns, or None) and batch functions."""

    def __init__(self, partitioner: Any, predicate: Any, projection: Sequence[str] | None, batch_funcs: Sequence[Any]) -> None:
        self.partitioner = partitioner
        self.predicate = predicate
        self.projection = projection
        self.batch_funcs = list(batch_funcs)

    def append_batch_func(self, func: Callable[[Any], Any]) -> None:
        """One more batch function, run after the others."""
        self.batch_funcs.append(func)

    def __repr__(self) -> str:
        predicate = self.predicate.sql() if hasattr(self.predicate, "sql") else repr(self.predicate)
        return (
            f"TargetInfo(partitioner={self.partitioner!r}, predicate={predicate}, projection={self.projection!r}, "
            f"batch_funcs={self.batch_funcs!r})"
        )


@dataclass(frozen=True)
class ByRange:
    """Rows of a polars frame by `(key - 1) // (total_range // n)`, clipped to the channels there are."""

    key: str
    total_range: int

    def __call__(self, frame: Any, source: int, n: int) -> Iterator[tuple[int, Any]]:
        width = max(self.total_range // n, 1)
        values = frame[self.key].to_numpy()
        channels = np.clip((values - 1) // width, 0, n - 1).astype(np.int64)
        pl = polars_module("RangePartitioner")
        for channel in np.unique(channels).tolist():
            yield channel, frame.filter(pl.Series(channels == channel))


@dataclass(frozen=True)
class ByFunction:
    """Quokka's partition function `(frame, source_channel, n_channels) -> {channel: frame}`."""

    func: Callable[[Any, int, int], Mapping[int, Any]]

    def __call__(self, frame: Any, source: int, n: int) -> Iterator[tuple[int, Any]]:
        parts = self.func(frame, source, n)
        if not isinstance(parts, Mapping):
            raise TypeError(f"a FunctionPartitioner's function must return {{channel: data}}, got {type(parts).__name__}")
        yield from parts.items()


Split = Callable[[Any, int, int], Iterator[tuple[int, Any]]]


@dataclass
class TargetRoute:
    """A stream's TargetInfo as it runs on each batch: predicate, batch functions, partition, projection."""

    predicate: Any
    batch_funcs: tuple[Callable[[Any], Any], ...]
    split: Split | None  # None: every channel gets the batch
    projection: tuple[str, ...] | None
    _filter: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_filter"] = None  # a polars expression is made again where the route runs
        return state

    def __call__(self, data: Any, source: int, n: int) -> Iterator[tuple[int, Any]]:
        coded = dictionary_columns(data) if isinstance(data, pa.Table) else []
        frame = _frame(data)
        if self.predicate is not None:
            if self._filter is None:
                self._filter = polars_filter(self.predicate)
            frame, coded = _filtered(frame, self._filter, coded)
        if coded:
            frame = _decoded(frame, coded)
        for func in self.batch_funcs:
            frame = func(frame)
            if frame is None or len(frame) == 0:
                return
            frame = _frame(frame)
        if len(frame) == 0:
            return
        parts = ((c, frame) for c in range(n)) if self.split is None else self.split(frame, source, n)
        for channel, part in parts:
            if part is None or len(part) == 0:
                continue
            part = _frame(part)
            yield channel, to_transit(part.select(sorted(self.projection or part.columns)))


def _filtered(frame: Any, predicate: Any, coded: list[str]) -> tuple[Any, list[str]]:
    """`frame`'s rows that `predicate` keeps, and which of `coded` (Parquet strings read as dictionaries) are still so.

    They are filtered as polars Categoricals, which compare with strings as strings do (in order
    too, from polars 2 on) and are decoded afterwards, only the rows kept; a predicate that calls a
    string function on one (LIKE), or an older polars, has them decoded first.
    """
    pl = polars_module("Quokka's TargetInfo")
    if coded and int(pl.__version__.split(".")[0]) < 2:
        frame, coded = _decoded(frame, coded), []
    try:
        return frame.filter(predicate), coded
    except pl.exceptions.InvalidOperationError:
        if not coded:
            raise
        return _decoded(frame, coded).filter(predicate), []


def _decoded(frame: Any, coded: list[str]) -> Any:
    """`frame` with the columns `coded` (Categoricals of a Parquet input's dictionaries) as the strings they are."""
    pl = polars_module("Quokka's TargetInfo")
    return frame.with_columns([pl.col(c).cast(pl.String) for c in coded if c in frame.columns])


def _frame(data: Any) -> Any:
    """A batch as the polars DataFrame Quokka's TargetInfo worked on."""
    if is_polars(data):
        return data
    pl = polars_module("Quokka's TargetInfo")
    if isinstance(data, pa.Table | pa.RecordBatch):
        return pl.from_arrow(data)
    if isinstance(data, pd.DataFrame):
        return pl.from_pandas(data)
    raise TypeError(f"a stream with a TargetInfo carries frames (polars, pyarrow or pandas), got a {type(data).__name__}")


def route(info: Any, source_channels: int, target_channels: int, what: str) -> Router:
    """The Router of a TargetInfo on an edge from `source_channels` to `target_channels` channels, checked now."""
    if not isinstance(info, TargetInfo):
        raise GraphError(f"{what}: source_target_info must map each stream to a TargetInfo, got {type(info).__name__}")
    partitioner = info.partitioner
    split: Split | None
    if isinstance(partitioner, PassThroughPartitioner):
        split = ByRatio(source_channels, target_channels)
    elif isinstance(partitioner, BroadcastPartitioner):
        split = None
    elif isinstance(partitioner, HashPartitioner):
        split = ByColumn(partitioner.key)
    elif isinstance(partitioner, RangePartitioner):
        split = ByRange(partitioner.key, partitioner.total_range)
    elif isinstance(partitioner, FunctionPartitioner):
        split = ByFunction(partitioner.func)
    else:
        raise GraphError(
            f"{what}: {type(partitioner).__name__} is not a partitioner (PassThroughPartitioner, BroadcastPartitioner, "
            "HashPartitioner, RangePartitioner or FunctionPartitioner)"
        )
    projection = info.projection
    if projection is not None and (isinstance(projection, str) or not all(isinstance(c, str) for c in projection)):
        raise GraphError(f"{what}: a projection is a list of column names or None, got {projection!r}")
    if not all(callable(f) for f in info.batch_funcs):
        raise GraphError(f"{what}: batch_funcs must be functions of a polars DataFrame")
    try:
        polars_filter(info.predicate)  # a form the compat does not translate is an error now, before any work
    except GraphError as e:
        raise GraphError(f"{what}: {e}") from None
    kept = None if projection is None else tuple(projection)
    return Router(TargetRoute(info.predicate, tuple(info.batch_funcs), split, kept), dictionaries=True)


__all__ = [
    "BroadcastPartitioner",
    "FunctionPartitioner",
    "HashPartitioner",
    "Partitioner",
    "PassThroughPartitioner",
    "RangePartitioner",
    "TargetInfo",
]
