"""The batches Quokka's programs pass around (pyarrow, polars and pandas frames), as Quokka handled them.

Quokka's readers produced pyarrow Tables, its runtime turned a pushed Table into a polars DataFrame,
and its executors took lists of pandas or polars frames. Between nodes a polars frame travels as a
pyarrow Table (Arrow IPC: several times cheaper than pickling it) and every Table arrives as polars,
which is what Quokka's consumers saw. polars is imported only when a frame of it is needed; without
it, Tables stay Tables.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pandas as pd
import pyarrow as pa


def polars_module(what: str) -> ModuleType:
    """polars, or an ImportError that says who needs it and how to install it."""
    try:
        return importlib.import_module("polars")
    except ImportError:
        raise ImportError(f"{what} needs polars, as Quokka's did: pip install 'conveyor[quokka]' (or polars)") from None


def to_transit(value: Any) -> Any:
    """A value a reader or executor sends on, as it travels: a polars frame as a pyarrow Table."""
    return value.to_arrow() if is_polars(value) else value


def received(value: Any) -> Any:
    """A value as Quokka's consumers got it: a pyarrow Table (pushed as one, or polars in transit) as polars."""
    if isinstance(value, pa.Table):
        try:
            pl = importlib.import_module("polars")
        except ImportError:
            return value
        return pl.from_arrow(value)
    return value


def is_polars(value: Any) -> bool:
    """Whether `value` is a polars DataFrame (without importing polars when it is not loaded)."""
    return type(value).__module__.startswith("polars") and hasattr(value, "to_arrow")


def concat(batches: Sequence[Any]) -> Any:
    """Batches of one kind as one: polars, pandas or pyarrow frames."""
    first = batches[0]
    if len(batches) == 1:
        return first
    if is_polars(first):
        return polars_module("concatenating polars frames").concat(list(batches), how="vertical_relaxed")
    if isinstance(first, pa.Table):
        return pa.concat_tables(batches, promote_options="permissive")
    return pd.concat(batches)


def to_polars(value: Any, what: str) -> Any:
    """A pandas, pyarrow or polars frame as polars (the frames Quokka's polars executors worked on)."""
    pl = polars_module(what)
    if is_polars(value):
        return value
    if isinstance(value, pd.DataFrame):
        return pl.from_pandas(value)
    if isinstance(value, pa.Table | pa.RecordBatch):
        return pl.from_arrow(value)
    raise TypeError(f"{what} takes pandas, pyarrow or polars frames, got {type(value).__name__}")


def rows(value: Any) -> int:
    """The length of a batch (0 for None)."""
    if value is None:
        return 0
    if isinstance(value, pa.Table | pa.RecordBatch):
        return int(value.num_rows)
    return len(value)
