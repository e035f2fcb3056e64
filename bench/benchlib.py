"""What every benchmark script shares: progress lines, figures with targets, and the report table."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

_T0 = time.perf_counter()
FIGURES_ENV = "CONVEYOR_BENCH_FIGURES"  # a file to write the report's figures to, as JSON


def progress(text: str) -> None:
    """A progress line on stderr with the time since the script started."""
    print(f"[{time.perf_counter() - _T0:7.1f}s] {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def busy_machine(on: bool) -> Iterator[None]:
    """With `on`, one CPU-bound background process for the duration.

    A benchmark's "busy machine" variant: everything it measures, Conveyor and its baselines alike,
    shares the cores with it.
    """
    if not on:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def settle(idle: float = 0.9, window_s: float = 0.25, limit_s: float = 10.0) -> float:
    """Wait until the machine's CPUs were at least `idle` idle over a window, at most `limit_s`; the seconds waited.

    Before a timed run: what the previous run left working (a system's daemons tidying up after
    it, a JVM still compiling) ends before the next one's clock starts, whichever system it is.
    """
    t0 = time.monotonic()
    while True:
        before = _cpu_ticks()
        time.sleep(window_s)  # a measuring window, not a wait for an event
        after = _cpu_ticks()
        total = sum(after) - sum(before)
        quiet = (after[3] + after[4] - before[3] - before[4]) / total if total else 1.0  # idle + iowait
        if quiet >= idle or time.monotonic() - t0 >= limit_s:
            return time.monotonic() - t0


def _cpu_ticks() -> list[int]:
    """The machine's CPU time so far by kind (/proc/stat: user, nice, system, idle, iowait, ...)."""
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


def quiet_target(busy: bool, op: str, target: float) -> tuple[str, float]:
    """A Row's (op, target) for a target set for a quiet machine: none in a busy-machine run."""
    return ("", 0.0) if busy else (op, target)


def make_console() -> Console:
    """stdout, wide enough for the report when it is not a terminal."""
    return Console() if sys.stdout.isatty() else Console(width=160)


@dataclass
class Row:
    name: str
    runs: list[float]
    fmt: Callable[[float], str]
    op: str = ""  # ">=", "<=", "<" or "" (no target)
    target: float = 0.0
    note: str = ""
    value: float | None = None  # the figure when it is not the median of `runs` (ratios)

    @property
    def figure(self) -> float:
        return statistics.median(self.runs) if self.value is None else self.value

    @property
    def passed(self) -> bool | None:
        v = self.figure
        return {">=": v >= self.target, "<=": v <= self.target, "<": v < self.target}.get(self.op)


def rate(v: float) -> str:
    return f"{v:,.0f}/s"


def seconds(v: float) -> str:
    return f"{v:.3f} s" if v >= 0.01 else f"{v * 1e3:.2f} ms"


def number(v: float) -> str:
    return f"{v:.3f}"


def micros(v: float) -> str:
    return f"{v * 1e6:.1f} us"


def per_msg(v: float) -> str:
    return f"{v:.1f} B"


def ratio(v: float) -> str:
    return f"{v:.2f}x"


def mib(v: float) -> str:
    return f"{v / 2**20:,.1f} MiB"


def print_report(console: Console, title: str, rows: list[Row]) -> int:
    """Print the table and the verdict; returns the exit status (1 if a target was missed)."""
    table = Table(title=title, title_justify="left")
    table.add_column("figure")
    table.add_column("median", justify="right")
    table.add_column("target", justify="right")
    table.add_column("result")
    table.add_column("runs", justify="right")
    table.add_column("note", style="dim")
    for r in rows:
        ok = r.passed
        verdict = "" if ok is None else "[green]PASS[/]" if ok else "[bold red]FAIL[/]"
        target = f"{r.op} {r.fmt(r.target)}" if r.op else ""
        table.add_row(r.name, r.fmt(r.figure), target, verdict, "  ".join(r.fmt(v) for v in r.runs), r.note)
    console.print(table)
    failed = [r.name for r in rows if r.passed is False]
    console.print(f"FAIL: {', '.join(failed)}" if failed else "All targets met.")
    if path := os.environ.get(FIGURES_ENV):  # for bench/compare.py
        figures = [{"name": r.name, "figure": r.figure, "shown": r.fmt(r.figure), "unit": r.fmt.__name__} for r in rows]
        Path(path).write_text(json.dumps(figures))
    return 1 if failed else 0
