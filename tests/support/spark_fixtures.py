"""Shared Spark fixtures (a pytest plugin, registered in conftest.py).

`spark`: one local[2] session for the whole test run (starting one costs ~10 s). `tpch_sf001`:
TPC-H at scale factor 0.01 generated once per run with tpchgen-cli (.tbl files).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from examples.tpch import generate
from pyspark.sql import SparkSession

from conveyor.spark.session import get_or_create_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # local[2, 4]: a failed task is retried, as on a cluster (tests kill Python workers on purpose)
    session = get_or_create_session("local[2,4]", app_name="conveyor-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def tpch_sf001(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(0.01, tmp_path_factory.mktemp("tpch-sf0.01"))
