"""A multi-host test bed of Linux network namespaces (root only), for tests that lose hosts.

`NetBed`: a namespace per host (loopback, `eth0` on a private /24, no default route), cabled by
veth pairs to a bridge in a "switch" namespace: nothing shows in, or reaches, the root namespace.
Processes started in it run in sessions of their own and are recorded; `close()` kills them and
anything else in the namespaces, then deletes links and namespaces. `kill_host` is a crash: the
cable is pulled first, so peers hear nothing (no FIN, no RST), then everything on it is SIGKILLed.

`ClusterBed` (tests/support/clusterbed.py) puts a Spark cluster and queue servers on one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

from tests.support.procs import Daemon, alive, kill_tree, process_tree, wait_gone

ROOT = Path(__file__).resolve().parents[2]  # the checkout: processes in the bed import its src/ and tests/
PREFIX = "cvb"  # namespaces are named cvb<pid>-<n>-<host>: unique per process and bed
CMD_TIMEOUT_S = 10.0
GONE_TIMEOUT_S = 10.0
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()"
_SEQ = itertools.count(1)  # beds made by this process


class BedUnavailable(Exception):
    """Network namespaces cannot be made here (not root, no `ip`, no permission): the tests skip, or fail in CI."""


def ip(*args: str) -> str:
    """`ip ARGS` (bounded); raises RuntimeError with its stderr when it fails."""
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def namespaces() -> list[str]:
    """Names of all network namespaces (`ip netns list`)."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def ns_pids(ns: str) -> list[int]:
    """Processes in namespace `ns` (none if it is gone)."""
    try:
        return [int(p) for p in ip("netns", "pids", ns).split()]
    except RuntimeError:
        return []


