"""`conveyor.testing`: a store kept outside the tree runs the store contract by subclassing `StoreContract`.

The outside project is a test module in a directory of its own, run by pytest in a child process
(away from this repository's conftest and settings), as that project would run it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

from conveyor.testing import StoreContract

PYTEST_TIMEOUT_S = 600  # the contract runs twice (about 80 tests, a few seconds): a bound for a busy machine

OUTSIDE = textwrap.dedent(
    '''
    from pathlib import Path

    from conveyor.storage import MemoryStore, Store
    from conveyor.testing import StoreContract


    class SloppyStore(MemoryStore):
        """A store that breaks one promise: purge drops nothing."""

        def purge(self) -> int:
            return 0


    class TestGoodStore(StoreContract):
        def make(self, directory: Path, *, max_attempts: int = 5) -> Store:
            return MemoryStore("q", max_attempts=max_attempts)


    class TestSloppyStore(StoreContract):
        def make(self, directory: Path, *, max_attempts: int = 5) -> Store:
            return SloppyStore("q", max_attempts=max_attempts)
    '''
)


def test_an_outside_store_gets_the_whole_contract_and_a_broken_one_fails_it(tmp_path: Path) -> None:
    (tmp_path / "test_outside.py").write_text(OUTSIDE)
    report = tmp_path / "report.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "test_outside.py", "-q", "-p", "no:cacheprovider", f"--junit-xml={report}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=PYTEST_TIMEOUT_S,
    )
    assert run.returncode == 1, run.stdout + run.stderr  # some tests failed (the sloppy store's)
    outcomes: dict[str, dict[str, bool]] = {}
    for case in ET.parse(report).iter("testcase"):
        passed = case.find("failure") is None and case.find("error") is None and case.find("skipped") is None
        outcomes.setdefault(case.get("classname", "").rsplit(".", 1)[-1], {})[case.get("name", "")] = passed
    contract = sorted(n for n in dir(StoreContract) if n.startswith("test_"))
    assert sorted(outcomes["TestGoodStore"]) == contract and all(outcomes["TestGoodStore"].values())
    failed = sorted(n for n, ok in outcomes["TestSloppyStore"].items() if not ok)
    assert "test_purge_drops_ready_and_delayed_only" in failed, failed
    assert len(outcomes["TestSloppyStore"]) == len(contract)
