"""The `conveyor` command line: commands, the demo and the tables they print.

`main` loads on first use: a process that imports only `conveyor.cli.corpus` (a Spark Python worker
of the demo, a consumer forked for a script that uses the corpus) does not pay for click and every
command (~35 ms here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.lazy import lazy_attributes

if TYPE_CHECKING:
    from conveyor.cli.commands import main

__all__ = ["main"]
__getattr__ = lazy_attributes(__name__, {"main": "conveyor.cli.commands"})
