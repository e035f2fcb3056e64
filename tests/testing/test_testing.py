"""`conveyor.testing`: a store kept outside the tree runs the store contract by subclassing `StoreContract`.

The store that keeps the contract is the example of docs/storage.md, run as written.

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

from ..support.docs import section_code

PYTEST_TIMEOUT_S = 600  # the contract runs twice (about 80 tests, a few seconds): a bound for a busy machine

# the example of docs/storage.md ("Store kinds"), as a user pastes it: a store that keeps the contract
DOCS_EXAMPLE = section_code("storage.md", "## Store kinds")
SLOPPY = textwrap.dedent(
    '''

    from conveyor.storage import MemoryStore


    class SloppyStore(MemoryStore):
        """A store that breaks one promise: purge drops nothing."""

        def purge(self) -> int:
            return 0


    class TestSloppyStore(StoreContract):
        def make(self, directory: Path, *, max_attempts: int = 5) -> Store:
            return SloppyStore("q", max_attempts=max_attempts)
    '''
)


def test_an_outside_store_gets_the_whole_contract_and_a_broken_one_fails_it(tmp_path: Path) -> None:
    assert "class TestMyStore(StoreContract):" in DOCS_EXAMPLE, "docs/storage.md lost its StoreContract example"
    (tmp_path / "test_outside.py").write_text(DOCS_EXAMPLE + SLOPPY)
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
    assert sorted(outcomes["TestMyStore"]) == contract and all(outcomes["TestMyStore"].values())
    failed = sorted(n for n, ok in outcomes["TestSloppyStore"].items() if not ok)
    assert "test_purge_drops_ready_and_delayed_only" in failed, failed
    assert len(outcomes["TestSloppyStore"]) == len(contract)
