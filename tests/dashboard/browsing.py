"""What the dashboard's tests share besides their fixtures: the screenshots for the docs, calls of its JSON API."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

VIEWPORT = {"width": 1280, "height": 900}  # every screenshot in docs/images is taken at this size


def shot(page: Any, name: str) -> None:
    """A screenshot for the docs, when asked for (CONVEYOR_SCREENSHOTS=DIR)."""
    where = os.environ.get("CONVEYOR_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / f"{name}.png"), full_page=True)


def call_json(url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """A request to the dashboard's JSON API (a POST of `body` when given): its status and its JSON, errors too.

    `headers` as given, by default the CSRF header that a POST needs (`{}`: none).
    """
    data = None if body is None else json.dumps(body).encode()
    sent = {"X-Conveyor": "1"} if headers is None else headers
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **sent})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(json.loads(r.read()))
    except urllib.error.HTTPError as e:
        with e:
            return e.code, dict(json.loads(e.read()))
