"""What the dashboard's browser tests share besides their fixtures: the screenshots for the docs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

VIEWPORT = {"width": 1280, "height": 900}  # every screenshot in docs/images is taken at this size


def shot(page: Any, name: str) -> None:
    """A screenshot for the docs, when asked for (CONVEYOR_SCREENSHOTS=DIR)."""
    where = os.environ.get("CONVEYOR_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / f"{name}.png"), full_page=True)
