"""Test-run settings: in CI (CI=true) a skipped test fails the run, so nothing is skipped silently."""

from __future__ import annotations

import os
import tempfile

import pytest

from conveyor.worker.affinity import CORE_LOCK_DIR_ENV

pytest_plugins = ["tests.support.spark_fixtures"]

# Each test process (pytest-xdist runs two) claims cores for its pinned consumers in a lock directory of its own:
# the processes stand for two machines, so one's pinned consumers must not find the other's holding every core.
# Set before any Spark session starts, so that its Python workers inherit it.
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ[CORE_LOCK_DIR_ENV] = os.path.join(tempfile.gettempdir(), f"conveyor-cores-{os.getuid()}-{worker}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI") and session.testsfailed == 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
        if skipped:
            reporter.write_line(f"CI: {skipped} test(s) skipped; skips are not allowed in CI", red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
