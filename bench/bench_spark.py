"""Benchmark of `conveyor.spark.map` against plain Spark on skewed work items (local[2]).

Workloads (`conveyor.workloads.skewed`): skewed-60 (12,000 CPU busy-loops summing to 60 s) and
skewed-60-sorted (the same, ascending), each as a DataFrame of 16 input partitions in that order.
Variants, all in one run on one session:

  (a) mapInPandas over the input's own 16 partitions     (b) after repartition(2)
  (c) after repartition(16)                               (d) one Spark partition per item
      ((d) on the first 500 items only: Spark schedules ~30 tiny tasks/s here)
  (e) conveyor.spark.map with its defaults (2 consumers as Spark tasks, each pinned to a core of its
      own, 8 threads and a read-ahead; on 2 local durable servers)
  (f) skewed-60 only: the rows dealt beforehand into 2 partitions of equal work (no shuffle, no
      imbalance): the floor of any static split, for reference (no split known in advance does better)

Each prints its end-to-end makespan (the call to the results collected) and efficiency = work /
(2 x makespan); (e) also its steady-state efficiency (first item started to last item finished,
from timestamps the items return). Finally the per-item overhead of (e) on 100,000 no-op rows,
once running: 2 x (last finish - first start) / rows.

With --busy, everything is measured beside one CPU-bound background process (a busy machine); its
one target is skewed-60's map no slower than the best static split (the others are a quiet machine's).

    python bench/bench_spark.py [--runs 3] [--quick] [--noop-only] [--busy]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchlib import Row, busy_machine, make_console, micros, number, print_report, progress, quiet_target, ratio, seconds
from compat import consumer_keywords

WORKERS = 2
ROW_DDL = "i long, seconds double"
OUT_DDL = "i long, start double, finish double"


def run_item(row: dict[str, Any]) -> dict[str, Any]:
    """One work item: busy for its seconds; returns when it ran."""
    from conveyor.cli.corpus import busy  # on the executors: from the installed library

    start = time.time()
    busy(row["seconds"])
    return {"i": row["i"], "start": start, "finish": time.time()}


def noop_item(row: dict[str, Any]) -> dict[str, Any]:
    t = time.time()
    return {"i": row["i"], "start": t, "finish": t}


def _pandas_runner() -> Callable[[Iterator[Any]], Iterator[Any]]:
    def run(frames: Iterator[Any]) -> Iterator[Any]:
        import pandas as pd

        for f in frames:
            yield pd.DataFrame([run_item(r) for r in f.to_dict("records")], columns=["i", "start", "finish"])

    return run


def equal_halves(durations: list[float]) -> list[list[tuple[int, float]]]:
    """The items as (index, seconds) in WORKERS lists of equal work.

    The longest first, each to the lightest list (they end within a few microseconds of each other
    here).
    """
    out: list[list[tuple[int, float]]] = [[] for _ in range(WORKERS)]
    sums = [0.0] * WORKERS
    for i in sorted(range(len(durations)), key=lambda i: -durations[i]):
        k = sums.index(min(sums))
        out[k].append((i, durations[i]))
        sums[k] += durations[i]
    return out


def plain(df: Any, how: str) -> tuple[float, int]:
    """A plain Spark variant: (makespan, rows)."""
    t0 = time.perf_counter()
    if how == "b":
        df = df.repartition(WORKERS)
    elif how == "c":
        df = df.repartition(16)
    rows = df.mapInPandas(_pandas_runner(), OUT_DDL).collect()
    return time.perf_counter() - t0, len(rows)


def through_conveyor(df: Any, func: Callable[..., Any], **options: Any) -> tuple[float, float, int]:
    """conveyor.spark.map: (end-to-end makespan, steady-state window, rows)."""
    import conveyor.spark as cs

    t0 = time.perf_counter()
    out = cs.map(df, func, schema=OUT_DDL, n_consumers=WORKERS, progress=False, **consumer_keywords(options))
    rows = out.collect()
    makespan = time.perf_counter() - t0
    bad = [r for r in rows if r["_error"] is not None]
    if bad:
        raise RuntimeError(f"{len(bad)} items failed: {bad[0]['_error'][:200]}")
    window = max(r["finish"] for r in rows) - min(r["start"] for r in rows)
    out.unpersist()
    return makespan, window, len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2,000 items summing to 10 s, 10,000 no-op rows, 1 run")
    ap.add_argument("--noop-only", action="store_true", help="only (e) on the no-op rows, --runs times (its figure alone)")
    ap.add_argument("--busy", action="store_true", help="busy machine: one CPU-bound background process throughout")
    args = ap.parse_args(argv)
    runs = 1 if args.quick else args.runs

    import conveyor
    from workloads import skewed

    n, total = (2000, 10.0) if args.quick else (12_000, 60.0)
    n_noop = 10_000 if args.quick else 100_000
    workloads = {"skewed-60": skewed(n, total), "skewed-60-sorted": skewed(n, total, ordered=True)}
    out = make_console()
    out.print(
        f"Python {platform.python_version()}, {platform.platform()}, {os.cpu_count()} CPUs; local[2]; "
        f"{n:,} items = {total:.0f} s of work per workload; {runs} run(s)"
        + ("  [QUICK]" if args.quick else "")
        + ("  [BUSY: one CPU-bound background process]" if args.busy else "")
    )
    fig: dict[str, list[float]] = {}

    def record(name: str, v: float) -> None:
        fig.setdefault(name, []).append(v)
        progress(f"  {name}: {v:.3f}")

    with conveyor.local(master=f"local[{WORKERS},4]", fsync="interval") as env:
        spark = env.spark
        sc = spark.sparkContext
        frames = {w: sc.parallelize(list(enumerate(d)), 16).toDF(ROW_DDL).cache() for w, d in workloads.items()}
        halves = equal_halves(workloads["skewed-60"])
        balanced = sc.parallelize(halves, WORKERS).flatMap(lambda rows: rows).toDF(ROW_DDL).cache()
        for f in (*frames.values(), balanced):
            f.count()
        noop = spark.range(n_noop, numPartitions=16).selectExpr("id AS i", "0.0 AS seconds").cache()
        noop.count()
        with busy_machine(args.busy):
            for run in range(1, runs + 1):
                for w, d in workloads.items() if not args.noop_only else ():
                    df, work = frames[w], sum(d)
                    for how in "abc":
                        progress(f"run {run}/{runs}, {w}: ({how}) plain Spark")
                        t, k = plain(df, how)
                        assert k == len(d)
                        record(f"{w} ({how}) makespan", t)
                        record(f"{w} ({how}) efficiency", work / (WORKERS * t))
                    progress(f"run {run}/{runs}, {w}: (d) one partition per item, first 500")
                    first = sc.parallelize(list(enumerate(d[:500])), 500).toDF(ROW_DDL)
                    t, _ = plain(first, "d")
                    record(f"{w} (d) efficiency", sum(d[:500]) / (WORKERS * t))
                    record(f"{w} (d) makespan, scaled", t * work / sum(d[:500]))
                    if w == "skewed-60":
                        progress(f"run {run}/{runs}, {w}: (f) 2 partitions of equal work")
                        t, k = plain(balanced, "f")
                        assert k == len(d)
                        record(f"{w} (f) makespan", t)
                    progress(f"run {run}/{runs}, {w}: (e) conveyor.spark.map")
                    t, window, k = through_conveyor(df, run_item)
                    assert k == len(d)
                    record(f"{w} (e) makespan", t)
                    record(f"{w} (e) efficiency", work / (WORKERS * t))
                    record(f"{w} (e) steady-state efficiency", work / (WORKERS * window))
                progress(f"run {run}/{runs}: (e) on {n_noop:,} no-op rows")
                t, window, k = through_conveyor(noop, noop_item, concurrency=64, batch_size=64)
                record("noop (e) per-item overhead", WORKERS * window / k)
    progress("done")

    med = statistics.median
    rows: list[Row] = []
    for w in workloads if not args.noop_only else ():
        best = min(("a", "b", "c", "d"), key=lambda h: med(fig[f"{w} ({h}) makespan" + (", scaled" if h == "d" else "")]))
        best_key = f"{w} ({best}) makespan" + (", scaled" if best == "d" else "")
        for h, what in (("a", "own 16 partitions"), ("b", "repartition(2)"), ("c", "repartition(16)")):
            eff = med(fig[f"{w} ({h}) efficiency"])
            rows.append(Row(f"{w} ({h}) {what}", fig[f"{w} ({h}) makespan"], seconds, note=f"efficiency {eff:.3f}"))
        rows.append(
            Row(f"{w} (d) one partition per item: efficiency", fig[f"{w} (d) efficiency"], number, note="first 500 items")
        )
        rows.append(
            Row(
                f"{w} (e) conveyor.spark.map",
                fig[f"{w} (e) makespan"],
                seconds,
                note=f"efficiency {med(fig[f'{w} (e) efficiency']):.3f}",
            )
        )
        rows.append(
            Row(
                f"{w} (e) steady-state efficiency",
                fig[f"{w} (e) steady-state efficiency"],
                number,
                *quiet_target(args.busy, ">=", 0.97),
            )
        )
        if w == "skewed-60":
            # on a busy machine, no slower; quiet, the balancing must show
            base, target, label = best_key, 1.0 if args.busy else 0.97, f"best of (a)-(d): ({best})"
        else:
            base, target, label = f"{w} (a) makespan", 0.75, "(a)"
        per_run = [x / y for x, y in zip(fig[f"{w} (e) makespan"], fig[base], strict=True)]
        goal = ("<=", target) if w == "skewed-60" else quiet_target(args.busy, "<=", target)  # busy: skewed-60's alone
        rows.append(
            Row(f"{w} (e) makespan / {label}", per_run, ratio, *goal, value=med(fig[f"{w} (e) makespan"]) / med(fig[base]))
        )
        if w == "skewed-60":
            floor = fig[f"{w} (f) makespan"]
            rows.append(
                Row(
                    f"{w} (f) 2 partitions of equal work: a floor",
                    floor,
                    seconds,
                    note=f"{med(floor) / med(fig[base]):.3f}x ({best})",
                )
            )
    rows.append(Row(f"(e) per-item overhead, {n_noop:,} no-op rows", fig["noop (e) per-item overhead"], micros, "<=", 50e-6))
    return print_report(out, f"Spark benchmark: medians of {runs} run(s); efficiency = work / ({WORKERS} x makespan)", rows)


if __name__ == "__main__":
    sys.exit(main())
