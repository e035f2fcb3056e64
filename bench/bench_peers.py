"""Conveyor against daskqueue 0.2 (the system it succeeds) on daskqueue's own benchmark shape.

For each N (10,000 and 100,000 by default): N no-op tasks are submitted to 2 transient queues, then 2
consumers are started and timed until their pool's join returns. Both systems run in the same run,
in turns, on the same machine:

- daskqueue: a new local dask cluster of 2 worker processes (1 thread each, `direct_to_workers`), a
  `QueuePool` of 2 transient queues and a `ConsumerPool` of 2 consumer actors fetching 100 messages at
  a time (`batch_size=100`, its best here; its default of 1 drains ~20x slower), made before the
  timing; `batch_submit` of N `(noop,)` calls (a no-op of an importable module, so that dask pickles
  it by reference, not by value for every task), then the consumers started, joined (`timestep=0.1`)
  and their results taken, as in daskqueue's `benchmark/benchmark_queuepool.py`;
- Conveyor: `QueuePool.local` of 2 transient servers and a `ConsumerPool` of 2 consumers (its
  defaults), made before the timing (its fork server starts then); `noop.publish_many` of N tasks,
  then the consumer processes started and joined.

Each system runs once untimed on 1,000 tasks first (a warm-up: imports, and the processes that
live as long as the benchmark's own, such as Conveyor's fork server). Submit and drain are timed
separately; the figure that counts is submit + drain, Conveyor / daskqueue (the issue's target:
<= 0.2x at every N). daskqueue comes from PyPI: `pip install -e '.[bench]'`.

    python bench/bench_peers.py [--runs 3] [--n 10000 100000] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import time

import bench_tasks
from benchlib import Row, make_console, print_report, progress, rate, ratio, seconds
from compat import QueuePool
from conveyor.worker import ConsumerPool
from workloads import NOOP_PAYLOAD

WORKERS = 2
QUEUES = 2
JOIN_TIMEOUT_S = 600.0
# daskqueue's consumers fetch this many messages per call (its ConsumerPool's `batch_size`). Its default, 1,
# costs two dask actor calls (get, early ack: ~2 ms each here) per task: ~300 tasks/s drained. Measured
# here at N=10,000: 1 -> ~300/s, 10 -> 3.5k/s, 100 -> 4.4-6.2k/s, 300 -> 5.1k/s, 1,000 -> 4.2-5.3k/s.
DQ_BATCH = 100


def conveyor_run(n: int) -> tuple[float, float]:
    """(submit seconds, drain seconds): N tasks on 2 transient servers, then 2 consumers until joined."""
    with QueuePool.local(n_servers=QUEUES, durable=False) as pool:
        pool.stats()  # connected
        consumers = ConsumerPool(pool, WORKERS, queues=["bench"], task_modules=["bench_tasks"])  # made first, as daskqueue's
        t0 = time.perf_counter()
        bench_tasks.noop.publish_many([(NOOP_PAYLOAD,)] * n, _pool=pool)
        t1 = time.perf_counter()  # from here, as for daskqueue: start the consumers, join
        try:
            consumers.start()
            st = consumers.join(timeout=JOIN_TIMEOUT_S)
        finally:
            consumers.cancel()
        t2 = time.perf_counter()
        done = pool.stats("bench")["bench"]
        if done.acked != n:
            raise RuntimeError(f"conveyor: {done.acked:,} of {n:,} tasks done ({st})")
    return t1 - t0, t2 - t1


def daskqueue_run(n: int) -> tuple[float, float]:
    """(submit seconds, drain seconds) as daskqueue's benchmark does it, on a fresh local cluster.

    A fresh cluster for each run: its consumers keep polling after `cancel`, so a cluster shared
    between runs would slow the next ones.
    """
    from daskqueue import ConsumerPool as DqConsumerPool
    from daskqueue import QueuePool as DqQueuePool
    from distributed import Client

    with Client(n_workers=WORKERS, threads_per_worker=1, direct_to_workers=True, dashboard_address=None) as client:
        queues = DqQueuePool(client, QUEUES)
        # its actors exist before the timing; batch_size: its default 1 costs two actor calls per task
        consumers = DqConsumerPool(client, queues, n_consumers=WORKERS, batch_size=DQ_BATCH)
        t0 = time.perf_counter()
        queues.batch_submit([(bench_tasks.dq_noop,)] * n)
        t1 = time.perf_counter()
        consumers.start()
        consumers.join(timestep=0.1)
        consumers.results()
        t2 = time.perf_counter()
        got = consumers.nb_consumed()
        consumers.cancel()
    if got != n:
        raise RuntimeError(f"daskqueue: {got:,} of {n:,} tasks consumed")
    return t1 - t0, t2 - t1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, nargs="+", default=None, help="task counts (default 10,000 and 100,000)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2,000 tasks, 1 run")
    args = ap.parse_args(argv)
    sizes = args.n or ([2_000] if args.quick else [10_000, 100_000])
    runs = 1 if args.quick else args.runs
    try:
        import daskqueue
    except ImportError:
        print("bench_peers needs daskqueue: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    logging.getLogger("daskqueue.utils.logger").setLevel(logging.WARNING)  # its progress lines, on stdout
    out = make_console()
    out.print(
        f"Python {platform.python_version()}, {platform.platform()}, {os.cpu_count()} CPUs; daskqueue "
        f"{getattr(daskqueue, '__version__', '?')}; {WORKERS} consumers, {QUEUES} queues; N = "
        f"{', '.join(f'{n:,}' for n in sizes)}; {runs} run(s)"
    )
    fig: dict[str, list[float]] = {}

    def record(name: str, v: float) -> None:
        fig.setdefault(name, []).append(v)
        progress(f"  {name}: {v:,.3f}")

    progress("warm-up: each system once on 1,000 tasks, untimed (imports; Conveyor's fork server, dask's first cluster)")
    conveyor_run(1_000)
    daskqueue_run(1_000)
    for run in range(1, runs + 1):
        for n in sizes:
            order = (("conveyor", conveyor_run), ("daskqueue", daskqueue_run))
            for name, fn in order if run % 2 else order[::-1]:
                progress(f"run {run}/{runs}, N={n:,}: {name}")
                submit, drain = fn(n)
                record(f"{name} {n} submit", submit)
                record(f"{name} {n} drain", drain)
                record(f"{name} {n} total", submit + drain)
    progress("done")

    med = statistics.median
    rows: list[Row] = []
    for n in sizes:
        for name in ("conveyor", "daskqueue"):
            rows.append(Row(f"N={n:,} {name}: submit", [n / s for s in fig[f"{name} {n} submit"]], rate))
            rows.append(Row(f"N={n:,} {name}: drain", [n / s for s in fig[f"{name} {n} drain"]], rate))
            rows.append(Row(f"N={n:,} {name}: submit + drain", fig[f"{name} {n} total"], seconds))
        per_run = [a / b for a, b in zip(fig[f"conveyor {n} total"], fig[f"daskqueue {n} total"], strict=True)]
        rows.append(
            Row(
                f"N={n:,} submit + drain, conveyor / daskqueue",
                per_run,
                ratio,
                "<=",
                0.2,
                value=med(fig[f"conveyor {n} total"]) / med(fig[f"daskqueue {n} total"]),
            )
        )
    return print_report(out, f"Peers: medians of {runs} run(s)", rows)


if __name__ == "__main__":
    sys.exit(main())
