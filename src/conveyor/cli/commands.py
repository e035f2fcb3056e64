"""The `conveyor` command: its group options, and every command registered on it.

Each command lives in a module named after it (`serve`, `stats`, `dashboard`, `dead_letters`,
`drop`, `worker`, `demo`); this is the one place that lists them.
"""

from __future__ import annotations

import logging

import click

from conveyor import __version__
from conveyor.cli.dashboard import dashboard
from conveyor.cli.dead_letters import dead_letters
from conveyor.cli.demo import demo
from conveyor.cli.drop import drop
from conveyor.cli.serve import serve
from conveyor.cli.stats import stats
from conveyor.cli.worker import worker


@click.group(context_settings={"help_option_names": ["-h", "--help"]})  # every command inherits -h
@click.version_option(__version__, prog_name="conveyor")
@click.option("-v", "--verbose", is_flag=True, help="Log what the stores do (torn tails cut, segments compacted).")
def main(verbose: bool) -> None:
    """Conveyor: a durable distributed task queue and dataflow runtime on Apache Spark."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


for command in (serve, stats, dashboard, dead_letters, drop, worker, demo):
    main.add_command(command)
