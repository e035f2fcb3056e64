"""Benchmark of Conveyor's workers end to end against `concurrent.futures.ProcessPoolExecutor.map`.

Two reference workloads, on a `QueuePool.local` of 2 durable servers and a `ConsumerPool` of 2
consumer processes (started before timing, as the executor's processes are):

- no-op: publish `--n` (200,000) no-op tasks with ~100-byte payloads, then wait until drained,
  with the consumers' default settings and tuned (512 threads per consumer, fetching up to 1,000
  at a time);
  throughput = tasks / (publish start to drained). Baseline: `ProcessPoolExecutor(2).map` of a
  no-op function over the same payloads, with the best chunksize of several tried.
- skewed: 2,000 CPU busy-loops summing to 10 s (`bench/workloads.py`), with the default settings
  and each of the tuned ones below (threads, pinned or not; processes);
  efficiency = total work / (2 workers x makespan). Baseline: `ProcessPoolExecutor.map` over
  the same durations, with the best chunksize (and 2 or 4 processes) of those tried.

Each figure is the median of `--runs`; ratios are of the medians. The machine is small and noisy:
compare ratios, not single times.

With --busy, everything is measured beside one CPU-bound background process (a busy machine), and
the report gives the figures and the ratios to the baselines without the quiet machine's targets.

    python bench/bench_workers.py [--quick] [--fsync batch|interval] [--runs 3] [--busy]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import bench_tasks
from benchlib import Row, busy_machine, make_console, number, print_report, progress, quiet_target, rate, ratio
from compat import QueuePool, consumer_keywords, sharded
from conveyor.worker import ConsumerPool
from workloads import NOOP_PAYLOAD, busy, noop, skewed

WORKERS = 2
PUBLISH_BATCH = 10_000
# skewed: 8 threads fetching 8 at a time keep a core busy while a fetch is out (and all 8 run at
# once: nothing waits behind a long task); pinned, each consumer keeps its threads on one core,
# fetches whole batches while one still runs (32 threads fetching 16 at a time, or 64 fetching 32:
# fewer requests) and holds fewer as the queue drains; 2 processes per consumer run tasks truly
# in parallel
# no-op: a consumer fetches at most what its free slots can start, so many slots mean large fetches
# (measured, medians of 3: 128 slots ~52k tasks/s, 256 ~58k, 512 ~64k, 1,000 ~65k)
NOOP_CONFIG: dict[str, Any] = {"pool": "thread", "concurrency": 512, "batch_size": 1000}
SKEWED_CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},  # as a new user runs it: 2 consumers on 2 cores pin, 8 threads, read-ahead
    "thread x8": {"pool": "thread", "concurrency": 8, "batch_size": 8},
    "thread x32 pinned": {"pool": "thread", "concurrency": 32, "batch_size": 16, "pin_core": True},
    "thread x64 pinned": {"pool": "thread", "concurrency": 64, "batch_size": 32, "pin_core": True},
    "process x2": {"pool": "process", "concurrency": 2, "batch_size": 2},
}


def _started(pool: QueuePool, n: int) -> None:
    deadline = time.monotonic() + 60
    while len(sharded(pool).workers()) < n:
        if time.monotonic() > deadline:
            raise RuntimeError("consumers did not start within 60 s")
        time.sleep(0.05)


def conveyor_run(fsync: str, publish: Callable[[QueuePool], None], **consumer: Any) -> float:
    """Seconds from the first publish to the queue drained, on fresh servers and consumers."""
    with QueuePool.local(n_servers=2, fsync=fsync) as pool:
        cp = ConsumerPool(pool, WORKERS, queues=["bench"], task_modules=["bench_tasks"], **consumer_keywords(consumer)).start()
        try:
            _started(pool, WORKERS)
            t0 = time.perf_counter()
            publish(pool)
            st = pool.join("bench", progress=False)["bench"]
            dt = time.perf_counter() - t0
            if st.failed:
                raise RuntimeError(f"{st.failed} tasks failed")
        finally:
            cp.cancel()
    return dt


def executor_run(fn: Callable[[Any], Any], items: list[Any], chunksize: int, workers: int = WORKERS) -> float:
    with ProcessPoolExecutor(workers) as ex:
        list(ex.map(fn, range(workers)))  # processes started and warm, like the consumers
        t0 = time.perf_counter()
        for _ in ex.map(fn, items, chunksize=chunksize):
            pass
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="no-op tasks (default 200,000)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--fsync",
        choices=["batch", "interval"],
        default="interval",
        help="the servers' fsync policy (default interval, as in the store benchmark)",
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 20,000 no-op tasks, 500 skewed items, 1 run")
    ap.add_argument("--busy", action="store_true", help="busy machine: one CPU-bound background process throughout")
    args = ap.parse_args(argv)
    n = args.n or (20_000 if args.quick else 200_000)
    runs = 1 if args.quick else args.runs
    durations = skewed()[: 500 if args.quick else None]
    work = sum(durations)
    out = make_console()
    out.print(
        f"Python {platform.python_version()}, {platform.platform()}, {os.cpu_count()} CPUs; {WORKERS} consumers on "
        f"2 servers (fsync={args.fsync}); no-op x {n:,}; skewed x {len(durations):,} = {work:.1f} s of work; "
        f"{runs} run(s)" + ("; BUSY: one CPU-bound background process" if args.busy else "")
    )
    payloads = [NOOP_PAYLOAD] * n

    def publish_noop(pool: QueuePool) -> None:
        """As a producer streams work: batches of PUBLISH_BATCH, so consumers start while it goes on."""
        for i in range(0, n, PUBLISH_BATCH):
            bench_tasks.noop.publish_many([(x,) for x in payloads[i : i + PUBLISH_BATCH]], _pool=pool)

    fig: dict[str, list[float]] = {}

    def record(name: str, v: float) -> None:
        fig.setdefault(name, []).append(v)
        progress(f"  {name}: {v:,.3f}")

    def measure(run: int) -> None:
        progress(f"run {run}/{runs}: no-op through conveyor")
        record("noop conveyor defaults", n / conveyor_run(args.fsync, publish_noop))
        record("noop conveyor", n / conveyor_run(args.fsync, publish_noop, **NOOP_CONFIG))
        progress(f"run {run}/{runs}: no-op through ProcessPoolExecutor.map")
        best = max(n / executor_run(noop, payloads, c) for c in (100, 1000, 10_000))
        record("noop executor", best)
        progress(f"run {run}/{runs}: skewed through conveyor")
        items = [(d,) for d in durations]
        for label, options in SKEWED_CONFIGS.items():
            dt = conveyor_run(args.fsync, lambda p, items=items: bench_tasks.spin.publish_many(items, _pool=p), **options)
            record(f"skewed conveyor {label}", work / (WORKERS * dt))
        progress(f"run {run}/{runs}: skewed through ProcessPoolExecutor.map")
        best = max(work / (WORKERS * executor_run(busy, durations, c, w)) for c in (1, 4, 16, 64) for w in (2, 4))
        record("skewed executor", best)

    with busy_machine(args.busy):
        for run in range(1, runs + 1):
            measure(run)
    progress("done")

    med = statistics.median
    skew_best = max(SKEWED_CONFIGS, key=lambda k: med(fig[f"skewed conveyor {k}"]))

    def vs(a: str, b: str) -> Row:
        return Row(
            "  conveyor / executor",
            [x / y for x, y in zip(fig[a], fig[b], strict=True)],
            ratio,
            value=med(fig[a]) / med(fig[b]),
            note="of the medians (runs: per run)",
        )

    at_least = functools.partial(quiet_target, args.busy, ">=")  # a quiet machine's targets
    best = f"skewed conveyor {skew_best}"
    rows = [
        Row(
            "no-op: conveyor, default settings (2 consumers, 2 servers)", fig["noop conveyor defaults"], rate, *at_least(100_000)
        ),
        Row("no-op: conveyor, 512 threads fetching 1,000", fig["noop conveyor"], rate, *at_least(50_000)),
        Row("no-op: ProcessPoolExecutor.map, best chunksize", fig["noop executor"], rate, note="baseline"),
        vs("noop conveyor", "noop executor"),
        Row("skewed: conveyor, default settings", fig["skewed conveyor defaults"], number, *at_least(0.95)),
        *(
            Row(f"skewed: conveyor, {k} per consumer", fig[f"skewed conveyor {k}"], number)
            for k in SKEWED_CONFIGS
            if k != "defaults"
        ),
        Row(f"skewed: conveyor, best ({skew_best})", fig[best], number, *at_least(0.95)),
        Row("skewed: ProcessPoolExecutor.map, best", fig["skewed executor"], number, note="baseline: chunksize 1-64, 2 or 4"),
        vs(best, "skewed executor"),
    ]
    return print_report(out, f"Worker benchmark: medians of {runs} run(s); efficiency = work / ({WORKERS} x makespan)", rows)


if __name__ == "__main__":
    sys.exit(main())
