"""Test-run settings: in CI (CI=true) a skipped test fails the run, so nothing is skipped silently."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["tests.support.spark_fixtures"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI") and session.testsfailed == 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
        if skipped:
            reporter.write_line(f"CI: {skipped} test(s) skipped; skips are not allowed in CI", red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
