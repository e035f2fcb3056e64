"""The examples are scripts: each answers --help; and the TaskGraph API loads lazily.

The examples' graphs are run by the TPC-H and PageRank tests.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.graph_helpers import ROOT


@pytest.mark.parametrize("name", ["tpch_q6", "tpch_q12", "pagerank"])
def test_example_help(name: str) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py"), "--help"], capture_output=True, text=True, timeout=120, check=True
    )
    assert "usage:" in out.stdout and "--parallelism" in out.stdout


def test_import_conveyor_does_not_import_pyspark() -> None:
    code = (
        "import sys, conveyor; assert 'pyspark' not in sys.modules and 'pyarrow' not in sys.modules; "
        "conveyor.TaskGraph, conveyor.Executor, conveyor.Dataset; "
        "assert 'pyspark' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "ok"
