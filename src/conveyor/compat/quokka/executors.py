"""Quokka's stock executors (its `sql` module of spring 2022, `executors` later), written anew from their behaviour.

Each takes Quokka's `execute(batches, stream_id, executor_id)` (a list of batches) and
`done(executor_id)`. The joins work on polars frames (Quokka's did: pandas and pyarrow frames are
converted); `AggExecutor` combines pandas frames by their index, as Quokka's did, so that partial
aggregates of a groupby add up.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pv

from ...graph.filesystems import bucket_path, file_system
from .frames import concat, is_polars, polars_module, rows, to_polars
from .sql_executors import JOIN_KINDS, BuildProbeJoinExecutor, SQLAggExecutor  # Quokka 2023's pyquokka.executors held them too


class Executor:
    """Quokka's executor base class: `execute(batches, stream_id, executor_id)`, `done(executor_id)`.

    Any object with those two methods is an executor on Conveyor (whatever its class); this one
    gives Quokka's defaults for the rest. `set_early_termination()` tells the runtime that this
    channel needs no more input.
    """

    def initialize(self, datasets: Any) -> None:
        """Quokka's hook for Datasets handed to a node (the compat refuses such Datasets: give them as streams)."""

    def serialize(self) -> Any:
        """Quokka's checkpoint hook: Spark retries a task from its inputs instead, so it is never called."""
        return None

    def deserialize(self, s: Any) -> None:
        """Quokka's restore hook: never called (see `serialize`)."""

    def set_early_termination(self) -> None:
        self.early_termination = True

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> Any:
        raise NotImplementedError

    def done(self, executor_id: int) -> Any:
        raise NotImplementedError


def _present(batches: Sequence[Any]) -> list[Any]:
    """The batches that hold rows."""
    return [b for b in batches if b is not None and rows(b) > 0]


class UDFExecutor(Executor):
    """`udf(batches concatenated)` for each call; nothing at the end."""

    def __init__(self, udf: Callable[[Any], Any]) -> None:
        self.udf = udf

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> Any:
        present = [b for b in batches if b is not None]
        return self.udf(concat(present)) if present else None

    def done(self, executor_id: int) -> None:
        return None


class StorageExecutor(Executor):
    """Passes its input on, concatenated (a blocking node of it stores a stream as a Dataset)."""

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> Any:
        present = _present(batches)
        return concat(present) if present else None

    def done(self, executor_id: int) -> None:
        return None


class OutputCSVExecutor(Executor):
    """Writes its input as CSV files `<prefix>-<executor_id>-<n>.csv` (no header) under `bucket`.

    `bucket` is a local directory, an `s3://` URL or an S3 bucket name, as for the inputs. A file
    is written once `output_line_limit` rows are held, and the rest at the end.
    """

    def __init__(self, bucket: str, prefix: str, output_line_limit: int = 1_000_000) -> None:
        self.bucket, self.prefix, self.output_line_limit = bucket, prefix, output_line_limit
        self.held: list[Any] = []
        self.written = 0

    def _write(self, executor_id: int) -> None:
        table = _to_arrow(concat(self.held))
        self.held = []
        target = bucket_path(self.bucket, f"{self.prefix}-{executor_id}-{self.written}.csv", "OutputCSVExecutor")
        where = file_system(target, s3=True)
        if where is None:
            raise ValueError(f"OutputCSVExecutor writes local directories and S3, not {target!r}")
        fs, path = where
        with fs.open_output_stream(path) as out:
            pv.write_csv(table, out, write_options=pv.WriteOptions(include_header=False))
        self.written += 1

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> None:
        self.held.extend(_present(batches))
        if sum(rows(b) for b in self.held) >= self.output_line_limit:
            self._write(executor_id)

    def done(self, executor_id: int) -> None:
        if self.held:
            self._write(executor_id)


