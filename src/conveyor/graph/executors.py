"""Executors: the per-channel operators of a TaskGraph, and the stock ones.

The runtime makes one executor per channel (a deep copy of the one given to the node, or a call
of the class or factory given). It calls `execute(batch, stream_id, channel)` for each input batch
in order, then `done(channel)` once. Input batches are always `pyarrow.Table`s; outputs may be a
Table, a RecordBatch, a pandas DataFrame or None (nothing to emit). An executor that needs no more
input calls `self.finish()`: the runtime stops feeding it (and, where the input is read inside the
same Spark task, stops reading) and calls `done`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from .channels import Batch
from .join import JoinSide, combine


class Executor:
    """Base class of executors. Subclasses override `execute` and usually `done`."""

    # True when the executor may call `finish()` before its input ends. The planner then reads a
    # single-channel node's file inputs inside the node's own Spark task, so stopping stops the read.
    may_stop_early: ClassVar[bool] = False
    # what `execute` gets: "arrow" (pyarrow Tables) or "pandas" (pandas DataFrames, as Quokka's executors do)
    batch_format: ClassVar[str] = "arrow"

    def execute(self, batch: pa.Table, stream_id: Hashable, channel: int) -> Batch | None:
        """Consume one input batch of stream `stream_id`; return an output batch or None."""
        raise NotImplementedError

    def done(self, channel: int) -> Batch | None:
        """The input of this channel has ended (or the executor finished): return a last batch or None."""
        return None

    def finish(self) -> None:
        """Declare that no more input is needed."""
        self._conveyor_finished = True

    def early_termination(self) -> None:
        """Quokka's name for `finish()` (`set_early_termination` in some of its versions)."""
        self.finish()

    set_early_termination = early_termination

    @property
    def finished(self) -> bool:
        # Quokka's own base class set the attribute `early_termination = True`: executors written for it may too
        return getattr(self, "_conveyor_finished", False) or vars(self).get("early_termination") is True


class StatelessExecutor(Executor):
    """Quokka's executor base class.

    `execute(batch, stream_id, executor_id)` gets pandas DataFrames and may return a DataFrame, a
    pyarrow Table, a list of them, or None; `done(executor_id)` likewise; `early_termination()`
    stops the input. A DataFrame's named index (a groupby's keys) is kept as columns of the output.
    """

    batch_format: ClassVar[str] = "pandas"


class FilterProject(Executor):
    """Keep the rows matching `predicate`, then compute `columns` (names, or name -> Expression)."""

    def __init__(self, predicate: pc.Expression | None = None, columns: Sequence[str] | Mapping[str, Any] | None = None) -> None:
        self.predicate = predicate
        self.columns = dict(columns) if isinstance(columns, Mapping) else list(columns) if columns is not None else None

    def execute(self, batch: pa.Table, stream_id: Hashable, channel: int) -> pa.Table:
        if isinstance(self.columns, dict):
            cols = {k: pc.field(v) if isinstance(v, str) else v for k, v in self.columns.items()}
            return ds.dataset(batch).to_table(columns=cols, filter=self.predicate)
        if self.predicate is not None:
            batch = batch.filter(self.predicate)
        return batch.select(self.columns) if self.columns is not None else batch


class Map(Executor):
    """Apply `func(batch)` (or `func(batch, stream_id)` with `with_stream=True`) to each batch."""

    def __init__(self, func: Callable[..., Batch | None], with_stream: bool = False) -> None:
        self.func = func
        self.with_stream = with_stream

    def execute(self, batch: pa.Table, stream_id: Hashable, channel: int) -> Batch | None:
        return self.func(batch, stream_id) if self.with_stream else self.func(batch)


class Count(Executor):
    """The number of input rows of the channel, as one row `{column: n}` at the end."""

    def __init__(self, column: str = "count") -> None:
        self.column = column
        self.rows = 0

    def execute(self, batch: pa.Table, stream_id: Hashable, channel: int) -> None:
        self.rows += batch.num_rows

    def done(self, channel: int) -> pa.Table:
        return pa.table({self.column: pa.array([self.rows], pa.int64())})


class Limit(Executor):
    """The first `n` rows of the channel's input (in input order), then stop reading."""

    may_stop_early = True

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"Limit needs n >= 0, got {n}")
        self.n = n
        self.left = n
        if n == 0:
            self.finish()

    def execute(self, batch: pa.Table, stream_id: Hashable, channel: int) -> pa.Table | None:
        out = batch.slice(0, self.left)
        self.left -= out.num_rows
        if self.left <= 0:
            self.finish()
        return out if out.num_rows else None


