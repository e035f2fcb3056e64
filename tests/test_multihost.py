"""Conveyor across hosts: a Spark standalone cluster and queue servers on network namespaces (tests/support/netbed.py).

The bed (`cluster_bed`, one per module: its start-up costs two rounds of JVM start-ups) holds
hosts `driver` (the Spark master; the test's Spark driver runs there too), `worker0`, `worker1`
(a Spark worker each) and `server0`, `server1` (a queue server each). Tests take it through
`bed`, which first repairs what an earlier test broke (`ClusterBed.repair`) and afterwards kills
what the test started, so a fault test may kill hosts and servers freely. Without the means to make
namespaces (root, iproute2) the tests are skipped, and fail under CI=true.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.protocol.tls import self_signed
from tests.support.clusterbed import ClusterBed
from tests.support.multihost_job import CLUSTER_PORTS, MARK, ROWS, START_TIMEOUT_S, UNREACHABLE_S
from tests.support.netbed import BedUnavailable, ns_pids, unavailable
from tests.support.procs import alive, cmdline, kill_tree, tail, wait_until

JOB = Path(__file__).parent / "support" / "multihost_job.py"
RELAY = Path(__file__).parent / "support" / "relay.py"
TOKEN = "multihost-test-token"
JOB_TIMEOUT_S = 180.0  # driver JVM, two executors, then a few seconds of rows
MARK_TIMEOUT_S = 120.0  # the driver JVM and its executors start, and the map is under way
POLL_S = 0.05
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
OUT_OF_REACH = "WARNING conveyor.spark: queue server"  # the driver's watch, as a server goes out of reach


@pytest.fixture(scope="module")
def cluster_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterBed]:
    """The module's bed, started once; at the end everything is killed and deleted, and checked gone."""
    t0 = time.monotonic()
    try:
        bed = ClusterBed.start(tmp_path_factory.mktemp("netbed"), TOKEN)
    except BedUnavailable as e:
        unavailable(str(e))
    print(f"\nnetbed: up in {time.monotonic() - t0:.1f} s ({bed.net.prefix})")
    pids = [d.proc.pid for d in bed.net.procs]
    try:
        yield bed
    finally:
        pids += [d.proc.pid for d in bed.net.procs]
        problems = bed.close()
        assert not problems, f"the bed's teardown left: {problems}"
        assert not [p for p in pids if alive(p)], "processes of the bed still run"


@pytest.fixture
def bed(cluster_bed: ClusterBed) -> Iterator[ClusterBed]:
    """The module's bed as it started (repaired if an earlier test broke it); what the test started is killed after."""
    t0 = time.monotonic()
    cluster_bed.repair()
    if (took := time.monotonic() - t0) > 1:
        print(f"\nnetbed: repaired in {took:.1f} s")
    try:
        yield cluster_bed
    finally:
        cluster_bed.sweep()


class Job:
    """tests/support/multihost_job.py running a scenario on `driver`: its MARK line (the moment for the fault), its result."""

    def __init__(self, bed: ClusterBed, tmp_path: Path, scenario: str, env: dict[str, str] | None = None) -> None:
        self.bed, self.out, self.work = bed, tmp_path / "result.json", tmp_path / "work"
        self.work.mkdir()
        argv = [
            sys.executable,
            str(JOB),
            bed.master_url,
            bed.ip("driver"),
            ",".join(bed.server_addresses),
            bed.token,
            str(self.out),
            scenario,
            str(self.work),
        ]
        self.job = bed.spawn("driver", f"job-{scenario}", argv, env)

    def failed(self, why: str) -> AssertionError:
        return AssertionError(f"{why}\n--- job log ---\n{tail(self.job.log)}\n{self.bed.logs()}")

    def wait_for(self, text: str, timeout: float = MARK_TIMEOUT_S) -> str:
        """The first line of the job's log that starts with `text` (bounded: the job's end, or `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.job.log.read_text(errors="replace").splitlines():
                if line.startswith(text):
                    return line
            if self.job.proc.poll() is not None:
                raise self.failed(f"the job exited ({self.job.proc.returncode}) before {text!r}")
            time.sleep(POLL_S)
        raise self.failed(f"no {text!r} from the job within {timeout:.0f} s")

    def mark(self) -> dict[str, Any]:
        info: dict[str, Any] = json.loads(self.wait_for(MARK + " ").split(" ", 1)[1])
        return info

    def fault_at_mark(self, fault: Callable[[], object]) -> float:
        """At the job's MARK, inject `fault`; returns when (wall clock)."""
        self.mark()
        t = time.time()
        fault()
        return t

    def result(self, timeout: float = JOB_TIMEOUT_S) -> dict[str, Any]:
        """Wait for the job to end (bounded) and return what it wrote."""
        try:
            code = self.job.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise self.failed(f"the job did not finish within {timeout:.0f} s") from None
        finally:
            kill_tree(self.job.proc)  # also what it left (its JVM)
        if code != 0:
            raise self.failed(f"the job failed (exit {code})")
        out: dict[str, Any] = json.loads(self.out.read_text())
        return out


