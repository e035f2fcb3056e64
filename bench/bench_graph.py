"""Benchmark of the TaskGraph runtime: TPC-H Q6 and Q12 against Spark SQL and DuckDB.

The same `.tbl` files (generated once with tpchgen-cli and cached in `--data-dir`) are queried by:

- TaskGraph: the graphs of examples/tpch_q6.py and examples/tpch_q12.py, on a `local[2]` session
  (local files read by pyarrow inside the Spark tasks, the default);
- TaskGraph, Spark reader: the same graphs with `file_reader="spark"` (Spark's CSV reader feeding
  the input nodes through mapInArrow), for comparison with the default;
- Spark SQL: the standard SQL on the same session, over `spark.read.csv` views with an explicit
  schema (no inference pass);
- DuckDB: the standard SQL over `read_csv` views (2 threads, as many as Spark's cores).

Each timing covers planning, running and collecting the answer. One untimed warm-up run of each
comes first (JIT, Python workers); then the runs are interleaved (run 1 of each, then run 2, ...)
so that a noisy machine spreads its noise over all of them. Medians and ratios go to stdout; the
answers of the three are checked against each other. Target: TaskGraph within 2x of Spark SQL.

    python bench/bench_graph.py                      # SF1, 3 runs
    python bench/bench_graph.py --quick              # smoke run on SF0.01
    python bench/bench_graph.py --scale 1 --runs 5 --data-dir /mnt/fast/tpch
    python bench/bench_graph.py --quokka             # Quokka's apps and tutorials (below), CSV and Parquet

`--quokka` runs instead Quokka's programs through `conveyor.compat.quokka`, in two sets: its TPC-H
apps of 2022 (examples/quokka_tpch.py: Q3, Q6, Q8, Q12 with only their imports changed) and its
graph-API tutorials of 2023 (examples/quokka_tutorials.py: TPC-H 1, 3, 4, 6, 12, 13, 14, 19, their
joins on `--parallelism` channels), on the `.tbl` files (the tutorials' copies with a header line)
and on Parquet copies of them, against Spark SQL and DuckDB running the same queries (the
programs' predicates) over the same files; it reports the geometric mean of TaskGraph / Spark SQL
per format over all queries, and each set's. Targets: at most 0.5 on CSV and 1.0 on Parquet
(Quokka reported about 1.85x faster than Spark SQL).

The exit status is 1 if a target is missed or the answers disagree. With `--quokka`, the median
times are also written for bench/compare.py (which compares two trees in paired runs):

    python bench/compare.py --base main bench/bench_graph.py --quokka --runs 3 --format parquet
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import duckdb
import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from benchlib import FIGURES_ENV
from conveyor import TaskGraph
from conveyor.spark.session import get_or_create_session

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))  # the examples import their TPC-H helpers (examples/tpch.py) by name
tpch = importlib.import_module("tpch")
TARGET = 2.0
_T0 = time.perf_counter()


def progress(text: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f}s] {text}", file=sys.stderr, flush=True)


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(run: Callable[[], pd.DataFrame]) -> tuple[float, pd.DataFrame]:
    start = time.perf_counter()
    answer = run()
    return time.perf_counter() - start, answer


def same_answer(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Equal shapes, equal text columns, numbers equal within 1e-9 (relative)."""
    if a.shape != b.shape:
        return False
    for x, y in zip(a.columns, b.columns, strict=True):
        u, v = a[x].to_numpy(), b[y].to_numpy()
        if np.issubdtype(v.dtype, np.number):
            if not np.allclose(u.astype(float), v.astype(float), rtol=1e-9, atol=0):
                return False
        elif [str(s) for s in u] != [str(s) for s in v]:
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: scale factor 0.01, 2 runs")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each system (default 3)")
    parser.add_argument("--parallelism", type=int, default=2, help="TaskGraph readers and join channels (default 2)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the generated tables are cached (default: <tmp>/conveyor-bench/tpch-sf<scale>)",
    )
    parser.add_argument(
        "--quokka", action="store_true", help="Quokka's TPC-H apps and tutorials through conveyor.compat.quokka instead"
    )
    parser.add_argument("--format", choices=("csv", "parquet"), action="append", help="with --quokka: only this format")
    args = parser.parse_args()
    scale, runs = (0.01, 2) if args.quick else (args.scale, args.runs)
    data = args.data_dir or Path(tempfile.gettempdir()) / "conveyor-bench" / f"tpch-sf{scale:g}"
    if args.quokka:
        return quokka_suite(data, scale, runs, args.parallelism, args.format or ["csv", "parquet"])
    progress(f"TPC-H SF{scale:g} in {data} (generated when missing)")
    tpch.generate(scale, data, ("lineitem", "orders"))

    progress("starting Spark (local[2])")
    spark = get_or_create_session("local[2]", app_name="bench-graph")
    for table in ("lineitem", "orders"):
        spark.read.csv(str(data / f"{table}.tbl"), schema=tpch.spark_ddl(table), sep="|").createOrReplaceTempView(table)
    con = duckdb.connect()
    con.execute("set threads = 2")
    for table in ("lineitem", "orders"):
        con.execute(
            f"create view {table} as select * from read_csv('{data / table}.tbl', delim='|', header=false, "
            f"columns={tpch.duckdb_columns(table)})"
        )

    builders = {"q6": example("tpch_q6").build_q6, "q12": example("tpch_q12").build_q12}

    def taskgraph(query: str, reader: str = "auto") -> Callable[[], pd.DataFrame]:
        def run() -> pd.DataFrame:
            graph = TaskGraph(spark, file_reader=reader)
            out = builders[query](graph, str(data), args.parallelism)
            graph.run()
            answer = out.to_pandas()
            out.unpersist()
            return answer

        return run

    systems: dict[str, Callable[[str], Callable[[], pd.DataFrame]]] = {
        "TaskGraph": taskgraph,
        "TaskGraph, Spark reader": lambda q: taskgraph(q, "spark"),
        "Spark SQL": lambda q: lambda: spark.sql(tpch.QUERIES[q]).toPandas(),
        "DuckDB": lambda q: lambda: con.execute(tpch.QUERIES[q]).df(),
    }
    times: dict[tuple[str, str], list[float]] = {}
    answers: dict[tuple[str, str], Any] = {}
    for query in builders:
        for system, make in systems.items():
            progress(f"warm-up: {query} on {system}")
            answers[(query, system)] = timed(make(query))[1]
        for i in range(runs):
            for system, make in systems.items():
                seconds, _ = timed(make(query))
                times.setdefault((query, system), []).append(seconds)
                progress(f"{query} run {i + 1}/{runs}: {system} {seconds:.2f} s")

    table = Table(title=f"TPC-H SF{scale:g}, local[2], median of {runs} runs (seconds)")
    for col in ("query", *systems, "TaskGraph / Spark SQL", "TaskGraph / DuckDB", "Spark reader / Spark SQL", "answers agree"):
        table.add_column(col, justify="right")
    ok = True
    for query in builders:
        med = {s: statistics.median(times[(query, s)]) for s in systems}
        agree = all(same_answer(answers[(query, "TaskGraph")], answers[(query, s)]) for s in systems)
        ratio = med["TaskGraph"] / med["Spark SQL"]
        ok &= agree and ratio <= TARGET
        table.add_row(
            query,
            *(f"{med[s]:.2f}" for s in systems),
            f"{ratio:.2f}" + ("" if ratio <= TARGET else " (MISSED)"),
            f"{med['TaskGraph'] / med['DuckDB']:.2f}",
            f"{med['TaskGraph, Spark reader'] / med['Spark SQL']:.2f}",
            "yes" if agree else "NO",
        )
    Console(width=180).print(table)
    print(f"target: TaskGraph / Spark SQL <= {TARGET:g}: {'met' if ok else 'MISSED'}")
    spark.stop()
    return 0 if ok else 1


