"""Conveyor through Spark Connect.

A Connect server started from the pyspark installation, a client session in a process of its own
(tests/support/connect_job.py), and map, SparkConsumerPool and a TaskGraph run through it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.find_spark_home import _find_spark_home

from tests.support.connect_job import CSV_ROWS, FAILING, ROWS, TASKS
from tests.support.graph_helpers import ROOT
from tests.support.procs import Daemon, free_port, kill_tree, spawn, tail, wait_until

JOB = Path(__file__).parents[1] / "support" / "connect_job.py"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 90.0  # a JVM takes ~5-10 s to start on a busy 2-core machine
JOB_TIMEOUT_S = 240.0


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _pythonpath() -> str:
    """This checkout first, so that `tests.support.worker_tasks` imports in the client and the Spark workers."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


@pytest.fixture
def connect_server(tmp_path: Path) -> Iterator[tuple[str, Daemon]]:
    """A Spark Connect server (local[2]) on 127.0.0.1 whose Python workers import this checkout."""
    env = {
        **os.environ,
        "SPARK_HOME": _find_spark_home(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": _pythonpath(),
    }
    port = free_port()
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
    }
    args = ["--class", SERVER_CLASS, "--master", "local[2]", "--name", "conveyor-connect-test"]
    args += [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")] + ["spark-internal"]
    server = spawn("connect-server", "spark-submit", args, env, tmp_path)
    try:
        wait_until("the Connect server", lambda: _listening(port), [server], START_TIMEOUT_S, lambda: tail(server.log))
        yield f"sc://127.0.0.1:{port}", server
    finally:
        kill_tree(server.proc)


@pytest.mark.cluster
def test_map_consumers_and_graph_through_spark_connect(connect_server: tuple[str, Daemon], tmp_path: Path) -> None:
    url, server = connect_server
    out, err = tmp_path / "result.json", tmp_path / "client.log"
    with open(err, "wb") as e:
        client = subprocess.Popen(
            [sys.executable, str(JOB), url, str(out)],
            stdout=e,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": _pythonpath()},
            start_new_session=True,
        )
    try:
        code = client.wait(JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        kill_tree(client)  # also what a failed client left (its queue servers)
    assert code == 0, f"the Connect client failed (exit {code})\n{tail(err)}\n--- server ---\n{tail(server.log)}"
    result = json.loads(out.read_text())
    assert result["session"].startswith("pyspark.sql.connect"), result["session"]

    rows = result["map"]
    assert len(rows) == ROWS
    ok = sorted(r["y"] for r in rows if r["error"] is None)
    assert ok == sorted(2 * (i + 1) for i in range(ROWS) if i not in FAILING)
    failed = {json.loads(r["input"])["id"]: r["error"] for r in rows if r["error"] is not None}
    assert set(failed) == FAILING and all(f"row {i} is bad" in failed[i] for i in FAILING)

    assert sum(result["consumers"]) == TASKS and len(result["consumers"]) == 2
    assert result["tasks"] == sorted(2 * i for i in range(TASKS))
    assert result["graph_count"] == CSV_ROWS
    assert "under Spark Connect" in result["cluster_unnamed"] and "host=" in result["cluster_unnamed"]
    assert all(a.startswith("tcp://127.0.0.1:") for a in result["cluster_addresses"])  # loopback: no TLS needed
    assert result["cluster_map"] == list(range(ROWS))
