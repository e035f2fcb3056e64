from __future__ import annotations

from conveyor.cli import main

main()
