"""Attributes of a package loaded on first use, and old names kept for a release behind a warning.

Loading on first use keeps importing the package light (no Spark, no pyarrow).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, table: Mapping[str, str], moved: Mapping[str, str] | None = None) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `table[name]` (a module path) the first time `name` is asked for.

    `moved` maps deprecated names to the module that holds them now: they still resolve, with a
    DeprecationWarning the first time each is used.
    """
    moved = moved or {}

    def __getattr__(name: str) -> Any:
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        if name in moved:
            warnings.warn(
                f"{package}.{name} is deprecated and goes in the next release: import it from {moved[name]}",
                DeprecationWarning,
                stacklevel=2,
            )
            value = getattr(importlib.import_module(moved[name]), name)
            setattr(sys.modules[package], name, value)  # warned once: later lookups find it here
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