SortKey = tuple[str, str]


def sort_keys(by: str | Sequence[str | SortKey]) -> list[SortKey]:
    """Sort keys as (column, "ascending" | "descending")."""
    items = [by] if isinstance(by, str) else list(by)
    out = []
    for item in items:
        name, order = (item, "ascending") if isinstance(item, str) else item
        if order not in ("ascending", "descending"):
            raise ValueError(f"sort order of {name!r} must be 'ascending' or 'descending', got {order!r}")
        out.append((name, order))
    return out


class Sort(Executor):
    """All input rows of the channel sorted by `by` at the end (blocking), optionally only the first `limit`."""

    def __init__(self, by: str | Sequence[str | SortKey], limit: int | None = None) -> None:
        self.by = sort_keys(by)
        self.limit = limit
        self.batches: list[pa.Table] = []

    def execute(self, batch: pa.Table, stream_id: Hashable, channel: int) -> None:
        self.batches.append(batch)
        if self.limit is not None and sum(b.num_rows for b in self.batches) > 4 * self.limit + 65536:
            self.batches = [self._sorted()]  # keep only a top-k's worth of rows

    def _sorted(self) -> pa.Table:
        table = pa.concat_tables(self.batches, promote_options="permissive")
        if self.limit is not None and self.limit < table.num_rows:
            return table.take(pc.select_k_unstable(table, self.limit, self.by)).sort_by(self.by)
        return table.sort_by(self.by)

    def done(self, channel: int) -> pa.Table | None:
        return self._sorted() if self.batches else None


class HashJoin(Executor):
    """Inner equi-join of two streams, as a streaming hash join.

    Without `build`, both sides are stored as they arrive (symmetric): a batch is joined with what
    the other side has stored so far, then stored itself, so every matching pair is emitted once
    whatever the arrival order. With `build=<stream id>`, that stream must arrive completely before
    the other (list its input node in the probe input's `dependents`): probe batches are then
    joined and dropped, never stored. Output: the left stream's columns, then the right's (a name
    already taken gets `suffix`).
    """

    def __init__(
        self,
        left_on: str | Sequence[str],
        right_on: str | Sequence[str] | None = None,
        *,
        left_stream: Hashable = 0,
        right_stream: Hashable = 1,
        build: Hashable | None = None,
        suffix: str = "_right",
    ) -> None:
        self.left_on = (left_on,) if isinstance(left_on, str) else tuple(left_on)
        right = left_on if right_on is None else right_on
        self.right_on = (right,) if isinstance(right, str) else tuple(right)
        if len(self.left_on) != len(self.right_on):
            raise ValueError(f"HashJoin: {len(self.left_on)} left keys but {len(self.right_on)} right keys")
        if build is not None and build not in (left_stream, right_stream):
            raise ValueError(f"HashJoin: build={build!r} is neither stream {left_stream!r} nor {right_stream!r}")
        self.streams = (left_stream, right_stream)
        self.build = build
        self.suffix = suffix
        self.sides = (JoinSide(self.left_on), JoinSide(self.right_on))
        self.probing = False

    def execute(self, batch: pa.Table, stream_id: Hashable, channel: int) -> pa.Table | None:
        if stream_id not in self.streams:
            raise ValueError(f"HashJoin: unexpected stream {stream_id!r} (streams are {self.streams})")
        me = self.streams.index(stream_id)
        other = 1 - me
        if self.build is not None:
            if stream_id == self.build:
                if self.probing:
                    raise ValueError(
                        f"HashJoin(build={self.build!r}): a build batch arrived after the probe side started "
                        f"on channel {channel}; list the build input in the probe input's dependents"
                    )
                self.sides[me].add(batch)
                return None
            if not self.probing:
                self.probing = True
                self.sides[other].compact()
            return self._join(batch, me)
        out = self._join(batch, me)
        self.sides[me].add(batch)
        return out

    def _join(self, batch: pa.Table, me: int) -> pa.Table | None:
        keys = self.left_on if me == 0 else self.right_on
        parts = []
        for stored, mine, theirs in self.sides[1 - me].matches(batch, keys):
            if me == 0:
                parts.append(combine(batch, mine, stored, theirs, self.suffix))
            else:
                parts.append(combine(stored, theirs, batch, mine, self.suffix))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")


