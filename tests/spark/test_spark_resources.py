"""`resources=` of map, map_batches and SparkConsumerPool: checked before any work; local mode refused.

The consumers' placement under a task resource profile, and the addresses each is given, are
tested on a Spark standalone cluster whose workers declare GPUs (tests/test_multihost.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession

import conveyor.spark as cs
from conveyor.spark.resources import check_resources

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("resources", "error"),
    [
        ({}, "non-empty mapping"),
        ([("gpu", 1)], "non-empty mapping"),
        ({"gpu": 0}, "a fraction below 1"),
        ({"gpu": 1.5}, "a fraction below 1"),
        ({"gpu": "1"}, "a fraction below 1"),
        ({"gpu": True}, "a fraction below 1"),
        ({"cpus": 2}, "spark.task.cpus"),
        ({"g p u": 1}, "not a Spark resource name"),
    ],
)
def test_resources_are_checked(resources: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        check_resources("map", resources)


def test_amounts_are_fractions_or_whole_numbers() -> None:
    assert check_resources("map", {"gpu": 1, "fpga": 0.25, "tpu": 2.0}) == {"gpu": 1.0, "fpga": 0.25, "tpu": 2.0}
    assert check_resources("map", None) == {}


def test_local_mode_is_refused_before_any_work(spark: SparkSession) -> None:
    df = spark.range(4)
    with pytest.raises(ValueError, match=r"map: resources=\{'gpu': 1.0\} needs a Spark cluster"):
        cs.map(df, lambda r: r["id"], schema="y long", resources={"gpu": 1}, progress=False)
    with pytest.raises(ValueError, match="map_batches: resources"):
        cs.map_batches(df, lambda b: b, schema="id long", resources={"gpu": -1}, progress=False)
    with pytest.raises(ValueError, match=r"SparkConsumerPool: resources=.* needs a Spark cluster"):
        cs.SparkConsumerPool(spark, resources={"gpu": 1})


def test_task_resources_is_empty_outside_a_consumer() -> None:
    assert cs.task_resources() == {}