def _to_arrow(frame: Any) -> pa.Table:
    if isinstance(frame, pa.Table):
        return frame
    if is_polars(frame):
        return frame.to_arrow()
    return pa.Table.from_pandas(frame, preserve_index=False)


def _keys(on: Any, left_on: Any, right_on: Any, who: str) -> tuple[Any, Any]:
    if on is not None:
        if left_on is not None or right_on is not None:
            raise ValueError(f"{who}: give on, or left_on and right_on, not both")
        return on, on
    if left_on is None or right_on is None:
        raise ValueError(f"{who}: give on, or both left_on and right_on")
    return left_on, right_on


def _finish(result: Any, columns: Sequence[str] | None, batch_func: Callable[[Any], Any] | None) -> Any:
    """A join's output as Quokka's joins gave it: projected, then through `batch_func` as pandas."""
    if result is None or len(result) == 0:
        return None
    if columns is not None:
        result = result.select(list(columns))
    return batch_func(result.to_pandas()) if batch_func is not None else result


class PolarJoinExecutor(Executor):
    """Inner equi-join of streams 0 (left) and 1 (right), symmetric: each batch joins what the other side holds.

    Output: polars, the left's columns then the right's (polars' naming), only `columns` if given;
    with `batch_func`, `batch_func(output as pandas)` instead.
    """

    def __init__(
        self,
        on: str | None = None,
        left_on: str | None = None,
        right_on: str | None = None,
        batch_func: Callable[[Any], Any] | None = None,
        columns: Sequence[str] | None = None,
        suffix: str = "_right",
    ) -> None:
        self.left_on, self.right_on = _keys(on, left_on, right_on, type(self).__name__)
        self.batch_func, self.columns, self.suffix = batch_func, columns, suffix
        self.state: dict[int, list[Any]] = {0: [], 1: []}

    def _side(self, side: int) -> Any:
        held = self.state[side]
        if len(held) > 1:  # one frame per side: each probe then hashes it once
            self.state[side] = held = [polars_module(type(self).__name__).concat(held, how="vertical_relaxed", rechunk=False)]
        return held[0] if held else None

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> Any:
        present = _present(batches)
        if not present:
            return None
        if stream_id not in (0, 1):
            raise ValueError(f"{type(self).__name__} joins streams 0 and 1, got stream {stream_id!r}")
        side = 0 if stream_id == 0 else 1
        batch = concat([to_polars(b, type(self).__name__) for b in present])
        other = self._side(1 - side)
        result = None
        if other is not None:
            if side == 0:
                result = batch.join(other, left_on=self.left_on, right_on=self.right_on, how="inner", suffix=self.suffix)
            else:
                result = other.join(batch, left_on=self.left_on, right_on=self.right_on, how="inner", suffix=self.suffix)
        self.state[side].append(batch)
        return _finish(result, self.columns, self.batch_func)

    def done(self, executor_id: int) -> None:
        return None


Polar3JoinExecutor = PolarJoinExecutor  # Quokka's variant of it without `columns`
JoinExecutor = PolarJoinExecutor  # its later name


class BroadcastJoinExecutor(Executor):
    """Join of every batch with a small table held by each channel (`small_on` = `big_on`).

    `how`: "inner" (the default), "left", "semi" or "anti", as polars joins (Quokka's of 2023 took
    it, by keyword here: its fifth argument is 2022's `batch_func`).
    """

    def __init__(
        self,
        small_table: Any,
        on: str | None = None,
        small_on: str | None = None,
        big_on: str | None = None,
        batch_func: Callable[[Any], Any] | None = None,
        columns: Sequence[str] | None = None,
        suffix: str = "_small",
        how: str = "inner",
    ) -> None:
        if how not in JOIN_KINDS:
            raise ValueError(f"BroadcastJoinExecutor: how must be one of {list(JOIN_KINDS)}, got {how!r}")
        self.how = how
        self.small_on, self.big_on = _keys(on, small_on, big_on, "BroadcastJoinExecutor")
        self.state = to_polars(small_table, "BroadcastJoinExecutor")
        if self.small_on not in self.state.columns:
            raise ValueError(
                f"BroadcastJoinExecutor: {self.small_on!r} is not a column of the small table ({self.state.columns})"
            )
        self.batch_func, self.columns, self.suffix = batch_func, columns, suffix

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> Any:
        present = _present(batches)
        if not present:
            return None
        batch = concat([to_polars(b, "BroadcastJoinExecutor") for b in present])
        result = batch.join(self.state, left_on=self.big_on, right_on=self.small_on, how=self.how, suffix=self.suffix)
        return _finish(result, self.columns, self.batch_func)

    def done(self, executor_id: int) -> None:
        return None


