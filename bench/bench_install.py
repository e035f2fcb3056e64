"""The installs, measured: a fresh venv's size and install time for `conveyor`, `conveyor[spark]` and `conveyor[demo]`.

Each run makes a fresh venv (`python -m venv`, with the pip and setuptools it brings) and installs
into it, timed: this checkout (the core), with the `spark` extra, with the `demo` extra (spark and
scikit-learn: what the README's first command installs), and the peers a
Celery or Dramatiq user installs (celery, dramatiq, flower, prometheus-client) as the baseline. Sizes
are of the whole venv (`du`); times include resolving and unpacking, with pip's cache as it is
(`--no-cache` for downloads too). Target (issue 42): the core venv under 100 MB.

    python bench/bench_install.py [--runs 3] [--no-cache]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Row, make_console, mib, print_report, progress, ratio, seconds

ROOT = Path(__file__).resolve().parents[1]
INSTALLS = {
    "conveyor (core)": [str(ROOT)],
    "conveyor + spark extra": [f"{ROOT}[spark]"],
    "conveyor + demo extra (the README's first command)": [f"{ROOT}[demo]"],
    "peers: celery + dramatiq + flower + prometheus-client": ["celery", "dramatiq", "flower", "prometheus-client"],
}
CORE_TARGET_BYTES = 100 * 2**20
INSTALL_TIMEOUT_S = 1800.0  # the spark extra downloads ~500 MB when pip's cache has none


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def measure(what: list[str], no_cache: bool) -> tuple[float, int]:
    """Install `what` into a fresh venv: (seconds of `pip install`, bytes of the venv)."""
    with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=INSTALL_TIMEOUT_S)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        started = time.perf_counter()
        subprocess.run(
            [*pip, *(["--no-cache-dir"] if no_cache else []), *what],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
            env={**os.environ, "PIP_NO_INPUT": "1"},
        )
        return time.perf_counter() - started, _size(venv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-cache", action="store_true", help="pip --no-cache-dir: every wheel downloaded")
    args = parser.parse_args()
    times: dict[str, list[float]] = {k: [] for k in INSTALLS}
    sizes: dict[str, list[float]] = {k: [] for k in INSTALLS}
    for run in range(args.runs):
        for name, what in INSTALLS.items():  # interleaved: each run measures every install on the same machine state
            progress(f"run {run + 1}/{args.runs}: {name}")
            took, size = measure(what, args.no_cache)
            times[name].append(took)
            sizes[name].append(float(size))
    peers = "peers: celery + dramatiq + flower + prometheus-client"
    rows = []
    for name in INSTALLS:
        core = name == "conveyor (core)"
        rows.append(Row(f"{name}: venv size", sizes[name], mib, "<" if core else "", CORE_TARGET_BYTES if core else 0.0))
        rows.append(Row(f"{name}: install time", times[name], seconds))
    rows.append(
        Row("core size / peers' size", [a / b for a, b in zip(sizes["conveyor (core)"], sizes[peers], strict=True)], ratio)
    )
    return print_report(make_console(), f"Installs: medians of {args.runs} run(s), fresh venvs", rows)


if __name__ == "__main__":
    sys.exit(main())
