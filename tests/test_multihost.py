"""Conveyor across hosts: a Spark standalone cluster and queue servers on network namespaces (tests/netbed.py).

The bed (`cluster_bed`, one per module: its start-up costs two rounds of JVM start-ups) holds
hosts `driver` (the Spark master; the test's Spark driver runs there too), `worker0`, `worker1`
(a Spark worker each) and `server0`, `server1` (a queue server each). Tests take it through
`bed`, which first repairs what an earlier test broke (`ClusterBed.repair`) and afterwards kills
what the test started, so a fault test may kill hosts and servers freely. Without the means to make
namespaces (root, iproute2) the tests are skipped, and fail under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.multihost_job import ROWS
from tests.netbed import BedUnavailable, ClusterBed, NetBed, namespaces, ns_pids
from tests.procs import alive, kill_tree, tail

JOB = Path(__file__).with_name("multihost_job.py")
TOKEN = "multihost-test-token"
JOB_TIMEOUT_S = 180.0  # driver JVM, two executors, then a few seconds of rows


def unavailable(reason: str) -> NoReturn:
    """No namespaces here: fail in CI (nothing may be skipped there), else skip."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"the multi-host bed cannot be made: {reason}")
    pytest.skip(f"the multi-host bed cannot be made: {reason}")


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


def run_job(bed: ClusterBed, out: Path, timeout: float = JOB_TIMEOUT_S) -> None:
    """tests/multihost_job.py on `driver` until it exits (bounded); fails with its log and the daemons' logs."""
    argv = [sys.executable, str(JOB), bed.master_url, bed.ip("driver"), ",".join(bed.server_addresses), bed.token, str(out)]
    job = bed.spawn("driver", "job", argv)
    try:
        code = job.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the job did not finish within {timeout:.0f} s\n{tail(job.log)}\n{bed.logs()}") from None
    finally:
        kill_tree(job.proc)  # also what it left (its JVM)
    assert code == 0, f"the job failed (exit {code})\n{tail(job.log)}\n{bed.logs()}"


@pytest.mark.cluster
@pytest.mark.timeout(30)
def test_bed_teardown_leaves_nothing() -> None:
    """A bed's `close()` kills what runs in it (recorded or not, in sessions of their own) and deletes its namespaces."""
    try:
        net = NetBed.create(["a", "b"])
    except BedUnavailable as e:
        unavailable(str(e))
    try:
        env = dict(os.environ)
        log = Path(os.devnull)
        # a process whose child escapes into a session of its own, and a process `ip netns exec` started unrecorded
        script = "import subprocess, time; subprocess.Popen(['sleep', '60'], start_new_session=True); time.sleep(60)"
        net.spawn("a", "parent", [sys.executable, "-c", script], env, log)
        stray = subprocess.Popen(net.argv("b", ["sleep", "60"]), start_new_session=True)
        deadline = time.monotonic() + 10
        while len(ns_pids(net.hosts["a"].ns)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = ns_pids(net.hosts["a"].ns) + ns_pids(net.hosts["b"].ns)
        assert len(pids) == 3, f"expected 3 processes in the bed: {pids}"
        assert not net.connectable("a", "192.0.2.1", 9), "the bed must not reach beyond its /24"
    finally:
        problems = net.close()
    stray.wait(10)
    assert not problems, problems
    assert not [p for p in pids if alive(p)]
    assert not [ns for ns in namespaces() if ns.startswith(net.prefix)]


LISTEN = """import socket, sys, time
s = socket.create_server((sys.argv[1], 7000))
print("listening", flush=True)
c, _ = s.accept()
print("accepted", flush=True)
time.sleep(60)
"""
TALK = """import os, socket, sys, time
c = socket.create_connection((sys.argv[1], 7000), timeout=5)
print("connected", flush=True)
deadline = time.monotonic() + 20
while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.05)
c.settimeout(2)
try:
    c.sendall(b"x")
    print("eof" if c.recv(1) == b"" else "data")
except TimeoutError:
    print("silent")
except OSError as e:
    print(type(e).__name__)
"""
DIAL = """import socket, sys
try:
    socket.create_connection((sys.argv[1], 7000), timeout=5)
except OSError as e:
    print(type(e).__name__)
"""


def wait_line(log: Path, text: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in tail(log):
        assert time.monotonic() < deadline, f"{text!r} not in {log} within {timeout:.0f} s: {tail(log)!r}"
        time.sleep(0.05)


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_kill_host_is_silent_and_reboot_answers(tmp_path: Path) -> None:
    """A killed host's peers hear nothing (no FIN, no RST: the cable is pulled before the kill), like a crash;
    rebooted, it answers at once (a refused connection: nothing listens), with no stale ARP entry in the way."""
    try:
        net = NetBed.create(["a", "b"])
    except BedUnavailable as e:
        unavailable(str(e))
    try:
        env, b_ip = dict(os.environ), net.hosts["b"].ip
        server = net.spawn("b", "listen", [sys.executable, "-c", LISTEN, b_ip], env, tmp_path / "listen.log")
        wait_line(server.log, "listening")
        client = net.spawn("a", "talk", [sys.executable, "-c", TALK, b_ip, str(tmp_path / "go")], env, tmp_path / "talk.log")
        wait_line(client.log, "connected")
        wait_line(server.log, "accepted")
        killed = net.kill_host("b")
        assert server.proc.pid in killed and server.proc.poll() is not None
        (tmp_path / "go").touch()
        assert client.proc.wait(15) == 0, tail(client.log)
        assert tail(client.log).split()[-1] == "silent", f"the peer of a killed host must hear nothing: {tail(client.log)}"
        net.reboot_host("b")
        assert ns_pids(net.hosts["b"].ns) == []
        dial = net.run("a", [sys.executable, "-c", DIAL, b_ip])
        assert dial.stdout.strip() == "ConnectionRefusedError", f"the rebooted host must answer: {dial}"
    finally:
        assert not net.close()


@pytest.mark.cluster
@pytest.mark.timeout(300)  # with the bed's start-up (~30-60 s on 2 cores)
def test_map_across_hosts(bed: ClusterBed, tmp_path: Path) -> None:
    """conveyor.spark.map with executors on two hosts and queue servers on two others: one result per row, both hosts work."""
    out = tmp_path / "result.json"
    t0 = time.monotonic()
    run_job(bed, out)
    print(f"\nnetbed: job took {time.monotonic() - t0:.1f} s")

    result = json.loads(out.read_text())
    rows = result["rows"]
    counts = Counter(r["id"] for r in rows)
    missing = sorted(set(range(ROWS)) - set(counts))
    repeated = sorted(i for i, n in counts.items() if n > 1)
    assert not missing and not repeated and len(rows) == ROWS, (
        f"one result per input id: {len(rows)} rows, missing {missing[:20]}, repeated {repeated[:20]}"
    )
    errors = [r for r in rows if r["_error"] is not None]
    assert not errors, f"{len(errors)} rows failed, e.g. {errors[:3]}"
    workers = {bed.ip("worker0"), bed.ip("worker1")}
    assert set(result["executors"]) >= workers, f"executors: {result['executors']}"
    by_host = Counter(r["host"] for r in rows)
    assert set(by_host) == workers, f"rows by host: {dict(by_host)}, workers at {sorted(workers)}"
