"""The network-namespace test bed itself (tests/support/netbed.py).

A teardown leaves nothing, and a killed host is silent to its peers (a crash, not a clean close) yet
answers at once when rebooted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.netbed import BedUnavailable, NetBed, namespaces, ns_pids, unavailable
from tests.support.procs import alive, tail


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
    """A killed host's peers hear nothing, like a crash; rebooted, it answers at once.

    A killed host's peers hear nothing (no FIN, no RST: the cable is pulled before the kill), like a
    crash; rebooted, it answers at once (a refused connection: nothing listens), with no stale ARP
    entry in the way.
    """
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