class OOCJoinExecutor(Executor):
    """Inner join of streams 0 and 1 in pandas whose held batches live on disk (an out-of-core join).

    Each batch is merged with every batch the other side holds (read back one at a time), then
    stored as a file; the output of a call is the list of the merges (suffixes `_a`, `_b`), or
    `batch_func(that list)`. `spill_dir` (default: the system's temporary directory) holds the files.
    """

    def __init__(
        self,
        on: str | None = None,
        left_on: str | None = None,
        right_on: str | None = None,
        left_primary: bool = False,
        right_primary: bool = False,
        batch_func: Callable[[list[pd.DataFrame]], Any] | None = None,
        spill_dir: str | None = None,
    ) -> None:
        self.left_on, self.right_on = _keys(on, left_on, right_on, "OOCJoinExecutor")
        self.batch_func, self.spill_dir = batch_func, spill_dir
        self.files: dict[int, list[str]] = {0: [], 1: []}
        self.directory: str | None = None

    def _held(self, side: int) -> Any:
        for path in self.files[side]:
            with open(path, "rb") as f:
                yield pickle.load(f)

    def _hold(self, side: int, batch: pd.DataFrame) -> None:
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="conveyor-ooc-join-", dir=self.spill_dir)
        path = os.path.join(self.directory, f"{side}-{len(self.files[side])}.pickle")
        with open(path, "wb") as f:
            pickle.dump(batch, f, protocol=pickle.HIGHEST_PROTOCOL)
        self.files[side].append(path)

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> Any:
        present = [b.to_pandas() if hasattr(b, "to_pandas") and not isinstance(b, pd.DataFrame) else b for b in _present(batches)]
        if not present:
            return None
        batch = pd.concat(present)
        side = 0 if stream_id == 0 else 1
        results = []
        for held in self._held(1 - side):
            left, right = (batch, held) if side == 0 else (held, batch)
            merged = left.merge(right, left_on=self.left_on, right_on=self.right_on, how="inner", suffixes=("_a", "_b"))
            if len(merged):
                results.append(merged)
        self._hold(side, batch)
        if not results:
            return None
        return self.batch_func(results) if self.batch_func is not None else results

    def done(self, executor_id: int) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


class AggExecutor(Executor):
    """Adds up pandas frames by their index (`DataFrame.add(fill_value=...)`), as Quokka's did; `final_func` at the end.

    Partial aggregates (a groupby's sums per key, one frame per batch) thereby combine into the
    total per key. Its output, at `done`, is the sum (or `final_func(sum)`).
    """

    def __init__(self, fill_value: Any = 0, final_func: Callable[[pd.DataFrame], Any] | None = None) -> None:
        self.fill_value, self.final_func = fill_value, final_func
        self.state: pd.DataFrame | None = None

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> None:
        for batch in batches:
            if batch is None:
                continue
            if not isinstance(batch, pd.DataFrame):
                raise TypeError(
                    f"AggExecutor adds pandas DataFrames by their index, got {type(batch).__name__} (as in Quokka: "
                    "return pandas, e.g. a groupby's result, from the batch function before it)"
                )
            self.state = batch if self.state is None else self.state.add(batch, fill_value=self.fill_value)

    def done(self, executor_id: int) -> Any:
        if self.final_func is not None:
            return self.final_func(self.state)
        return self.state