AGGREGATES = ("sum", "count", "mean", "min", "max")


def _named(grouped: pa.Table, keys: list[str], aggregates: list[str]) -> pa.Table:
    """A group_by result renamed to keys + aggregates (pyarrow puts the keys first since 14, last before)."""
    if keys and grouped.column_names[: len(keys)] == keys:
        return grouped.rename_columns(keys + aggregates)
    return grouped.rename_columns(aggregates + keys).select(keys + aggregates)


class HashAggregate(Executor):
    """Group the channel's rows by `by` and aggregate (blocking: the groups come out at the end).

    `aggs` maps each output column to `(function, column)`, function one of sum, count, mean, min,
    max; `("count", None)` counts rows. Batches are pre-aggregated as they arrive, so the state is
    one row per group. With no `by`, the output is one row even for no input (as SQL does).
    """

    def __init__(self, by: str | Sequence[str] = (), aggs: Mapping[str, tuple[str, str | None]] | None = None) -> None:
        self.by = [by] if isinstance(by, str) else list(by)
        self.aggs = dict(aggs or {})
        if not self.aggs and not self.by:
            raise ValueError("HashAggregate needs `by` columns or `aggs`")
        for out, (func, col) in self.aggs.items():
            if func not in AGGREGATES:
                raise ValueError(f"HashAggregate: {out!r} uses {func!r}; expected one of {AGGREGATES}")
            if col is None and func != "count":
                raise ValueError(f"HashAggregate: {out!r}: only count takes no column")
        self.partials: list[pa.Table] = []
        self.partial_rows = 0

    def _partial_specs(self) -> list[tuple[str | list[str], str, str]]:
        """(input column(s), pyarrow function, partial column name) of the partial aggregates."""
        specs: list[tuple[str | list[str], str, str]] = []
        for i, (func, col) in enumerate(self.aggs.values()):
            if col is None:
                specs.append(([], "count_all", f"p{i}_n"))
                continue
            if func in ("sum", "mean"):
                specs.append((col, "sum", f"p{i}_s"))
            if func in ("count", "mean"):
                specs.append((col, "count", f"p{i}_n"))
            if func in ("min", "max"):
                specs.append((col, func, f"p{i}_m"))
        return specs

    def execute(self, batch: pa.Table, stream_id: Hashable, channel: int) -> None:
        specs = self._partial_specs()
        missing = [c for c in self.by + [s[0] for s in specs if s[0]] if c not in batch.column_names]
        if missing:
            raise KeyError(f"HashAggregate: columns {missing} are not in the batch (columns: {batch.column_names})")
        part = batch.group_by(self.by, use_threads=False).aggregate([(c, f) for c, f, _ in specs])
        self.partials.append(_named(part, self.by, [name for *_, name in specs]))
        self.partial_rows += part.num_rows
        if len(self.partials) > 64 or self.partial_rows > 1_000_000:
            self.partials = [self._combine()]
            self.partial_rows = self.partials[0].num_rows

    def _combine(self) -> pa.Table:
        """The partials merged into one partial table."""
        table = pa.concat_tables(self.partials, promote_options="permissive")
        merge = []
        for _, func, name in self._partial_specs():
            merge.append((name, {"sum": "sum", "count": "sum", "count_all": "sum", "min": "min", "max": "max"}[func]))
        out = table.group_by(self.by, use_threads=False).aggregate(merge)
        return _named(out, self.by, [name for name, _ in merge])

    def done(self, channel: int) -> pa.Table | None:
        if not self.partials:
            if self.by:
                return None
            return pa.table(
                {
                    out: pa.array([0 if func == "count" else None], pa.int64() if func == "count" else pa.float64())
                    for out, (func, _) in self.aggs.items()
                }
            )
        part = self._combine()
        columns = {b: part.column(b) for b in self.by}
        for i, (out, (func, _col)) in enumerate(self.aggs.items()):
            if func in ("sum", "min", "max"):
                columns[out] = part.column(f"p{i}_{'s' if func == 'sum' else 'm'}")
            elif func == "count":
                columns[out] = part.column(f"p{i}_n")
            else:
                total, n = pc.cast(part.column(f"p{i}_s"), pa.float64()), pc.cast(part.column(f"p{i}_n"), pa.float64())
                columns[out] = pc.if_else(pc.equal(n, 0), None, pc.divide(total, n))  # no values: null, as SQL
        return pa.table(columns)
