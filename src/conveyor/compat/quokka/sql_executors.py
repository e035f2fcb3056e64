"""Quokka's SQL executors of 2023 (`SQLAggExecutor`, `BuildProbeJoinExecutor`), written anew from their behaviour.

Its graph-API TPC-H tutorials join with `BuildProbeJoinExecutor` and aggregate with
`SQLAggExecutor`. Both take Quokka's `execute(batches, stream_id, executor_id)` (a list of
pyarrow Tables, as the compat's 2023 form hands them; polars and pandas frames are taken too) and
`done(executor_id)`, and emit polars frames, as Quokka's did:

- `SQLAggExecutor(groupby_keys, orderby_keys, sql_statement)` gathers every batch and at `done`
  runs `SELECT <keys>, <sql_statement> FROM <the batches> GROUP BY <keys> ORDER BY <orderby_keys>`
  in DuckDB, as Quokka did (no output when no batch arrived);
- `BuildProbeJoinExecutor(on | left_on, right_on, how, key_to_keep)` builds from stream 1 and
  probes with stream 0, as Quokka did: a probe batch is joined as it arrives once the build side
  has rows; probe batches that come before any build row are held and joined at the next probe
  batch or at `done`. Quokka's graphs give the build side a lower `stage=`, so it is read to its
  end first; a build batch after probing began would have missed the probe rows joined before it,
  so it is an error naming the remedy.

Bad arguments are a `ValueError` naming the problem when the executor is made (an unknown `how`, a
statement DuckDB cannot parse), or when the batches show it (a key column missing, a statement
DuckDB rejects over the columns given).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Hashable
from typing import Any

import pandas as pd
import pyarrow as pa

from .frames import is_polars, polars_module, rows, to_polars

JOIN_KINDS = ("inner", "left", "semi", "anti")
KEYS_KEPT = ("left", "right")
DIRECTIONS = ("asc", "desc")
BUILD_STREAM = 1  # Quokka's BuildProbeJoinExecutor: stream 1 builds, stream 0 probes
PROBE_STREAM = 0
TABLE_NAME = "batch_arrow"  # the name Quokka's statements were run against


def _duckdb(what: str) -> Any:
    """DuckDB, or an ImportError that says who needs it and how to install it."""
    try:
        return importlib.import_module("duckdb")
    except ImportError:
        raise ImportError(f"{what} needs duckdb, as Quokka's did: pip install 'conveyor[quokka]' (or duckdb)") from None


_databases: dict[int, Any] = {}  # by process id: one in-memory database per process


def _cursor(what: str) -> Any:
    """A connection of its own to this process's in-memory DuckDB database (close it after use).

    Opening a database costs ~10 ms, a tenth of a small query's time; a cursor of an open one
    costs next to nothing, and what is registered on it is seen by it alone. Keyed by process,
    as a database opened before a fork is not to be used in the child.
    """
    pid = os.getpid()
    if pid not in _databases:
        _databases.clear()
        _databases[pid] = _duckdb(what).connect()
    return _databases[pid].cursor()


def _as_arrow(batch: Any, what: str) -> pa.Table:
    """A pyarrow, polars or pandas frame as a pyarrow Table."""
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    if is_polars(batch):
        table: pa.Table = batch.to_arrow()
        return table
    if isinstance(batch, pd.DataFrame):
        return pa.Table.from_pandas(batch, preserve_index=False)
    raise TypeError(f"{what} takes pyarrow, polars or pandas frames, got {type(batch).__name__}")


def _names(value: Any, what: str) -> list[str]:
    """A column name or a list of them, as a list; anything else is an error naming `what`."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{what} must be a column name or a list of them, got {value!r}")
    return list(names)


