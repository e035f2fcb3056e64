"""The `conveyor` command line: commands, the demo and the tables they print."""

from __future__ import annotations

from conveyor.cli.commands import main

__all__ = ["main"]
