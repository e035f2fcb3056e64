"""The optional parts of Conveyor and the pip extra each needs.

`pip install conveyor` gives the queue servers, workers, the command line, the dashboard and the
metrics. Spark (`conveyor.spark`, `conveyor.local()`, `conveyor.cluster()`), the TaskGraph
(`conveyor.graph`), Quokka's programs (`conveyor.compat.quokka`) and `conveyor demo` need
`pip install 'conveyor[spark]'` (`conveyor[quokka]` adds polars, for Quokka's programs on polars
frames); the demo's model scene needs `pip install 'conveyor[demo]'` (Spark and scikit-learn).
A package that needs an extra checks for it as it is imported, so that a missing one is one
ImportError naming the pip command, not "No module named 'pyspark'" from deep inside a call.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Extra:
    """A pip extra: its name and the modules it brings."""

    name: str
    modules: tuple[str, ...]


SPARK = Extra("spark", ("pyspark", "pyarrow", "pandas", "numpy"))
DEMO = Extra("demo", (*SPARK.modules, "sklearn"))  # the demo's scene e predicts with a scikit-learn model


class MissingExtraError(ImportError):
    """A part of Conveyor was imported without the pip extra it needs."""


def require(extra: Extra, what: str) -> None:
    """Raise `MissingExtraError` naming the pip command when a module of `extra` is not installed.

    `what` names the part that needs it, for the message. Only looks the modules up: imports nothing.
    """
    missing = [m for m in extra.modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtraError(
            f"{what} needs Conveyor's {extra.name!r} extra ({', '.join(missing)} not installed): "
            f"pip install 'conveyor[{extra.name}]' (from a clone of the repository: pip install -e '.[{extra.name}]')",
            name=missing[0],
        )
