"""The `conveyor` command, run as a user runs it, and the project's lint gate."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_runs_and_reports(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "conveyor", "demo", "--messages", "5000", "--data-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    assert "MemoryStore" in out.stdout and "DurableStore" in out.stdout
    assert "4,995" in out.stdout  # acked: all but the 5 poison messages
    assert (tmp_path / "demo-queue").is_dir()


def test_demo_rejects_bad_arguments() -> None:
    cmd = [sys.executable, "-m", "conveyor", "demo", "--messages", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--messages" in out.stderr


def test_version() -> None:
    out = subprocess.run([sys.executable, "-m", "conveyor", "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.startswith("conveyor, version ")


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is a test dependency: pip install -e '.[test]'"
    out = subprocess.run([ruff, "check", "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