QUOKKA_TARGETS = {"csv": 0.5, "parquet": 1.0}


@dataclass(frozen=True)
class QuerySet:
    """One set of Quokka's programs: its queries, the tables each reads, its SQL, how to run and check one."""

    name: str
    queries: list[str]
    tables_of: dict[str, tuple[str, ...]]
    sql: dict[str, str]
    run: Callable[[str, str], pd.DataFrame]  # (query, format) -> answer
    agree: Callable[[str, pd.DataFrame, pd.DataFrame], bool]  # (query, ours, SQL's)


def quokka_sets(data: Path, channels: int) -> list[QuerySet]:
    """Quokka's 2022 apps (examples/quokka_tpch.py) and its 2023 graph-API tutorials (examples/quokka_tutorials.py)."""
    apps, tutorials = example("quokka_tpch"), example("quokka_tutorials")
    return [
        QuerySet(
            "apps 2022",
            sorted(apps.QUERIES, key=lambda q: int(q[1:])),
            apps.TABLES_OF,
            apps.SQL,
            lambda q, fmt: apps.flat(q, apps.QUERIES[q](str(data), fmt, channels)),
            lambda q, a, b: apps.same_answer(a, b),
        ),
        QuerySet(
            "tutorials 2023",
            list(tutorials.QUERIES),
            tutorials.TABLES_OF,
            tutorials.SQL,
            lambda q, fmt: tutorials.QUERIES[q](data, fmt, channels),  # channels: the joins' (exec_per_node)
            tutorials.same_answer,
        ),
    ]


