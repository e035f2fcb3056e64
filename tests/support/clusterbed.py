"""`ClusterBed`: a Spark standalone cluster and queue servers on a `NetBed` (tests/support/netbed.py).

A Spark master on `driver`, a Spark worker (1 core, 1 GB) on each `worker<i>`, `conveyor serve` on
each `server<i>` (fixed ports: each host has its own); `gpu0`, a host whose worker, with GPUs a
discovery script declares, runs only while a test starts it (`start_gpu_worker`). Faults (`kill_host`, `stop_server`, ...) and
`repair()` (back to the start state) let tests share one bed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from pyspark.find_spark_home import _find_spark_home

from tests.support.netbed import ROOT, NetBed, ns_pids
from tests.support.procs import Daemon, kill_tree, process_tree, tail, wait_until

GPU_HOST = "gpu0"
START_TIMEOUT_S = 120.0  # JVMs start in ~5-10 s, far slower when several start at once on 2 cores
MASTER_PORT, MASTER_UI_PORT, WORKER_UI_PORT, SERVER_PORT = 7077, 8080, 8081, 7070
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
FETCH = "import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=2).read().decode())"


def running(d: Daemon | None) -> TypeGuard[Daemon]:
    return d is not None and d.proc.poll() is None


@dataclass
class ClusterBed:
    """A Spark standalone cluster and queue servers on a NetBed.

    Hosts `driver` (the master, and the test's Spark driver), `worker<i>`, `server<i>`. Logs, work
    and data directories live under `base`.
    """

    net: NetBed
    base: Path
    token: str
    worker_timeout_s: int  # the master drops a silent worker after this long (Spark's default: 60)
    master: Daemon | None = None
    workers: list[Daemon | None] = field(default_factory=list)
    servers: list[Daemon | None] = field(default_factory=list)
    worker_ports: list[int] = field(default_factory=list)  # each start a new one: the master sees a new worker
    _starts: Counter[str] = field(default_factory=Counter)

    @classmethod
    def start(cls, base: Path, token: str, *, n_workers: int = 2, n_servers: int = 2, worker_timeout_s: int = 10) -> ClusterBed:
        """Make the hosts and start everything (servers with the master, then the workers); waits until all serve."""
        names = ["driver", *(f"worker{i}" for i in range(n_workers)), *(f"server{i}" for i in range(n_servers)), GPU_HOST]
        (base / "logs").mkdir(parents=True, exist_ok=True)
        bed = cls(
            NetBed.create(names), base, token, worker_timeout_s, None, [None] * n_workers, [None] * n_servers, [7100] * n_workers
        )
        try:
            bed.repair()
        except BaseException:
            bed.close()
            raise
        return bed

    def ip(self, host: str) -> str:
        return self.net.hosts[host].ip

    @property
    def master_url(self) -> str:
        return f"spark://{self.ip('driver')}:{MASTER_PORT}"

    @property
    def server_addresses(self) -> list[str]:
        return [f"tcp://{self.ip(f'server{i}')}:{SERVER_PORT}" for i in range(len(self.servers))]

    def env(self, host: str) -> dict[str, str]:
        """The environment of a process on `host`: Spark binds its IP, Python workers run this interpreter and checkout."""
        env = {k: v for k, v in os.environ.items() if k not in ("CONVEYOR_TOKEN", "SPARK_LOCAL_HOSTNAME")}
        path = [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        return {
            **env,
            "SPARK_HOME": _find_spark_home(),
            "SPARK_LOCAL_IP": self.ip(host),
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # no REST server: it would take port 6066
            # master and workers: a worker heartbeats every timeout/4
            "SPARK_DAEMON_JAVA_OPTS": f"-Dspark.worker.timeout={self.worker_timeout_s}",
            "SPARK_LOG_DIR": str(self.base / "logs"),
            "SPARK_WORKER_DIR": str(self.base / f"work-{host}"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(path),
            "PYTHONUNBUFFERED": "1",
        }

    def spawn(self, host: str, name: str, argv: list[str], env: dict[str, str] | None = None) -> Daemon:
        """Start `argv` on `host` with `env(host)` (plus `env`), logged to base/logs/<name>.<n>.log."""
        self._starts[name] += 1
        log = self.base / "logs" / f"{name}.{self._starts[name]}.log"
        return self.net.spawn(host, name, argv, {**self.env(host), **(env or {})}, log)

    def _spark(self, host: str, name: str, args: list[str]) -> Daemon:
        return self.spawn(host, name, [str(Path(_find_spark_home()) / "bin" / "spark-class"), *args])

    # --- the daemons ------------------------------------------------------------------------------
    def start_master(self) -> None:
        """Start the Spark master on `driver` (without waiting: see `wait_master`)."""
        self.master = self._spark(
            "driver",
            "master",
            [MASTER_CLASS, "--host", self.ip("driver"), "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT)],
        )

    def start_worker(self, i: int, wait: bool = True) -> None:
        """Start the Spark worker of `worker<i>` (on a new port: a new worker to the master); `wait`: until ALIVE."""
        host = f"worker{i}"
        self.worker_ports[i] += 1
        self.workers[i] = self._spark(
            host,
            host,
            [
                WORKER_CLASS,
                self.master_url,
                "--host",
                self.ip(host),
                "--port",
                str(self.worker_ports[i]),
                "--webui-port",
                str(WORKER_UI_PORT),
                "--cores",
                "1",
                "--memory",
                "1g",
                "--work-dir",
                str(self.base / f"work-{host}"),
            ],
        )
        if wait:
            self.wait_workers(exact=False)

    def start_gpu_worker(self, cores: int, gpus: int) -> Daemon:
        """Start a Spark worker on `gpu0` with `cores` and `gpus` GPUs ("0", "1", ...), and wait until it is ALIVE.

        Its GPUs are what a discovery script says, as on a real GPU host. Not one of the bed's
        daemons: the test's sweep stops it.
        """
        script = self.base / "gpus.sh"
        addresses = ", ".join(f'"{i}"' for i in range(gpus))
        script.write_text(f'#!/bin/sh\necho \'{{"name": "gpu", "addresses": [{addresses}]}}\'\n')
        script.chmod(0o755)
        port = 7200
        opts = f"-Dspark.worker.resource.gpu.amount={gpus} -Dspark.worker.resource.gpu.discoveryScript={script}"
        argv = [
            str(Path(_find_spark_home()) / "bin" / "spark-class"),
            WORKER_CLASS,
            self.master_url,
            *("--host", self.ip(GPU_HOST), "--port", str(port), "--webui-port", str(WORKER_UI_PORT)),
            *("--cores", str(cores), "--memory", "1g", "--work-dir", str(self.base / f"work-{GPU_HOST}")),
        ]
        worker = self.spawn(GPU_HOST, GPU_HOST, argv, {"SPARK_WORKER_OPTS": opts})
        ready = lambda: (self.ip(GPU_HOST), port) in self.alive_workers()  # noqa: E731
        wait_until("the GPU worker ALIVE", ready, [w for w in [self.master, worker] if w], START_TIMEOUT_S, self.logs)
        return worker

    def start_server(self, i: int, wait: bool = True) -> None:
        """Start `conveyor serve` on `server<i>`: same address, port and data directory each time; `wait`: until it serves."""
        host, data = f"server{i}", self.base / f"data-server{i}"
        data.mkdir(exist_ok=True)
        self.servers[i] = self.spawn(
            host,
            host,
            [
                sys.executable,
                "-m",
                "conveyor",
                "serve",
                "--host",
                self.ip(host),
                "--port",
                str(SERVER_PORT),
                "--token",
                self.token,
                "--data-dir",
                str(data),
            ],
        )
        if wait:
            self.wait_server(i)

    def stop_server(self, i: int) -> list[int]:
        """SIGKILL the queue server of `server<i>` (the host stays up); returns the pids killed."""
        d = self.servers[i]
        return self.net.kill_pid(d.proc.pid) if running(d) else []

    def kill_pid(self, pid: int) -> list[int]:
        """SIGKILL one process of the bed with its descendants (see NetBed.kill_pid)."""
        return self.net.kill_pid(pid)

    def kill_host(self, host: str) -> list[int]:
        """Crash `host` (see NetBed.kill_host); `repair()` or `restart_worker` brings it back."""
        return self.net.kill_host(host)

    def restart_worker(self, i: int) -> None:
        """`worker<i>` back: rebooted if it was killed or cut off, its worker started; waits until it is ALIVE."""
        host = f"worker{i}"
        if not self.net.hosts[host].up:
            self.net.reboot_host(host)
        elif running(w := self.workers[i]):
            self.net.kill_pid(w.proc.pid)
        self.start_worker(i)

    # --- waiting ----------------------------------------------------------------------------------
    def master_state(self) -> dict[str, Any] | None:
        """The master's state (its web UI's /json/, fetched on `driver`), or None while it does not answer."""
        try:
            r = self.net.run("driver", [sys.executable, "-S", "-c", FETCH, f"http://{self.ip('driver')}:{MASTER_UI_PORT}/json/"])
            return json.loads(r.stdout) if r.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            return None

    def alive_workers(self) -> set[tuple[str, int]]:
        """(ip, port) of the workers the master holds ALIVE."""
        state = self.master_state() or {}
        return {(w["host"], int(w["port"])) for w in state.get("workers", []) if w["state"] == "ALIVE"}

    def wait_master(self) -> None:
        ready = lambda: (self.master_state() or {}).get("status") == "ALIVE"  # noqa: E731
        wait_until("the master", ready, [d for d in [self.master] if d], START_TIMEOUT_S, self.logs)

    def wait_workers(self, exact: bool = True) -> None:
        """Until the master holds every running worker ALIVE (`exact`: and no other, e.g. one of a killed host)."""
        want = {(self.ip(f"worker{i}"), self.worker_ports[i]) for i, w in enumerate(self.workers) if running(w)}
        ready = lambda: (have := self.alive_workers()) == want or (not exact and want <= have)  # noqa: E731
        what = f"ALIVE workers {sorted(want)}" + (" (only)" if exact else "")
        wait_until(what, ready, [w for w in [self.master, *self.workers] if w], START_TIMEOUT_S, self.logs)

    def wait_server(self, i: int) -> None:
        """Until `server<i>` says it listens and accepts a connection from `driver`."""
        d, ip_ = self.servers[i], self.ip(f"server{i}")
        assert d is not None
        ready = lambda: "listening on" in tail(d.log) and self.net.connectable("driver", ip_, SERVER_PORT)  # noqa: E731
        wait_until(f"server{i}", ready, [d], START_TIMEOUT_S, self.logs)

    # --- the whole bed ----------------------------------------------------------------------------
    def repair(self) -> None:
        """Back to the start state, waiting until every server serves and every worker is ALIVE.

        Hosts killed or cut off are rebooted and dead daemons started again (all in parallel as far
        as they allow); then it waits until every server serves and the master holds exactly the
        workers ALIVE.
        """
        for h in self.net.hosts.values():
            if not h.up:
                self.net.reboot_host(h.name)
        if not running(self.master):
            for lost in filter(running, self.workers):  # workers of a lost master: start afresh with the new one
                self.net.kill_pid(lost.proc.pid)
            self.start_master()
        started = [i for i, s in enumerate(self.servers) if not running(s)]
        for i in started:
            self.start_server(i, wait=False)
        self.wait_master()
        for i, w in enumerate(self.workers):
            if not running(w):
                self.start_worker(i, wait=False)
        for i in started:
            self.wait_server(i)
        self.wait_workers(exact=True)

    def sweep(self) -> list[int]:
        """Kill what tests started (drivers, ...): every process of the bed but its daemons; returns their pids."""
        daemons = list(filter(running, [self.master, *self.workers, *self.servers]))
        keep = {p for d in daemons for p in process_tree(d.proc.pid)}
        killed = [p for d in self.net.procs if d not in daemons for p in kill_tree(d.proc)]
        for h in self.net.hosts.values():
            for p in ns_pids(h.ns):
                if p not in keep:
                    killed += self.net.kill_pid(p)
        return killed

    def logs(self) -> str:
        """The ends of the daemons' last logs (for failure messages)."""
        return "\n".join(f"--- {d.name} ({d.log}) ---\n{tail(d.log)}" for d in [self.master, *self.workers, *self.servers] if d)

    def close(self) -> list[str]:
        return self.net.close()
