"""Benchmark of Conveyor's queue servers over loopback TCP against the targets of the server issue.

No-op workload: `--n` messages (default 200,000) of ~100-byte payloads in batches of 1,000,
each server a separate `conveyor serve` process with a fresh data directory (durable queues):

- 1 server, one blocking client: `put` batch after batch (each answered before the next is sent),
  the same puts pipelined (16 batches in flight on one connection), then `get(1000)` + `ack` until
  drained;
- 2 servers through one `QueuePool`: one `pool.put` of all n messages (batches round-robin over
  the shards, pipelined per shard, the shards in parallel);
- 1 server over TLS (`--tls-cert`, a self-signed certificate the client pins): the same puts and
  get + ack, against plain TCP in the same run (target: at least 0.7x);
- 1 server with its Prometheus metrics on (`--metrics-port`) and scraped every second, and a
  `conveyor dashboard` process polling it every second (its page read every second): the same puts and get + ack,
  against the server without them (target: within 5%);
- the baseline, in this process: a `DurableStore` under the same fsync policy, put and get + ack
  with no network, so the ratio server / in-process is the price of the network and the protocol.

Both fsync policies are measured: "batch" (the server's default: a put is answered once on disk,
concurrent writes share an fsync) and "interval". The targets apply to "batch", the stricter one.
Runs are interleaved and each figure is the median of `--runs`.

    python bench/bench_server.py            # full run (about a minute)
    python bench/bench_server.py --quick    # smoke run: 50,000 messages, 1 run
    python bench/bench_server.py --no-tls   # without the TLS runs
    python bench/bench_server.py --no-metrics  # without the metrics runs (a revision without them)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from benchlib import Row, make_console, print_report, progress, rate, ratio
from compat import QueueClient, QueuePool, calls, spawn_server, stop_server
from conveyor.message import Message
from conveyor.storage import DurableStore

BATCH = 1_000
PAYLOAD_BYTES = 100
LEASE_S = 3600.0
POLICIES = ("batch", "interval")


def batch_of_messages() -> list[Message]:
    return [Message(payload=(b"%06d-" % i).ljust(PAYLOAD_BYTES, b"x")) for i in range(BATCH)]


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def drain(get: Callable[[], list[Message]], ack: Callable[[list[int]], object]) -> int:
    n = 0
    while got := get():
        ack([m.id for m in got])
        n += len(got)
    return n


class Scraper:
    """Reads a server's metrics every second, as Prometheus would, beside a dashboard.

    The dashboard (`conveyor dashboard`, a process of its own, as a user runs it) polls the server
    every second, and its page is read every second.
    """

    def __init__(self, url: str, address: str) -> None:
        self.url, self.address, self.scrapes, self._stop = url, address, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._board: subprocess.Popen[str] | None = None
        self._board_url = ""

    def _run(self) -> None:
        while not self._stop.is_set():
            with urllib.request.urlopen(self.url, timeout=30) as r:
                if b"conveyor_queue_put_total" not in r.read() and self.scrapes:
                    raise RuntimeError("a scrape without the queues' counters")
            with urllib.request.urlopen(self._board_url + "api/overview", timeout=30) as r:
                r.read()
            self.scrapes += 1
            self._stop.wait(1.0)

    def __enter__(self) -> Scraper:
        cmd = [sys.executable, "-m", "conveyor", "dashboard", "--connect", self.address, "--port", "0"]
        self._board = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self._board.stdout is not None
        line = self._board.stdout.readline().split()  # "dashboard on URL"
        if line[:2] != ["dashboard", "on"]:
            self.__exit__()
            raise RuntimeError(f"conveyor dashboard did not start: {line}")
        self._board_url = line[2]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)
        if self._board is not None:
            self._board.terminate()
            self._board.wait(30)
            assert self._board.stdout is not None
            self._board.stdout.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_server(
    root: Path, fsync: str, n: int, batch: list[Message], tls: tuple[Path, Path, str] | None = None, metrics: bool = False
) -> dict[str, float]:
    secure = [] if tls is None else ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    port = free_port() if metrics else None
    extra = [] if port is None else ["--metrics-port", str(port)]
    proc, address = spawn_server(root / f"one-{fsync}", args=["--fsync", fsync, "--lease", str(LEASE_S), *secure, *extra])
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics", address) if port is not None else contextlib.nullcontext()
    try:
        with scraper, QueueClient(address, timeout=120, **({} if tls is None else {"fingerprint": tls[2]})) as c:
            c.ping()
            k = n // BATCH
            t_put = timed(lambda: [c.put("seq", batch) for _ in range(k)])
            t_pipe = timed(lambda: c.pipeline([calls.put("pipe", batch) for _ in range(k)]))
            got = [0]
            t_get = timed(lambda: got.__setitem__(0, drain(lambda: c.get("seq", BATCH), lambda ids: c.ack("seq", ids))))
            if got[0] != k * BATCH or c.stats("seq")["seq"].acked != k * BATCH:
                raise RuntimeError(f"drained {got[0]} of {k * BATCH}")
    finally:
        stop_server(proc)
    if isinstance(scraper, Scraper) and scraper.scrapes < 1:
        raise RuntimeError("the metrics were never scraped")
    tag = "metrics " if metrics else "" if tls is None else "tls "
    return {f"{tag}put": k * BATCH / t_put, f"{tag}put pipelined": k * BATCH / t_pipe, f"{tag}get + ack": k * BATCH / t_get}


def one_server_tls(root: Path, fsync: str, n: int, batch: list[Message]) -> dict[str, float]:
    from conveyor.protocol.tls import self_signed

    return one_server(root, fsync, n, batch, self_signed(root / "cert", ["127.0.0.1"]))


def one_server_metrics(root: Path, fsync: str, n: int, batch: list[Message]) -> dict[str, float]:
    return one_server(root, fsync, n, batch, metrics=True)


def two_servers(root: Path, fsync: str, n: int, batch: list[Message]) -> dict[str, float]:
    everything = batch * (n // BATCH)
    with QueuePool.local(n_servers=2, data_dir=root / f"pool-{fsync}", fsync=fsync) as pool:
        pool.stats()  # connected
        t = timed(lambda: pool.put("q", everything))
        if pool.stats("q")["q"].ready != len(everything):
            raise RuntimeError("pool lost messages")
    return {"pool put": len(everything) / t}


def in_process(root: Path, fsync: str, n: int, batch: list[Message]) -> dict[str, float]:
    with DurableStore(root / f"store-{fsync}", fsync=fsync) as s:  # type: ignore[arg-type]
        k = n // BATCH
        t_put = timed(lambda: [s.put(batch) for _ in range(k)])
        t_get = timed(lambda: drain(lambda: s.get(BATCH, LEASE_S), s.ack_many))
    return {"store put": k * BATCH / t_put, "store get + ack": k * BATCH / t_get}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="messages per run (default 200,000)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each measurement (default 3)")
    ap.add_argument("--dir", type=Path, default=None, help="where to make the temporary data directories")
    ap.add_argument("--quick", action="store_true", help="smoke run: 50,000 messages, 1 run")
    ap.add_argument("--no-tls", action="store_true", help="skip the TLS runs (a revision without TLS: bench/compare.py)")
    ap.add_argument("--no-metrics", action="store_true", help="skip the metrics runs (a revision without them)")
    args = ap.parse_args(argv)
    n = args.n or (50_000 if args.quick else 200_000)
    runs = 1 if args.quick else args.runs
    if n < BATCH or runs < 1:
        ap.error("--n must be at least 1,000 and --runs positive")
    out = make_console()
    out.print(
        f"Python {platform.python_version()}, {platform.platform()}, {os.cpu_count()} CPUs; {n:,} messages "
        f"of {PAYLOAD_BYTES} B in batches of {BATCH:,}, {runs} run(s)" + ("  [QUICK]" if args.quick else "")
    )
    batch = batch_of_messages()
    figs: dict[tuple[str, str], list[float]] = {}
    root = Path(tempfile.mkdtemp(prefix="conveyor-bench-server-", dir=args.dir))
    try:
        for run in range(1, runs + 1):
            for fsync in POLICIES:
                steps = (
                    one_server,
                    *([] if args.no_tls else [one_server_tls]),
                    *([] if args.no_metrics else [one_server_metrics]),
                    two_servers,
                    in_process,
                )
                for step in steps:
                    progress(f"run {run}/{runs}, fsync={fsync}: {step.__name__.replace('_', ' ')}")
                    for name, v in step(root, fsync, n, batch).items():
                        figs.setdefault((fsync, name), []).append(v)
                        progress(f"  {name}: {v:,.0f}/s")
                    shutil.rmtree(root, ignore_errors=True)
                    root.mkdir()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    progress("done")

    med = statistics.median
    rows: list[Row] = []
    for fsync in POLICIES:
        targets = {"put": 200_000, "get + ack": 100_000, "pool put": 300_000} if fsync == "batch" else {}
        f = {name: figs[(fsync, name)] for (p, name) in figs if p == fsync}
        for name, label in (
            ("put", "1 server: put"),
            ("put pipelined", "1 server: put, 16 in flight"),
            ("get + ack", "1 server: get + ack"),
            ("pool put", "2 servers, 1 pool: put"),
        ):
            t = targets.get(name)
            rows.append(Row(f"{label} (fsync={fsync})", f[name], rate, ">=" if t else "", t or 0.0))
        for name in ("put", "get + ack") if not args.no_tls else ():
            rows.append(Row(f"1 server over TLS: {name} (fsync={fsync})", f[f"tls {name}"], rate))
            per_run = [a / b for a, b in zip(f[f"tls {name}"], f[name], strict=True)]
            rows.append(
                Row(
                    f"  TLS / plain TCP {name}",
                    per_run,
                    ratio,
                    ">=",
                    0.7,
                    value=med(f[f"tls {name}"]) / med(f[name]),
                    note="of the medians (runs: per run)",
                )
            )
        for name in ("put", "put pipelined", "get + ack") if not args.no_metrics else ():
            rows.append(Row(f"1 server, metrics + dashboard every 1 s: {name} (fsync={fsync})", f[f"metrics {name}"], rate))
            per_run = [a / b for a, b in zip(f[f"metrics {name}"], f[name], strict=True)]
            rows.append(
                Row(
                    f"  metrics + dashboard on / off {name}",
                    per_run,
                    ratio,
                    ">=",
                    0.95,
                    value=med(f[f"metrics {name}"]) / med(f[name]),
                    note="of the medians (runs: per run)",
                )
            )
        for name, base in (("put", "store put"), ("get + ack", "store get + ack")):
            rows.append(Row(f"  in-process DurableStore {name}", f[base], rate, note=f"baseline, fsync={fsync}"))
            rows.append(
                Row(
                    f"  server / in-process {name}",
                    [a / b for a, b in zip(f[name], f[base], strict=True)],
                    ratio,
                    value=med(f[name]) / med(f[base]),
                    note="of the medians (runs: per run)",
                )
            )
    return print_report(out, f"Server benchmark: medians of {runs} run(s)", rows)


if __name__ == "__main__":
    sys.exit(main())