def exactly_once(rows: list[dict[str, Any]]) -> None:
    """One output row per input id, none failed."""
    counts = Counter(r["id"] for r in rows)
    missing = sorted(set(range(ROWS)) - set(counts))
    repeated = sorted(i for i, n in counts.items() if n > 1)
    assert not missing and not repeated and len(rows) == ROWS, (
        f"one result per input id: {len(rows)} rows, missing {missing[:20]}, repeated {repeated[:20]}"
    )
    errors = [r for r in rows if r["_error"] is not None]
    assert not errors, f"{len(errors)} rows failed, e.g. {errors[:3]}"


@pytest.mark.cluster
@pytest.mark.timeout(300)  # with the bed's start-up (~30-60 s on 2 cores)
def test_map_across_hosts(bed: ClusterBed, tmp_path: Path) -> None:
    """conveyor.spark.map with executors on two hosts and queue servers on two others: one result per row, both hosts work."""
    t0 = time.monotonic()
    result = Job(bed, tmp_path, "plain").result()
    print(f"\nnetbed: job took {time.monotonic() - t0:.1f} s")
    exactly_once(result["rows"])
    workers = {bed.ip("worker0"), bed.ip("worker1")}
    assert set(result["executors"]) >= workers, f"executors: {result['executors']}"
    by_host = Counter(r["host"] for r in result["rows"])
    assert set(by_host) == workers, f"rows by host: {dict(by_host)}, workers at {sorted(workers)}"


