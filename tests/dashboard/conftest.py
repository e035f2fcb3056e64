"""The dashboard's browser: the system Chromium driven by Playwright, one per test module, a page per test."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from .browsing import VIEWPORT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no chromium on this machine: .ci/run installs it (apt-get install chromium)")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])  # root in CI: no sandbox there
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page; `errors` collects its uncaught script errors, `refused` what its CSP blocked (both kept empty)."""
    context = browser.new_context(viewport=VIEWPORT)
    p = context.new_page()
    p.set_default_timeout(20_000)
    p.errors = []  # type: ignore[attr-defined]
    p.refused = []  # type: ignore[attr-defined]
    p.on("pageerror", lambda e: p.errors.append(str(e)))  # type: ignore[attr-defined]
    p.on("console", lambda m: p.refused.append(m.text) if "Content Security Policy" in m.text else None)  # type: ignore[attr-defined]
    p.on("dialog", lambda d: d.accept())  # the requeue's and the cancel's confirmation
    yield p
    context.close()
