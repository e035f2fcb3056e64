"""ndkale's helpers (`kale.utils`): importing a class by its dotted path, and the peak resident memory.

The worker measures its memory with `worker.resident_kb` (the memory now, not the peak: see there);
`ru_maxrss_mb` is kept for code that calls it.
"""

from __future__ import annotations

import importlib
import resource
import sys
from typing import Any


def class_import_from_path(path_to_class: str) -> Any:
    """The object named by a dotted path (`package.module.Class`), importing its module.

    The module is the longest importable prefix, so a class nested in a class
    (`module.Outer.Inner`) is found too. An ImportError or AttributeError says what is missing.
    """
    parts = path_to_class.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if cut > 1 and e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
                continue  # this prefix is no module: a shorter one may be, the rest its attributes
            raise
        for attr in parts[cut:]:
            found = getattr(found, attr)
        return found
    raise ImportError(f"{path_to_class!r} is not a dotted path to a class (module.Class)")


def ru_maxrss_mb() -> float:
    """This process's peak resident set size in MB (`ru_maxrss`: bytes on macOS, KB elsewhere)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