class LimitExecutor(Executor):
    """The first `limit` rows of the channel's input, at the end; asks for no more input once it has them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.state: list[Any] = []

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> None:
        self.state.extend(_present(batches))
        if sum(rows(b) for b in self.state) >= self.limit:
            self.set_early_termination()

    def done(self, executor_id: int | None = None) -> Any:
        if not self.state:
            return None
        return concat(self.state)[: self.limit]


class CountExecutor(Executor):
    """The number of input rows of the channel, as a one-row polars frame at the end (Quokka's shape)."""

    def __init__(self) -> None:
        self.state = 0

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> None:
        self.state += sum(rows(b) for b in batches)

    def done(self, executor_id: int) -> Any:
        return polars_module("CountExecutor").DataFrame([self.state])


class DistinctExecutor(Executor):
    """The rows not seen before on the channel (distinct on `keys`), emitted as they first arrive."""

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = list(keys)
        self.state: Any = None

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> Any:
        present = _present(batches)
        if not present:
            return None
        batch = concat([to_polars(b, "DistinctExecutor") for b in present]).unique(subset=self.keys, maintain_order=True)
        if self.state is not None:
            batch = batch.join(self.state, on=self.keys, how="anti")
        if len(batch) == 0:
            return None
        fresh = batch.select(self.keys)
        self.state = fresh if self.state is None else polars_module("DistinctExecutor").concat([self.state, fresh])
        return batch

    def done(self, executor_id: int) -> None:
        return None


class GroupAsOfJoinExecutor(Executor):
    """As-of join of stream 0 (left: trades) with stream 1 (right: quotes) per group, at the end.

    Each left row gets the last right row of its group whose `on` value is at most its own (polars'
    `join_asof`, backward); left rows with none are dropped, as Quokka's output had no such rows.
    """

    def __init__(
        self,
        group_on: str | None = None,
        group_left_on: str | None = None,
        group_right_on: str | None = None,
        on: str | None = None,
        left_on: str | None = None,
        right_on: str | None = None,
        batch_func: Callable[[Any], Any] | None = None,
        columns: Sequence[str] | None = None,
        suffix: str = "_right",
    ) -> None:
        self.group_left_on, self.group_right_on = _keys(group_on, group_left_on, group_right_on, "GroupAsOfJoinExecutor")
        self.left_on, self.right_on = _keys(on, left_on, right_on, "GroupAsOfJoinExecutor")
        self.batch_func, self.columns, self.suffix = batch_func, columns, suffix
        self.state: dict[int, list[Any]] = {0: [], 1: []}

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> None:
        side = 0 if stream_id == 0 else 1
        self.state[side].extend(to_polars(b, "GroupAsOfJoinExecutor") for b in _present(batches))

    def done(self, executor_id: int) -> Any:
        if not self.state[0] or not self.state[1]:
            return None
        left = concat(self.state[0]).sort(self.left_on)
        right = concat(self.state[1]).sort(self.right_on)
        result = left.join_asof(
            right,
            left_on=self.left_on,
            right_on=self.right_on,
            by_left=self.group_left_on,
            by_right=self.group_right_on,
            suffix=self.suffix,
            check_sortedness=False,  # sorted just above; polars cannot check it within groups
        )
        result = result.drop_nulls()
        return _finish(result, self.columns, self.batch_func)


__all__ = [
    "AggExecutor",
    "BroadcastJoinExecutor",
    "BuildProbeJoinExecutor",
    "CountExecutor",
    "DistinctExecutor",
    "Executor",
    "GroupAsOfJoinExecutor",
    "JoinExecutor",
    "LimitExecutor",
    "OOCJoinExecutor",
    "OutputCSVExecutor",
    "Polar3JoinExecutor",
    "PolarJoinExecutor",
    "SQLAggExecutor",
    "StorageExecutor",
    "UDFExecutor",
]
