"""Helpers of the TaskGraph tests: DuckDB over the TPC-H files, and loading the examples."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import duckdb
import numpy as np
import pandas as pd
from examples.tpch import QUERIES, TABLES, duckdb_columns

ROOT = Path(__file__).resolve().parents[2]


def example(name: str) -> ModuleType:
    """A script of examples/ imported as a module (with examples/ on sys.path: it imports `tpch` by name, as a script does)."""
    if str(ROOT / "examples") not in sys.path:
        sys.path.append(str(ROOT / "examples"))
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def duckdb_answer(query: str, data_dir: Path) -> pd.DataFrame:
    """The standard SQL of a TPC-H query, run by DuckDB over the same .tbl files."""
    con = duckdb.connect()
    for table in TABLES:
        path = data_dir / f"{table}.tbl"
        if path.exists():
            con.execute(
                f"create view {table} as select * from read_csv('{path}', delim='|', header=false, "
                f"columns={duckdb_columns(table)})"
            )
    return con.execute(QUERIES[query]).df()


def assert_frames_close(ours: pd.DataFrame, expected: pd.DataFrame, rtol: float = 1e-9) -> None:
    """Same columns, same rows in the same order; floats equal within `rtol` (sums in another order)."""
    assert list(ours.columns) == list(expected.columns), (list(ours.columns), list(expected.columns))
    assert len(ours) == len(expected), (len(ours), len(expected))
    for col in expected.columns:
        a, b = ours[col].to_numpy(), expected[col].to_numpy()
        if np.issubdtype(b.dtype, np.number) and not np.issubdtype(b.dtype, np.bool_):
            assert np.allclose(a.astype(float), b.astype(float), rtol=rtol, atol=0), (col, a, b)
        else:
            assert [str(x)[:10] for x in a] == [str(x)[:10] for x in b], (col, a, b)