def geometric_mean(ratios: list[float]) -> float:
    return float(np.exp(np.mean(np.log(ratios))))


def quokka_suite(data: Path, scale: float, runs: int, channels: int, formats: list[str]) -> int:
    """Quokka's apps and tutorials on the compat against Spark SQL and DuckDB, per format; 0 when every target is met."""
    sets = quokka_sets(data, channels)
    tables = sorted({t for s in sets for q in s.queries for t in s.tables_of[q]})
    progress(f"TPC-H SF{scale:g} in {data} (generated when missing, with header-line and Parquet copies)")
    tpch.generate(scale, data, tuple(tables))
    if "csv" in formats:
        example("quokka_tutorials").with_header(data, tuple(tables))
    if "parquet" in formats:
        tpch.to_parquet(data, tuple(tables))
    progress("starting Spark (local[2])")
    spark = get_or_create_session("local[2]", app_name="bench-graph-quokka")
    con = duckdb.connect()
    con.execute("set threads = 2")

    def views(fmt: str) -> None:
        for table in tables:
            if fmt == "csv":
                spark.read.csv(str(data / f"{table}.tbl"), schema=tpch.spark_ddl(table), sep="|").createOrReplaceTempView(table)
                source = f"read_csv('{data / table}.tbl', delim='|', header=false, columns={tpch.duckdb_columns(table)})"
            else:
                spark.read.parquet(str(data / f"{table}.parquet")).createOrReplaceTempView(table)
                source = f"read_parquet('{data / table}.parquet')"
            con.execute(f"create or replace view {table} as select * from {source}")

    systems: dict[str, Callable[[QuerySet, str, str], pd.DataFrame]] = {
        "TaskGraph (compat)": lambda s, q, fmt: s.run(q, fmt),
        "Spark SQL": lambda s, q, fmt: spark.sql(s.sql[q]).toPandas(),
        "DuckDB": lambda s, q, fmt: con.execute(s.sql[q]).df(),
    }
    table = Table(title=f"Quokka's TPC-H apps and tutorials, SF{scale:g}, local[2], median of {runs} runs (seconds)")
    for col in ("format", "set", "query", *systems, "TaskGraph / Spark SQL", "TaskGraph / DuckDB", "answers agree"):
        table.add_column(col, justify="right")
    ok = True
    summary = []
    figures = []  # for bench/compare.py: each system's median time per format and query
    for fmt in formats:
        views(fmt)
        ratios: dict[str, list[float]] = {}
        for qset in sets:
            for query in qset.queries:
                times: dict[str, list[float]] = {}
                answers = {}
                for system, run in systems.items():
                    progress(f"warm-up: {fmt} {query} on {system}")
                    answers[system] = timed(functools.partial(run, qset, query, fmt))[1]
                for i in range(runs):
                    for system, run in systems.items():
                        seconds, _ = timed(functools.partial(run, qset, query, fmt))
                        times.setdefault(system, []).append(seconds)
                        progress(f"{fmt} {query} run {i + 1}/{runs}: {system} {seconds:.2f} s")
                med = {s: statistics.median(t) for s, t in times.items()}
                figures += [{"name": f"{s} {fmt} {qset.name} {query}", "figure": med[s], "unit": "seconds"} for s in systems]
                agree = all(qset.agree(query, answers["TaskGraph (compat)"], answers[s]) for s in systems)
                ok &= agree
                ratio = med["TaskGraph (compat)"] / med["Spark SQL"]
                ratios.setdefault(qset.name, []).append(ratio)
                table.add_row(
                    fmt,
                    qset.name,
                    query,
                    *(f"{med[s]:.2f}" for s in systems),
                    f"{ratio:.2f}",
                    f"{med['TaskGraph (compat)'] / med['DuckDB']:.2f}",
                    "yes" if agree else "NO",
                )
        geo = geometric_mean([r for rs in ratios.values() for r in rs])
        met = geo <= QUOKKA_TARGETS[fmt]
        ok &= met
        verdict = "met" if met else "MISSED"
        each = ", ".join(f"{name} {geometric_mean(rs):.2f}" for name, rs in ratios.items())
        summary.append(
            f"{fmt}: geometric mean TaskGraph / Spark SQL {geo:.2f} over all {sum(map(len, ratios.values()))} queries "
            f"(target <= {QUOKKA_TARGETS[fmt]:g}: {verdict}; {each})"
        )
    Console(width=200).print(table)
    for line in summary:
        print(line)
    if path := os.environ.get(FIGURES_ENV):
        Path(path).write_text(json.dumps(figures))
    spark.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
