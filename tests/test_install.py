"""The core install: `pip install conveyor` in a fresh venv gives the queue, workers and CLI, without Spark.

The venv is made by the test and the package installed into it from this checkout, as a user would
(its dependencies from the package index, or pip's cache). The quickstart runs in it as written; the
parts that need the `spark` extra say which pip command brings it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .support.doc_blocks import ROOT, blocks, run_as_written

INSTALL_S = 600.0  # a fresh venv and the core's wheels, downloaded when pip's cache has none
SPARK_MODULES = ("pyspark", "pyarrow", "pandas", "numpy")
CORE_MAX_BYTES = 100 * 2**20  # issue 42: the core install, venv and all (python -m venv brings pip and setuptools)
PIP_HINT = "pip install 'conveyor[spark]'"

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with this checkout installed without extras; its bin directory."""
    venv = tmp_path_factory.mktemp("core") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=INSTALL_S)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=INSTALL_S,
    )
    assert done.returncode == 0, f"pip install of the core failed:\n{done.stdout}\n{done.stderr}"
    return venv / "bin"


def _isolated() -> dict[str, str]:
    """This environment without PYTHONPATH: the venv's own packages only."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _python(bin_dir: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True, timeout=120, env=_isolated())


def test_the_core_install_is_small(core_venv: Path) -> None:
    """The whole venv, with what `python -m venv` brings, under 100 MB (bench/bench_install.py measures it)."""
    venv = core_venv.parent
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    assert size < CORE_MAX_BYTES, f"the core install takes {size / 2**20:.1f} MiB"


def test_the_core_install_has_no_spark(core_venv: Path) -> None:
    """Neither pyspark, pyarrow, pandas nor numpy is installed, and the core's packages import without them."""
    done = _python(
        core_venv,
        "import importlib.util, sys\n"
        f"print([m for m in {SPARK_MODULES!r} if importlib.util.find_spec(m)])\n"
        "import conveyor, conveyor.server, conveyor.worker, conveyor.client, conveyor.tasks, conveyor.dashboard\n"
        "import conveyor.cli.commands, conveyor.compat.kale, conveyor.compat.daskqueue\n"
        "print(conveyor.QueuePool.__name__, conveyor.ConsumerPool.__name__)",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "QueuePool ConsumerPool"]


@pytest.mark.parametrize(
    "code",
    [
        "import conveyor.spark",
        "import conveyor.graph",
        "import conveyor.compat.quokka",
        "import conveyor; conveyor.local",
        "import conveyor; conveyor.TaskGraph",
    ],
)
def test_a_part_that_needs_spark_names_the_pip_command(core_venv: Path, code: str) -> None:
    done = _python(core_venv, code)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("conveyor.extras.MissingExtraError: ") and PIP_HINT in last, done.stderr


def test_the_demo_names_the_pip_command(core_venv: Path) -> None:
    """`conveyor demo` refuses with the pip command; `conveyor -h` lists it with what it needs."""
    done = subprocess.run([str(core_venv / "conveyor"), "demo"], capture_output=True, text=True, timeout=120, env=_isolated())
    assert done.returncode == 1 and PIP_HINT in done.stderr and "Traceback" not in done.stderr, done.stderr
    listed = subprocess.run([str(core_venv / "conveyor"), "-h"], capture_output=True, text=True, timeout=120, env=_isolated())
    assert listed.returncode == 0 and "demo" in listed.stdout and "needs the spark extra" in listed.stdout, listed.stdout


def test_the_quickstart_runs_on_the_core_install(core_venv: Path, tmp_path: Path) -> None:
    """docs/quickstart.md as written: a server, a worker and the publisher, all from the core install."""
    (publisher,) = [b for b in blocks(ROOT / "docs" / "quickstart.md") if b.lang == "python" and not b.marks]
    run_as_written(publisher, tmp_path, core_venv / "python")
