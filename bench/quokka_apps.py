"""Run Quokka's own TPC-H apps of 2022, from a checkout of its repository, on `conveyor.compat.quokka`.

    git clone https://github.com/marsupialtail/quokka /tmp/quokka
    python bench/quokka_apps.py --repo /tmp/quokka [--commit 36876b3] [--scale 0.1]

The apps' files are taken from `--commit` of the checkout (nothing of Quokka is kept in this
repository) into a temporary directory, where only these lines change: the imports of
`pyquokka.*` (or of its modules by their bare names) point at `conveyor.compat.quokka`, `import
ray` becomes the compat's `ray`, and the Redis and `ray.init` setup lines and `sys.path` edits go;
Q8's nation and region tables are read from the local copy of its bucket. Their buckets
(`tpc-h-csv/<table>/<table>.tbl.1`, `tpc-h-parquet/<table>.parquet`) are made there as links to
TPC-H data generated at `--scale`. Each app runs as a script in its own process, with the
arguments it takes; its printed answer is compared with DuckDB's answer to the same query (the
apps' predicates: examples/quokka_tpch.py). Exit status 1 if an app fails or answers otherwise.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import duckdb
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import tpch  # noqa: E402  (examples/, as the examples import it)

# app file -> (query, argument lists to run it with)
APPS = {
    "tpc-h-3.py": ("q3", [["csv"], ["parquet"]]),
    "tpc-h-3-slow.py": ("q3", [["csv"], ["parquet"]]),
    "tpc-h-6.py": ("q6", [["big", "csv"], ["big", "parquet"]]),
    "tpc-h-8.py": ("q8", [["csv"], ["parquet"]]),
    "tpch-12.py": ("q12", [["csv"], ["parquet"]]),
    "tpch-12-slow.py": ("q12", [[]]),
}
IMPORTS = [
    (re.compile(r"^from (pyquokka\.)?quokka_runtime import", re.M), "from conveyor.compat.quokka.quokka_runtime import"),
    (re.compile(r"^from (pyquokka\.)?sql import", re.M), "from conveyor.compat.quokka.sql import"),
    (re.compile(r"^from (pyquokka\.)?executors import", re.M), "from conveyor.compat.quokka.executors import"),
    (re.compile(r"^from (pyquokka\.)?dataset import", re.M), "from conveyor.compat.quokka.dataset import"),
    (re.compile(r"^import ray$", re.M), "from conveyor.compat.quokka import ray"),
    (re.compile(r"^(import redis|r = redis\.Redis\(.*\)|r\.flushall\(\)|ray\.init\(.*\)|sys\.path\.append\(.*\))$", re.M), ""),
    (re.compile(r"s3://tpc-h-csv/"), "tpc-h-csv/"),  # Q8 reads nation and region with pandas
]
DRIVER = """
import runpy, sys, pickle
from conveyor.compat.quokka import quokka_runtime
sys.argv = [{app!r}, *{args!r}]
found = runpy.run_path({app!r}, run_name="__main__")
datasets = [v for v in found.values() if isinstance(v, quokka_runtime.Dataset)]
answer = datasets[-1].to_pandas()  # the app's result: the last Dataset it made
with open({out!r}, "wb") as f:
    pickle.dump(answer if isinstance(answer, __import__("pandas").DataFrame) else answer.to_pandas(), f)
"""


def apps_from(repo: Path, commit: str, into: Path) -> None:
    """The apps' files and their schema.py at `commit`, with the import lines rewritten."""
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit, "apps"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if member.isfile() and (name in APPS or name == "schema.py"):
                extracted = tar.extractfile(member)
                assert extracted is not None  # a file member has its contents
                text = extracted.read().decode()
                for pattern, replacement in IMPORTS:
                    text = pattern.sub(replacement, text)
                (into / name).write_text(text)


def buckets(data: Path, into: Path) -> None:
    """Quokka's bucket layout, as links to the generated tables."""
    for table in tpch.TABLES:
        csv_dir = into / "tpc-h-csv" / table
        csv_dir.mkdir(parents=True)
        suffix = "" if table in ("nation", "region") else ".1"  # the apps' keys
        (csv_dir / f"{table}.tbl{suffix}").symlink_to(data / f"{table}.tbl")
        (into / "tpc-h-parquet").mkdir(exist_ok=True)
        (into / "tpc-h-parquet" / f"{table}.parquet").symlink_to(data / f"{table}.parquet")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="a git checkout of marsupialtail/quokka")
    parser.add_argument("--commit", default="36876b3", help="the commit whose apps to run (default: 36876b3, April 2022)")
    parser.add_argument("--scale", type=float, default=0.1, help="TPC-H scale factor (default 0.1)")
    args = parser.parse_args()
    apps = __import__("importlib").import_module("quokka_tpch")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        work, data = Path(tmp) / "apps", Path(tmp) / "data"
        work.mkdir()
        tpch.generate(args.scale, data, tuple(tpch.TABLES))
        tpch.to_parquet(data, tuple(tpch.TABLES))
        apps_from(args.repo, args.commit, work)
        buckets(data, work)
        con = duckdb.connect()
        for table in tpch.TABLES:
            source = f"read_csv('{data / table}.tbl', delim='|', header=false, columns={tpch.duckdb_columns(table)})"
            con.execute(f"create view {table} as select * from {source}")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        for app, (query, runs) in APPS.items():
            if not (work / app).exists():
                print(f"{app}: not in {args.commit}")
                continue
            expected = con.execute(apps.SQL[query]).df()
            for argv in runs:
                out = work / "answer.pickle"
                start = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-c", DRIVER.format(app=app, args=argv, out=str(out))],
                    cwd=work,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
                seconds = time.perf_counter() - start
                if done.returncode != 0:
                    failed += 1
                    print(f"{app} {' '.join(argv)}: FAILED ({seconds:.1f} s)\n{done.stderr[-3000:]}")
                    continue
                ours = apps.flat(query, pd.read_pickle(out))
                same = apps.same_answer(ours, expected)
                failed += not same
                verdict = "DuckDB answer" if same else "WRONG ANSWER"
                print(f"{app} {' '.join(argv)}: {verdict} ({seconds:.1f} s, Spark start included)")
    print("all apps gave DuckDB's answers" if not failed else f"{failed} run(s) failed or answered otherwise")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
