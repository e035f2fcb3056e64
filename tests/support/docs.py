"""The code examples of the docs, as a user would paste them: a section's Python block, run as a script."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def section_code(page: str, heading: str) -> str:
    """The one Python block of the section of docs/`page` under the heading that starts with `heading`."""
    text = (DOCS / page).read_text()
    _, found, rest = text.partition(f"\n{heading}")
    assert found, f"docs/{page} has no heading {heading!r}"
    section = re.split(r"\n#{1,3} ", rest, maxsplit=1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"docs/{page}, {heading!r}: {len(blocks)} Python blocks, not one"
    return blocks[0]


def run_example(code: str, where: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `code` as a script in `where` (its own directory, as a user's), bounded by `timeout` seconds."""
    script = where / "example.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], cwd=where, capture_output=True, text=True, timeout=timeout)
