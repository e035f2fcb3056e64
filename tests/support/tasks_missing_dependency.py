"""A task module whose own dependency is not installed: importing it fails on that dependency."""

from __future__ import annotations

import importlib

import conveyor

importlib.import_module("conveyor_test_no_such_dependency")  # as `import ...` would, without a type checker's complaint


@conveyor.task(queue="jobs")
def never_registered() -> None:
    """Never defined: the import above fails first."""