def kill_ns(ns: str, timeout: float = GONE_TIMEOUT_S) -> list[int]:
    """SIGKILL every process in `ns` until none is left (a dying parent may have forked); returns their pids."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while pids := [p for p in ns_pids(ns) if alive(p)]:
        assert time.monotonic() < deadline, f"processes in {ns} survive SIGKILL: {pids}"
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        killed += pids
        wait_gone(pids, min(1.0, max(0.0, deadline - time.monotonic())))
    return killed


def reap_dead_runs() -> None:
    """Remove namespaces a killed test run left (cvb<pid>-... whose pid no longer runs)."""
    for ns in namespaces():
        m = re.fullmatch(rf"{PREFIX}(\d+)-\d+-.+", ns)
        if m and not alive(int(m.group(1))):
            kill_ns(ns)
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", ns)


@dataclass
class Host:
    name: str  # in the test: driver, worker0, ...
    ns: str  # its network namespace
    ip: str
    port: str  # its veth end on the bridge (in the switch namespace)
    up: bool = True  # False once killed or cut off, until rebooted


@dataclass
class NetBed:
    """Hosts (network namespaces) on one bridge, and the processes started in them."""

    prefix: str
    switch: str  # the namespace holding the bridge `br0`
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[Daemon] = field(default_factory=list)  # every process started in the bed, in order

    @classmethod
    def create(cls, names: list[str]) -> NetBed:
        """Namespaces for `names` (in that order: 10.77.N.10, .11, ...) on a bridge; BedUnavailable if not possible."""
        if why := "not Linux" if sys.platform != "linux" else "not root" if os.geteuid() != 0 else None:
            raise BedUnavailable(f"network namespaces need Linux, root and `ip` (iproute2): {why}")
        if shutil.which("ip") is None:
            raise BedUnavailable("network namespaces need Linux, root and `ip` (iproute2): no `ip` command")
        reap_dead_runs()
        prefix = f"{PREFIX}{os.getpid()}-{next(_SEQ)}"
        bed = cls(prefix, f"{prefix}-switch")
        try:
            ip("netns", "add", bed.switch)
        except RuntimeError as e:
            raise BedUnavailable(f"cannot create a network namespace: {e}") from None
        try:
            ip("-n", bed.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", bed.switch, "link", "set", "br0", "up")
            subnet = f"10.77.{random.randrange(256)}"  # private to the bed: its switch is its own
            for i, name in enumerate(names):
                bed.hosts[name] = Host(name, f"{prefix}-{name}", f"{subnet}.{10 + i}", f"p{i}")
                bed._plug(bed.hosts[name])
        except BaseException:
            bed.close()
            raise
        return bed

    def _plug(self, h: Host) -> None:
        """Make `h`'s namespace: loopback up, eth0 with its address (no default route), cabled to the bridge."""
        ip("netns", "add", h.ns)
        ip("-n", h.ns, "link", "set", "lo", "up")
        # a fixed MAC, as a real host keeps across reboots: else peers' stale ARP entries stall connections for ~30 s
        mac = "02:00:" + ":".join(f"{int(b):02x}" for b in h.ip.split("."))
        ip("-n", self.switch, "link", "add", h.port, "type", "veth", "peer", "name", "eth0", "address", mac, "netns", h.ns)
        ip("-n", h.ns, "addr", "add", f"{h.ip}/24", "dev", "eth0")
        ip("-n", h.ns, "link", "set", "eth0", "up")
        ip("-n", self.switch, "link", "set", h.port, "master", "br0", "up")
        h.up = True

    def all_ns(self) -> list[str]:
        return [self.switch, *(h.ns for h in self.hosts.values())]

    def argv(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run in `host`'s namespace (`ip netns exec` execs it: same pid)."""
        return ["ip", "netns", "exec", self.hosts[host].ns, *argv]

    def spawn(self, host: str, name: str, argv: list[str], env: dict[str, str], log: Path) -> Daemon:
        """Start `argv` on `host` in a session of its own, output to `log`; recorded, killed at `close()` at the latest."""
        with open(log, "wb") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                self.argv(host, argv),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append(d := Daemon(name, proc, log, 0))
        return d

    def run(self, host: str, argv: list[str], timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """Run a short command on `host` and wait for it (bounded: TimeoutExpired)."""
        return subprocess.run(self.argv(host, argv), capture_output=True, text=True, timeout=timeout)

    def connectable(self, host: str, ip_: str, port: int) -> bool:
        """Whether a TCP connection from `host` to ip_:port is accepted (within 2 s)."""
        try:
            return self.run(host, [sys.executable, "-S", "-c", CONNECT, ip_, str(port)]).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def set_link(self, host: str, up: bool) -> None:
        """Plug (`up`) or pull `host`'s cable at the switch: pulled, its peers hear nothing from it."""
        ip("-n", self.switch, "link", "set", self.hosts[host].port, "up" if up else "down")
        self.hosts[host].up = up

    def kill_pid(self, pid: int) -> list[int]:
        """SIGKILL `pid` with all its descendants and wait until they are gone; returns their pids."""
        procs = [d.proc for d in self.procs if d.proc.pid == pid]
        if procs:
            pids = kill_tree(procs[0])  # also reaps it
        else:
            pids = process_tree(pid)
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
        left = wait_gone(pids, GONE_TIMEOUT_S)
        assert not left, f"still running {GONE_TIMEOUT_S:.0f} s after SIGKILL: {left}"
        return pids

    def kill_host(self, host: str) -> list[int]:
        """A crash of `host`: its cable pulled, then every process on it SIGKILLed (bounded wait); returns their pids."""
        self.set_link(host, False)
        killed = kill_ns(self.hosts[host].ns)
        self._reap()
        return killed

    def reboot_host(self, host: str) -> None:
        """`host` afresh: whatever runs on it killed, its namespace (and so its sockets) deleted and made again, cabled."""
        h = self.hosts[host]
        if h.up:
            self.set_link(host, False)
        kill_ns(h.ns)
        self._reap()
        ip("-n", self.switch, "link", "del", h.port)  # both ends: the name is free again at once
        ip("netns", "del", h.ns)
        self._plug(h)

    def _reap(self) -> None:
        for d in self.procs:
            d.proc.poll()  # waits for our children that died: no zombies

    def close(self) -> list[str]:
        """Kill every process of the bed, delete links and namespaces; returns what is left over (nothing, normally)."""
        problems: list[str] = []
        killed = [p for d in self.procs for p in kill_tree(d.proc)]
        for ns in self.all_ns():
            try:
                killed += kill_ns(ns)
            except AssertionError as e:
                problems.append(str(e))
        if left := wait_gone(killed, GONE_TIMEOUT_S):
            problems.append(f"processes still running: {left}")
        for h in self.hosts.values():
            with contextlib.suppress(RuntimeError):
                ip("-n", self.switch, "link", "del", h.port)
        for ns in self.all_ns():
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", ns)
        if left_ns := [ns for ns in namespaces() if ns.startswith(f"{self.prefix}-")]:
            problems.append(f"namespaces left: {left_ns}")
        return problems


def unavailable(reason: str) -> NoReturn:
    """No namespaces here: fail in CI (nothing may be skipped there), else skip."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"the multi-host bed cannot be made: {reason}")
    pytest.skip(f"the multi-host bed cannot be made: {reason}")
