"""Quokka's partition keys as `conveyor.graph.Router`s: where each batch a node emits goes.

- a column name: a row goes to channel `key % n` (numbers) or a stable hash of the value % n
  (strings and other types), in pandas, polars and pyarrow frames alike;
- None: the whole batch to every channel (handled by the runtime itself);
- a function of Quokka's spring 2022 form `(data, source_channel, target_channel) -> data or
  None`, asked once per target channel (`partition_key` of the five-argument node form);
- a function of its later form `(data, source_channel, n_target_channels) -> {channel: data}`
  (`partition_key_supplied`);
- no key at all (`partition_key_supplied` without the stream): Quokka's default, channel
  `source // ratio` when the source has `ratio` times the target's channels, or spread over
  `ratio` channels from `source * ratio` when the target has more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ...graph import GraphError, Router
from ...graph.channels import channels_of, split_by_channel, stable_hash
from .frames import is_polars, polars_module, received, rows, to_transit


@dataclass(frozen=True)
class ByColumn:
    """Rows by the value of one column."""

    key: str

    def __call__(self, data: Any, source: int, n: int) -> Iterator[tuple[int, Any]]:
        columns = data.column_names if isinstance(data, pa.Table) else list(getattr(data, "columns", []))
        if self.key not in columns and (isinstance(data, pa.Table | pd.DataFrame) or is_polars(data)):
            raise KeyError(f"partition key column {self.key!r} is not in the batch (columns: {columns})")
        if isinstance(data, pa.Table):
            yield from split_by_channel(data, channels_of(data, self.key, n, f"partition key {self.key!r}"), n)
            return
        if isinstance(data, pd.DataFrame):
            channels = _channels(pa.array(data[self.key].to_numpy(), from_pandas=True), n)
            for channel in np.unique(channels).tolist():
                yield channel, data[channels == channel]
            return
        if is_polars(data):
            channels = _channels(data[self.key].to_arrow(), n)
            pl = polars_module("routing a polars frame")
            for channel in np.unique(channels).tolist():
                yield channel, data.filter(pl.Series(channels == channel))
            return
        raise TypeError(
            f"a partition key column ({self.key!r}) routes pandas, polars or pyarrow frames, not a "
            f"{type(data).__name__}: give a partition function instead"
        )


def _channels(values: pa.Array | pa.ChunkedArray, n: int) -> np.ndarray:
    """The channel of each value: key % n for numbers (nulls to 0), a stable hash % n otherwise."""
    if pa.types.is_integer(values.type) or pa.types.is_floating(values.type):
        numbers = np.nan_to_num(values.to_numpy(zero_copy_only=False).astype(np.float64, copy=False))
        channels: np.ndarray = np.mod(np.floor(numbers), n).astype(np.int64)
        return channels
    hashed: np.ndarray = (stable_hash(values) % np.uint64(n)).astype(np.int64)
    return hashed


@dataclass(frozen=True)
class PerTarget:
    """Quokka's spring 2022 partition function: `f(data, source_channel, target_channel) -> data or None`."""

    func: Callable[[Any, int, int], Any]

    def __call__(self, data: Any, source: int, n: int) -> Iterator[tuple[int, Any]]:
        data = received(data)  # Quokka's partition functions got what its executors get
        for channel in range(n):
            part = self.func(data, source, channel)
            if part is not None and (rows(part) if hasattr(part, "__len__") or isinstance(part, pa.Table) else 1):
                yield channel, to_transit(part)


@dataclass(frozen=True)
class AsMapping:
    """Quokka's later partition function: `f(data, source_channel, n_target_channels) -> {channel: data}`."""

    func: Callable[[Any, int, int], Mapping[int, Any]]

    def __call__(self, data: Any, source: int, n: int) -> Iterator[tuple[int, Any]]:
        parts = self.func(received(data), source, n)
        if not isinstance(parts, Mapping):
            raise TypeError(f"the partition function must return {{channel: data}}, got {type(parts).__name__}")
        for channel, part in parts.items():
            yield channel, to_transit(part)


@dataclass
class ByRatio:
    """Quokka's default partition between a source of `source_n` channels and a target of `target_n`."""

    source_n: int
    target_n: int
    _spread: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.source_n % self.target_n and self.target_n % self.source_n:
            raise GraphError(
                f"no default partition from {self.source_n} channels to {self.target_n}: one count must be a "
                "multiple of the other (as in Quokka); give a partition key for the stream"
            )

    def __call__(self, data: Any, source: int, n: int) -> Iterator[tuple[int, Any]]:
        # a file input read in one Spark stage with other inputs is told the index of its task in their
        # union, which may pass its own channel count: any channel is a right one for a default partition
        source %= self.source_n
        if self.source_n >= self.target_n:
            yield source // (self.source_n // self.target_n), data
            return
        ratio = self.target_n // self.source_n
        self._spread += 1  # in turn where Quokka picked at random: the same on a retried task
        yield source * ratio + self._spread % ratio, data


def router(key: Any, spring_form: bool) -> Router | None:
    """The Router of a Quokka partition key (None stays None: every channel gets the whole batch)."""
    if key is None:
        return None
    if isinstance(key, str):
        return Router(ByColumn(key))
    if callable(key):
        return Router(PerTarget(key) if spring_form else AsMapping(key))
    raise GraphError(f"a partition key must be None, a column name or a function, got {type(key).__name__}")
