"""Before and after: a benchmark script run against an earlier revision and the working tree, in turns.

Each round runs the script once per tree (the order alternating, so that a noisy machine spreads its
noise over both), with the tree's `src` first on the import path: the script itself, and the
servers it starts, use that tree's Conveyor. The script is the working tree's, so both trees are
measured the same way. The report gives, per figure, the median of the rounds for each tree, and
the median of the rounds' ratios (after / before of the same round: the two ran back to back, so a
machine that slows down or speeds up between rounds — a shared one does — moves both alike). For a
rate (per second) a ratio under 1 means the working tree is slower, for a time over 1 does.

Run it from the repository root:

    python bench/compare.py --base HEAD~3 bench/bench_store.py --quick
    python bench/compare.py --base 8d1b099 --rounds 3 bench/bench_server.py --runs 1

Progress goes to stderr; the report to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.table import Table

from benchlib import FIGURES_ENV, make_console, progress

ROOT = Path(__file__).resolve().parent.parent
LOWER_IS_BETTER = {"seconds", "micros", "mib", "per_msg"}  # the benchlib formats of times and sizes


def run(script: Path, args: list[str], src: Path) -> dict[str, tuple[float, str]]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", FIGURES_ENV: out.name}
        subprocess.run([sys.executable, str(script), *args], env=env, check=False, stdout=subprocess.DEVNULL)
        text = Path(out.name).read_text()
    if not text:
        raise SystemExit(f"{script.name} wrote no figures with {src} (see its errors above)")
    return {f["name"]: (f["figure"], f["unit"]) for f in json.loads(text)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the earlier revision (anything git understands)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of the script per tree (default 3)")
    ap.add_argument("script", type=Path, help="a benchmark script under bench/")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    a = ap.parse_args()
    script = a.script.resolve()
    with tempfile.TemporaryDirectory(prefix="conveyor-base-") as tmp:
        base = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), a.base], check=True)
        try:
            trees = {"before": base / "src", "after": ROOT / "src"}
            # per tree, figure and round: a figure whose name depends on the run (the best of several
            # configurations, say) is not in every round, and only rounds that have it on both sides pair up
            figs: dict[str, dict[str, dict[int, float]]] = {"before": {}, "after": {}}
            units: dict[str, str] = {}
            for k in range(a.rounds):
                for name in ("before", "after") if k % 2 == 0 else ("after", "before"):
                    which = a.base if name == "before" else "the working tree"
                    progress(f"round {k + 1}/{a.rounds}: {script.name} on {name} ({which})")
                    for fig, (v, unit) in run(script, a.args, trees[name]).items():
                        figs[name].setdefault(fig, {})[k] = v
                        units[fig] = unit
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    title = f"{script.name} {' '.join(a.args)}: medians of {a.rounds} rounds, {a.base} vs the working tree"
    table = Table(title=title, title_justify="left")
    for col in ("figure", "before", "after", "after / before (paired)", "runs before", "runs after"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    worse = []
    for fig, by_round in figs["before"].items():
        paired = sorted(set(by_round) & set(figs["after"].get(fig, {})))
        if not paired:
            continue
        before, after = [by_round[k] for k in paired], [figs["after"][fig][k] for k in paired]
        b, c = statistics.median(before), statistics.median(after)
        r = statistics.median(x / y if y else float("nan") for x, y in zip(after, before, strict=True))
        slower = r > 1.05 if units[fig] in LOWER_IS_BETTER else r < 0.95
        if slower:
            worse.append(fig)
        runs = ("  ".join(f"{v:,.4g}" for v in vs) for vs in (before, after))
        table.add_row(fig, f"{b:,.4g}", f"{c:,.4g}", f"{'[red]' if slower else ''}{r:.2f}x", *runs)
    out = make_console()
    out.print(table)
    out.print(f"worse by more than 5%: {', '.join(worse)}" if worse else "No figure worse by more than 5%.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