# --- faults: each ends in the right output or a clear error within a stated bound ---------------------
def took_since(t: float, result: dict[str, Any]) -> float:
    return float(result["ended"]) - t


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_server_killed_for_good_fails_the_map_naming_it(bed: ClusterBed, tmp_path: Path) -> None:
    """Bound: 2 x unreachable_s + 5 s (a connection attempt, cancelling the job, dropping what it can)."""
    job = Job(bed, tmp_path, "server-lost")
    t_kill = job.fault_at_mark(lambda: bed.stop_server(1))
    result = job.result()
    took = took_since(t_kill, result)
    print(f"\nnetbed: a server lost for good: {result.get('error_type')} {took:.1f} s after the kill")
    assert result.get("error_type") == "ServerUnreachableError", result
    assert bed.server_addresses[1] in result["error"] and "pending in 'map-" in result["error"], result["error"]
    assert any("conveyor drop --connect" in n for n in result["notes"]), result["notes"]
    assert took <= 2 * UNREACHABLE_S + 5, f"the map failed {took:.1f} s after the kill"
    assert OUT_OF_REACH in job.job.log.read_text(errors="replace"), "the driver's log says so as it happens"


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_server_back_within_the_bound_finishes_exactly_once(bed: ClusterBed, tmp_path: Path) -> None:
    job = Job(bed, tmp_path, "server-back")
    t_kill = job.fault_at_mark(lambda: bed.stop_server(1))
    job.wait_for(OUT_OF_REACH, timeout=30)  # the driver noticed, and said so
    bed.start_server(1)  # on its data dir
    t_back = time.time()
    result = job.result()
    print(f"\nnetbed: a server down {t_back - t_kill:.1f} s: map ended {took_since(t_kill, result):.1f} s after the kill")
    exactly_once(result["rows"])


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_worker_host_lost_mid_consume(bed: ClusterBed, tmp_path: Path) -> None:
    """The lost host's rows run elsewhere within the lease, and the map ends without waiting for Spark.

    The lost host's rows run elsewhere within the lease (10 s by default; <= 15 s asked), and the
    map ends without waiting for Spark to notice the silent host (spark.network.timeout).
    """
    job = Job(bed, tmp_path, "worker-lost")
    t_kill = job.fault_at_mark(lambda: bed.kill_host("worker0"))
    result = job.result()
    exactly_once(result["rows"])
    reruns = sorted(r["rerun_t"] for r in result["rows"] if r["rerun_t"] is not None)
    assert reruns, "the lost host had rows in flight: they must have run again elsewhere"
    recovery, took = reruns[0] - t_kill, took_since(t_kill, result)
    print(f"\nnetbed: a worker host lost: its rows ran elsewhere {recovery:.1f} s after the kill, map ended at {took:.1f} s")
    assert recovery <= 15, f"the lost host's rows ran again only {recovery:.1f} s after the kill"
    assert took <= 45, f"the map ended {took:.1f} s after the kill"


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_worker_host_lost_while_rows_are_put(bed: ClusterBed, tmp_path: Path) -> None:
    """The survivor works off what it can; Spark's rerun of the lost task there does the rest.

    The survivor works off what it can and frees its slot; Spark runs the lost task again there,
    which puts the rest (nothing twice: idempotency keys) and works it off. Bound: Spark's own loss
    detection (the master's worker timeout, 10 s here) + the task's input again + its rows: 90 s.
    """
    job = Job(bed, tmp_path, "put")
    t_kill = job.fault_at_mark(lambda: bed.kill_host("worker0"))
    result = job.result()
    exactly_once(result["rows"])
    took = took_since(t_kill, result)
    print(f"\nnetbed: a worker host lost while putting: map ended {took:.1f} s after the kill")
    assert took <= 90, f"the map ended {took:.1f} s after the kill"
    assert {r["host"] for r in result["rows"]} <= {bed.ip("worker0"), bed.ip("worker1")}


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_default_parallelism_beyond_the_slots(bed: ClusterBed, tmp_path: Path) -> None:
    """spark.default.parallelism=4 with 2 slots: map sizes its consumers from the slots, not the setting."""
    result = Job(bed, tmp_path, "parallelism").result()
    exactly_once(result["rows"])
    assert result["consumers"] == 2, result["consumers"]


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_the_output_survives_an_executor_lost_after_map_returned(bed: ClusterBed, tmp_path: Path) -> None:
    job = Job(bed, tmp_path, "reuse")
    job.mark()
    executors = [p for p in ns_pids(bed.net.hosts["worker0"].ns) if EXECUTOR_CLASS in cmdline(p)]
    assert len(executors) == 1, f"one executor JVM on worker0: {executors}"
    bed.kill_pid(executors[0])
    (job.work / "go").touch()
    result = job.result()
    exactly_once(result["rows"])
    exactly_once(result["again"])
    print(f"\nnetbed: output used again after an executor was lost: read in {result['again_s']:.1f} s")


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_no_slot_ever_granted_fails_the_map(bed: ClusterBed, tmp_path: Path) -> None:
    """Executors of 2 cores on workers of 1: none is ever placed.

    Spark only logs that the job "has not accepted any resources"; the map fails with NoSlotsError
    after start_timeout_s (15 s here) + 10 s (its wait for a first executor to size the job).
    """
    result = Job(bed, tmp_path, "noslots").result()
    assert result.get("error_type") == "NoSlotsError", result
    assert "no Spark task" in result["error"] and "0 executor(s) registered" in result["error"], result["error"]
    took = took_since(result["map_called"], result)
    print(f"\nnetbed: no slot ever granted: NoSlotsError {took:.1f} s after map was called")
    assert took <= START_TIMEOUT_S + 10 + 10, f"the map failed {took:.1f} s after it was called"


