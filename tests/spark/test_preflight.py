"""The pre-flight on a real local[2] Spark: what every executor can import and reach, one error naming each host and what to do.

(On the multi-host bed: tests/test_multihost.py.)
"""

from __future__ import annotations

import time

import pytest
from pyspark.sql import SparkSession

from conveyor.client.pool import QueuePool
from conveyor.errors import ConveyorError, PreflightError
from conveyor.spark.cluster import driver_host, is_local
from conveyor.spark.preflight import preflight

pytestmark = pytest.mark.timeout(120)


def test_a_healthy_executor_passes_quickly_and_the_pass_is_remembered(spark: SparkSession) -> None:
    with QueuePool.local(n_servers=2, tls=True) as pool:
        t = time.monotonic()
        preflight(spark, pool.queues, ["json", "tests.support.worker_tasks"])
        took = time.monotonic() - t
        t = time.monotonic()
        preflight(spark, pool.queues, ["json", "tests.support.worker_tasks"])
        assert time.monotonic() - t < 0.05, "a passed check is remembered"
    assert took < 10, f"the pre-flight took {took:.1f} s"


def test_a_missing_task_module_and_a_server_down_are_named_in_one_error(spark: SparkSession) -> None:
    pool = QueuePool.local(n_servers=2)
    address = pool.addresses[1]
    pool.servers.processes[1].kill()  # server 1 gone for good
    pool.servers.processes[1].wait(10)
    try:
        with pytest.raises(PreflightError) as e:
            preflight(spark, pool.queues, ["no_such_tasks_module"])
    finally:
        pool.close()
    [(host, problems)] = e.value.problems.items()  # local[2]: one host, the problems of its tasks once each
    text = "; ".join(problems)
    assert "'no_such_tasks_module' is not importable" in text and "ModuleNotFoundError" in text
    assert f"queue server {address} does not answer" in text and pool.addresses[0] not in text
    assert "(127.0.0.1)" in host, host
    message = str(e.value)
    assert "1 of 1 executor host(s)" in message and "sc.addPyFile" in message and "firewalls" in message


def test_an_import_error_of_several_lines_is_reported_on_one(spark: SparkSession) -> None:
    with QueuePool.local(n_servers=1) as pool, pytest.raises(PreflightError) as e:
        preflight(spark, pool.queues, ["tests.support.preflight_multiline"])
    [problems] = e.value.problems.values()
    assert problems == [
        "task module 'tests.support.preflight_multiline' is not importable (ImportError: Importing the "
        f"C-extensions failed. Here is how to debug it: see the docs) [python {problems[0].split('[python ')[1]}"
    ]


def test_where_servers_beside_the_driver_would_listen(spark: SparkSession) -> None:
    assert is_local(spark) and driver_host(spark) == "127.0.0.1"
    assert driver_host(spark, host="10.1.2.3") == "10.1.2.3"
    assert driver_host(spark, interface="lo") == "127.0.0.1"
    with pytest.raises(ConveyorError, match="network interface 'no-such-if0' has no IPv4 address here; these do: lo"):
        driver_host(spark, interface="no-such-if0")
    with pytest.raises(ValueError, match="not both"):
        driver_host(spark, host="10.1.2.3", interface="lo")