class SQLAggExecutor:
    """Quokka's SQL aggregation: every batch gathered, then one DuckDB query at `done`.

    `groupby_keys`: a list of column names (empty: one row over everything). `orderby_keys`: None
    or a list of `(column, "asc" | "desc")`, columns of the output (keys or the statement's
    aliases). `sql_statement`: the select list after the keys, e.g. `"sum(revenue) as revenue"`.
    Keys go into the query as written, as Quokka put them (DuckDB matches names whatever their case).
    """

    def __init__(self, groupby_keys: list[str], orderby_keys: list[tuple[str, str]] | None, sql_statement: str) -> None:
        if not isinstance(groupby_keys, list) or not all(isinstance(k, str) and k for k in groupby_keys):
            raise ValueError(f"SQLAggExecutor: groupby_keys must be a list of column names, got {groupby_keys!r}")
        if orderby_keys is not None and not isinstance(orderby_keys, list):
            raise ValueError(f"SQLAggExecutor: orderby_keys must be None or a list of (column, direction), got {orderby_keys!r}")
        order = []
        for item in orderby_keys or []:
            if not (isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str) and item[0]):
                raise ValueError(f"SQLAggExecutor: each orderby key must be (column, 'asc' | 'desc'), got {item!r}")
            if not isinstance(item[1], str) or item[1].lower() not in DIRECTIONS:
                raise ValueError(f"SQLAggExecutor: each orderby key must be (column, 'asc' | 'desc'), got {item!r}")
            order.append(f"{item[0]} {item[1].lower()}")
        if not isinstance(sql_statement, str) or not sql_statement.strip():
            raise ValueError(f"SQLAggExecutor: sql_statement must be the aggregates to select, got {sql_statement!r}")
        self.groupby_keys = list(groupby_keys)
        self.orderby_keys = [tuple(item) for item in orderby_keys or []]
        self.sql_statement = sql_statement
        keys = ", ".join(groupby_keys)
        query = f"SELECT {keys + ', ' if keys else ''}{sql_statement} FROM {TABLE_NAME}"
        if keys:
            query += f" GROUP BY {keys}"
        if order:
            query += " ORDER BY " + ", ".join(order)
        self.query = query
        duckdb = _duckdb("SQLAggExecutor")
        con = _cursor("SQLAggExecutor")
        try:
            con.extract_statements(query)  # a statement that does not parse fails here, before any work
        except duckdb.Error as exc:
            raise ValueError(f"SQLAggExecutor: DuckDB cannot parse the statement {sql_statement!r} ({query}): {exc}") from exc
        finally:
            con.close()
        self.batches: list[pa.Table] = []

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> None:
        """Gather the batches; the aggregate is computed at `done`."""
        self.batches.extend(_as_arrow(b, "SQLAggExecutor") for b in batches if b is not None and rows(b) > 0)

    def done(self, executor_id: int) -> Any:
        """The aggregate of everything gathered, as a polars frame (None when nothing arrived)."""
        if not self.batches:
            return None
        table = pa.concat_tables(self.batches, promote_options="permissive")
        names = {c.lower() for c in table.column_names}
        missing = [k for k in self.groupby_keys if k.isidentifier() and k.lower() not in names]
        if missing:
            raise ValueError(f"SQLAggExecutor: group-by keys {missing} are not columns of its input ({table.column_names})")
        duckdb = _duckdb("SQLAggExecutor")
        con = _cursor("SQLAggExecutor")
        try:
            con.register(TABLE_NAME, table)
            result = con.sql(self.query).to_arrow_table()
        except duckdb.Error as exc:
            raise ValueError(
                f"SQLAggExecutor: DuckDB rejects {self.query!r} over the columns {table.column_names}: {exc}"
            ) from exc
        finally:
            con.close()
        self.batches = []
        return polars_module("SQLAggExecutor").from_arrow(result)