# --- nothing to deploy: servers beside the driver, and the pre-flight ----------------------------------------
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_map_and_consumers_with_no_pool_use_servers_beside_the_driver(bed: ClusterBed, tmp_path: Path) -> None:
    """map and consumers with no pool use servers on the driver's host, over TLS with a token.

    No pool on the cluster: servers on the driver's host over TLS with a token, one row per input
    row; the time to the first row within 8 s of the same map on servers started beforehand (by
    conveyor.cluster, on fixed ports): starting the servers costs under 1 s on a quiet machine and 3-4 s
    on a loaded one, while a start that waited on a timeout would cost 10 s or more.
    """
    result = Job(bed, tmp_path, "driver-servers").result()
    exactly_once(result["rows"])
    exactly_once(result["rows_started"])
    assert result["squares"] == [i * i for i in range(ROWS)]
    driver = bed.ip("driver")
    for addresses in (result["cluster_addresses"], result["consumer_addresses"]):
        assert addresses and all(a.startswith(f"tls://{driver}:") for a in addresses), addresses
    assert result["cluster_addresses"] == [f"tls://{driver}:{port}" for port in CLUSTER_PORTS]  # cluster(ports=...)
    assert {r["host"] for r in result["rows"]} == {bed.ip("worker0"), bed.ip("worker1")}
    cold, warm = result["first_row_s"], result["first_row_started_s"]
    print(f"\nnetbed: map with no pool: first row {cold:.2f} s after the call; with servers started before: {warm:.2f} s")
    assert cold - warm <= 8.0, f"first row {cold:.2f} s after the call with no pool, {warm:.2f} s with servers started"


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_the_preflight_names_each_host_and_what_it_lacks(bed: ClusterBed, tmp_path: Path) -> None:
    """worker1 cannot import the task module; worker0 cannot reach server1. One error names both, before any work."""
    blocked = ["ip", "route", "add", "prohibit", f"{bed.ip('server1')}/32"]
    r = bed.net.run("worker0", blocked)
    assert r.returncode == 0, r.stderr
    try:
        result = Job(bed, tmp_path, "preflight", env={"CONVEYOR_TEST_NO_TASKS_ON": bed.ip("worker1")}).result()
    finally:
        bed.net.run("worker0", ["ip", "route", "del", "prohibit", f"{bed.ip('server1')}/32"])
    assert result.get("error_type") == "PreflightError", result
    problems = result["problems"]
    by_ip = {h.split("(")[-1].rstrip(")"): "; ".join(ps) for h, ps in problems.items()}
    assert set(by_ip) == {bed.ip("worker0"), bed.ip("worker1")}, problems
    assert "tests.support.preflight_tasks" in by_ip[bed.ip("worker1")] and "not importable" in by_ip[bed.ip("worker1")]
    assert bed.server_addresses[1] in by_ip[bed.ip("worker0")] and "does not answer" in by_ip[bed.ip("worker0")]
    assert "sc.addPyFile" in result["error"] and "spark.archives" in result["error"], result["error"]
    took = took_since(result["map_called"], result)
    print(f"\nnetbed: pre-flight failed {took:.1f} s after map was called:\n{result['error']}")
    # before any work, and before the 30 s the map gives a server out of reach (its probe waits 3 s for
    # an answer); Spark's own start of the job takes the rest: 5-10 s quiet, 18 s under a load of 8
    assert took < 30, f"the pre-flight took {took:.1f} s"


