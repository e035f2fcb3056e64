"""`conveyor.spark.map` on a real Spark standalone cluster that loses a worker mid-run.

A master and two workers (1 core each) start on 127.0.0.1 from the pyspark installation's
`bin/spark-class`, each in its own process group. The Spark driver runs in a child process
(tests/cluster_job.py: a process holds one SparkContext, and this one already has the local
session of the other tests), with the queue servers beside it. Once both consumers (Spark tasks,
one per executor) run and part of the rows are done, the test SIGKILLs one worker with everything
under it: the worker JVM, its executor JVM and the executor's Python processes, as when a machine
is lost. The rows the killed consumer held come back after their lease, the surviving consumer does
them, and the output must still hold exactly one result, without error, for every input row.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from pyspark.find_spark_home import _find_spark_home

from tests.cluster_job import MARKER, ROWS
from tests.procs import Daemon, cmdline, free_port, kill_tree, process_tree, spawn, tail, wait_gone, wait_until

JOB = Path(__file__).with_name("cluster_job.py")
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
N_WORKERS = 2
START_TIMEOUT_S = 90.0  # a JVM takes ~5-10 s to start on a busy 2-core machine
MARKER_TIMEOUT_S = 120.0  # driver JVM, executors, enqueue stage, then the consumers start
FINISH_TIMEOUT_S = 120.0  # after the kill: the rest of the rows on one worker, leases of 5 s
GONE_TIMEOUT_S = 10.0


# --- the cluster ---------------------------------------------------------------------------------
@dataclass
class Cluster:
    url: str
    master: Daemon
    workers: list[Daemon]

    def logs(self) -> str:
        return "\n".join(f"--- {d.name} ({d.log}) ---\n{tail(d.log)}" for d in [self.master, *self.workers])


def master_state(webui_port: int) -> dict[str, Any] | None:
    """The master's state from its web UI (`/json/`), or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=2) as r:
            return json.loads(r.read())
    except (OSError, urllib.error.URLError, ValueError):
        return None


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A standalone master and N_WORKERS workers (1 core, 1 GB each) on 127.0.0.1; all killed afterwards."""
    logs = tmp_path / "spark-logs"
    logs.mkdir()
    env = {**os.environ, "SPARK_HOME": _find_spark_home(), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(logs),
           "SPARK_WORKER_DIR": str(tmp_path / "spark-work"),
           # no REST submission server: it would listen on the fixed port 6066
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}  # fmt: skip
    daemons: list[Daemon] = []
    try:
        port, ui = free_port(), free_port()
        master = spawn("master", "spark-class", [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port),
                                                 "--webui-port", str(ui)], env, logs, ui)  # fmt: skip
        daemons.append(master)
        cluster = Cluster(f"spark://127.0.0.1:{port}", master, [])
        wait_until("the master", lambda: (master_state(ui) or {}).get("status") == "ALIVE", daemons, START_TIMEOUT_S,
                   cluster.logs)  # fmt: skip
        for i in range(N_WORKERS):
            wui = free_port()
            worker = spawn(f"worker-{i}", "spark-class", [WORKER_CLASS, cluster.url, "--host", "127.0.0.1", "--cores", "1",
                                                          "--memory", "1g", "--webui-port", str(wui),
                                                          "--work-dir", str(tmp_path / f"work-{i}")], env, logs, wui)  # fmt: skip
            daemons.append(worker)
            cluster.workers.append(worker)

        def workers_alive() -> bool:
            state = master_state(ui) or {}
            alive_ports = {int(w["webuiaddress"].rsplit(":", 1)[1]) for w in state.get("workers", []) if w["state"] == "ALIVE"}
            return alive_ports == {w.webui_port for w in cluster.workers}

        wait_until(f"{N_WORKERS} ALIVE workers", workers_alive, daemons, START_TIMEOUT_S, cluster.logs)
        yield cluster
    finally:
        for d in reversed(daemons):
            kill_tree(d.proc)


# --- the driver -----------------------------------------------------------------------------------
class Driver:
    """tests/cluster_job.py in its own session; its stdout lines go to a queue, its stderr to a file."""

    def __init__(self, master_url: str, out: Path, err: Path) -> None:
        self.err = err
        with open(err, "wb") as e:
            self.proc = subprocess.Popen([sys.executable, str(JOB), master_url, str(out)], stdout=subprocess.PIPE,
                                         stderr=e, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="driver-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stdout: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        for raw in stdout:
            self.lines.put(raw.decode(errors="replace").rstrip("\n"))
        self.lines.put(None)

    def wait_for_marker(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                code = self.proc.wait()
                raise AssertionError(f"the driver exited ({code}) before the consumers ran\n{tail(self.err)}")
            if line.startswith(MARKER + " "):
                return json.loads(line[len(MARKER) + 1 :])
        raise AssertionError(f"the consumers did not start within {timeout:.0f} s\n{tail(self.err)}")

    def close(self) -> None:
        kill_tree(self.proc)  # also what a failed driver left (its JVM, its queue servers)
        self._reader.join()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.mark.cluster
def test_map_on_a_standalone_cluster_survives_a_killed_worker(spark_cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    driver = Driver(spark_cluster.url, out, tmp_path / "driver.log")
    try:
        marker = driver.wait_for_marker(MARKER_TIMEOUT_S)
        assert marker["acked"] > 0 and marker["pending"] > 0, f"the kill must land mid-run: {marker}"

        # one consumer per worker; kill worker-0 with its executor and the executor's Python processes
        victim, survivor = spark_cluster.workers
        hosted = {w.name: [p for p in marker["consumer_pids"] if p in process_tree(w.proc.pid)] for w in spark_cluster.workers}
        assert all(len(pids) == 1 for pids in hosted.values()), f"expected one consumer under each worker: {hosted}"
        killed_consumer, surviving_consumer = hosted[victim.name][0], hosted[survivor.name][0]
        executors = [p for p in process_tree(victim.proc.pid) if EXECUTOR_CLASS in cmdline(p)]
        assert len(executors) == 1, f"expected one executor JVM under {victim.name}: {executors}"
        killed = kill_tree(victim.proc)
        kill_time = time.time()
        left = wait_gone(killed, GONE_TIMEOUT_S)
        assert not left, f"processes of the killed worker still run after SIGKILL: {left}"

        try:
            code = driver.proc.wait(FINISH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the driver did not finish within {FINISH_TIMEOUT_S:.0f} s of the kill\n"
                                 f"{tail(driver.err)}\n{spark_cluster.logs()}") from None  # fmt: skip
        assert code == 0, f"the driver failed (exit {code})\n{tail(driver.err)}\n{spark_cluster.logs()}"
        assert survivor.proc.poll() is None, f"the surviving worker exited\n{spark_cluster.logs()}"
    finally:
        driver.close()

    result = json.loads(out.read_text())
    rows = result["rows"]
    counts = Counter(r["id"] for r in rows)
    missing = sorted(set(range(ROWS)) - set(counts))
    repeated = sorted(i for i, n in counts.items() if n > 1)
    unknown = sorted(set(counts) - set(range(ROWS)))
    assert not (missing or repeated or unknown), (
        f"every input id must have exactly one result: {len(rows)} rows, "
        f"missing {missing[:20]}, repeated {repeated[:20]}, unknown {unknown[:20]}"
    )
    assert len(rows) == ROWS
    errors = [r for r in rows if r["_error"] is not None]
    assert result["errors"] == 0 and not errors, f"{len(errors)} rows failed, e.g. {errors[:3]}"

    by_pid = Counter(r["pid"] for r in rows)
    assert by_pid[killed_consumer] > 0, f"the killed consumer ({killed_consumer}) had done no rows: {dict(by_pid)}"
    assert by_pid[surviving_consumer] > 0, f"the surviving consumer ({surviving_consumer}) did no rows: {dict(by_pid)}"
    assert set(by_pid) == {killed_consumer, surviving_consumer}, f"rows done by unexpected processes: {dict(by_pid)}"
    late = [r for r in rows if r["pid"] == killed_consumer and r["t"] > kill_time]
    assert not late, f"rows done by the killed consumer after the kill: {late[:3]}"