class BuildProbeJoinExecutor:
    """Quokka's build-probe join: builds a table from stream 1, joins each batch of stream 0 with it.

    `on` (one name for both sides) or `left_on` (stream 0's key) and `right_on` (stream 1's): a
    column name or a list of them. `how`: "inner", "left", "semi" or "anti", polars' joins, the
    probe side on the left. The output has the probe side's key column (named `left_on`, or
    `right_on` with `key_to_keep="right"`), its other columns and, for inner and left joins, the
    build side's other columns. A left or anti join whose build side sent this channel nothing
    emits the probe rows as they are (the build side's columns are unknown then; Quokka's left
    join dropped them); batches without some columns others have join with nulls there.
    """

    def __init__(
        self,
        on: Any = None,
        left_on: Any = None,
        right_on: Any = None,
        how: str = "inner",
        key_to_keep: str = "left",
    ) -> None:
        if on is not None:
            if left_on is not None or right_on is not None:
                raise ValueError("BuildProbeJoinExecutor: give on, or left_on and right_on, not both")
            left_on = right_on = on
        elif left_on is None or right_on is None:
            raise ValueError("BuildProbeJoinExecutor: give on, or both left_on and right_on")
        self.left_on = _names(left_on, "BuildProbeJoinExecutor: left_on")
        self.right_on = _names(right_on, "BuildProbeJoinExecutor: right_on")
        if len(self.left_on) != len(self.right_on):
            raise ValueError(f"BuildProbeJoinExecutor: left_on {self.left_on} and right_on {self.right_on} differ in length")
        if how not in JOIN_KINDS:
            raise ValueError(f"BuildProbeJoinExecutor: how must be one of {list(JOIN_KINDS)}, got {how!r}")
        if key_to_keep not in KEYS_KEPT:
            raise ValueError(f"BuildProbeJoinExecutor: key_to_keep must be 'left' or 'right', got {key_to_keep!r}")
        polars_module("BuildProbeJoinExecutor")
        self.how = how
        self.key_to_keep = key_to_keep
        self.build: list[Any] = []  # polars frames of stream 1
        self.table: Any = None  # the build side as one frame, made at the first probe
        self.held: list[Any] = []  # probe frames that came before any build row

    def _frames(self, batches: list[Any]) -> list[Any]:
        return [to_polars(b, "BuildProbeJoinExecutor") for b in batches if b is not None and rows(b) > 0]

    def _check(self, frame: Any, keys: list[str], side: str) -> None:
        missing = [k for k in keys if k not in frame.columns]
        if missing:
            raise ValueError(f"BuildProbeJoinExecutor: the {side} side has no key column {missing} (columns: {frame.columns})")

    def execute(self, batches: list[Any], stream_id: Hashable, executor_id: int) -> Any:
        """Build from stream 1; join stream 0's batches as soon as the build side has rows."""
        frames = self._frames(batches)
        if stream_id == BUILD_STREAM:
            if self.table is not None and frames:
                raise ValueError(
                    "BuildProbeJoinExecutor: a build-side batch (stream 1) arrived after probe batches were joined: "
                    "give stream 1's input a lower stage= than stream 0's, so it is read to its end first"
                )
            for frame in frames:
                self._check(frame, self.right_on, "build (stream 1)")
            self.build.extend(frames)
            return None
        if stream_id != PROBE_STREAM:
            raise ValueError(f"BuildProbeJoinExecutor: streams are 0 (probe) and 1 (build), got stream {stream_id!r}")
        for frame in frames:
            self._check(frame, self.left_on, "probe (stream 0)")
        if self.table is None and not self.build:
            self.held.extend(frames)
            return None
        return self._probe([*self.held, *frames])

    def done(self, executor_id: int) -> Any:
        """The held probe batches joined, now that the build side is whole."""
        return self._probe(self.held)

    def _probe(self, frames: list[Any]) -> Any:
        """`frames` joined with the build side (which is whole by now); the held frames are then done with."""
        if not frames:
            return None
        pl = polars_module("BuildProbeJoinExecutor")
        # diagonal: a left join upstream whose build side sent its channel nothing emits its probe
        # rows without the build side's columns, beside batches that have them (nulls there)
        probe = pl.concat(frames, how="diagonal_relaxed")
        table = self.table
        if table is None and self.build:
            table = pl.concat(self.build, how="diagonal_relaxed")
        if table is None:  # the build side sent this channel nothing
            result = probe if self.how in ("left", "anti") else None
        else:
            try:
                result = probe.join(table, left_on=self.left_on, right_on=self.right_on, how=self.how, coalesce=True)
            except pl.exceptions.PolarsError as exc:
                raise ValueError(
                    f"BuildProbeJoinExecutor: joining {self.left_on} with {self.right_on} ({self.how}) failed: {exc}"
                ) from exc
            self.table, self.build = table, []
        self.held = []
        if result is None or result.height == 0:
            return None
        if self.key_to_keep == "right":
            result = result.rename({a: b for a, b in zip(self.left_on, self.right_on, strict=True) if a != b})
        return result


__all__ = ["BuildProbeJoinExecutor", "SQLAggExecutor"]