MITM_CLIENT = """
import sys
from conveyor.client.queue_client import QueueClient
from conveyor.errors import ConnectionLostError
from conveyor.message import Message
relayed, direct, token, fp = sys.argv[1:5]
try:
    QueueClient(relayed, token, fingerprint=fp, timeout=10).put("q", [Message(payload=b"pay 100 EUR to alice" * 3000)])
    print("STORED THROUGH THE RELAY")
except ConnectionLostError as e:
    print("DETECTED:", e)
with QueueClient(direct, token, fingerprint=fp) as c:
    print("STORED:", sum(q.ready for q in c.stats().values()))
"""


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_relay_on_the_network_that_alters_a_byte_is_detected(bed: ClusterBed, tmp_path: Path) -> None:
    """A relay on the network flipping a byte of a put fails the TLS connection, and nothing is stored.

    A TLS server on server1, a man in the middle on `driver` flipping one byte of a put after the
    handshakes, a client on worker0: the connection fails saying so, and nothing is stored.
    """
    cert, key, fp = self_signed(tmp_path / "tls", [bed.ip("server1")])
    token = tmp_path / "token"
    token.write_text("mitm-token\n")
    token.chmod(0o600)
    server = bed.spawn(
        "server1",
        "tls-server",
        [
            sys.executable,
            "-m",
            "conveyor",
            "serve",
            "--host",
            bed.ip("server1"),
            "--port",
            "7171",
            "--token-file",
            str(token),
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
        ],
    )
    wait_until("the TLS server", lambda: "listening on tls://" in tail(server.log), [server], 60, lambda: tail(server.log))
    relay = bed.spawn(
        "driver", "relay", [sys.executable, str(RELAY), bed.ip("driver"), "7272", bed.ip("server1"), "7171", "30000"]
    )
    wait_until("the relay", lambda: "relaying" in tail(relay.log), [relay], 30, lambda: tail(relay.log))
    r = bed.net.run(
        "worker0",
        [
            sys.executable,
            "-c",
            MITM_CLIENT,
            f"tls://{bed.ip('driver')}:7272",
            f"tls://{bed.ip('server1')}:7171",
            "mitm-token",
            fp,
        ],
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    # the server finds the altered record and closes: the client sees a reset or a TLS EOF, and says why either way
    assert "DETECTED:" in r.stdout and re.search(r"integrity check|data altered on the way", r.stdout), r.stdout
    assert "STORED: 0" in r.stdout, r.stdout
    assert "TLS error" in tail(server.log) and "mitm-token" not in tail(server.log), tail(server.log)


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_consumers_given_gpus_run_only_where_they_are_each_with_its_own(bed: ClusterBed, tmp_path: Path) -> None:
    """resources={"gpu": 1}: consumers on the GPU host alone, as many as its GPUs, each seeing its own GPU.

    The application's one executor (3 cores, 2 GPUs) can start only on `gpu0`, whose worker's
    discovery script declares GPUs "0" and "1"; worker0 and worker1 have none. Three cores would
    make three consumers; two GPUs make two.
    """
    bed.start_gpu_worker(cores=3, gpus=2)
    result = Job(bed, tmp_path, "gpu").result()
    assert result["executors"] == sorted([bed.ip("driver"), bed.ip("gpu0")]), result["executors"]
    for mode in ("thread", "process"):
        rows, consumers = result[mode]["rows"], result[mode]["consumers"]
        assert consumers == 2, f"{mode}: {consumers} consumers"
        assert sorted(r["id"] for r in rows) == list(range(ROWS)) and not any(r["_error"] for r in rows)
        assert {r["host"] for r in rows} == {bed.ip("gpu0")}
        assert all(r["gpus"] in ("0", "1") and r["cuda"] == r["gpus"] for r in rows), rows[:3]
        # a consumer is one Python worker (thread mode) or the parent of its task processes (process mode)
        consumer_of = "pid" if mode == "thread" else "parent"
        seen: dict[int, set[str]] = {}
        for r in rows:
            seen.setdefault(r[consumer_of], set()).add(r["gpus"])
        assert sorted(g for gs in seen.values() for g in gs) == ["0", "1"], f"{mode}: GPUs by consumer: {seen}"


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_local_refuses_the_cluster_master(bed: ClusterBed) -> None:
    code = f"import conveyor\nwith conveyor.local(master={bed.master_url!r}):\n    pass\n"
    r = bed.net.run("driver", [sys.executable, "-c", code], timeout=30)
    assert r.returncode == 1 and "ConveyorError" in r.stderr and "conveyor serve --host" in r.stderr, r.stderr
