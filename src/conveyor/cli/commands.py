"""The `conveyor` command: its group options, and every command registered on it.

Each command lives in a module named after it (`serve`, `worker`, `call`, `stats`, `inspect`,
`dashboard`, `dead_letters`, `cancel`, `purge`, `drop`, `demo`); this is the one place that lists
them. `demo` needs the `spark` extra: it is loaded when asked for, and without the extra it is a
command that says which pip command to run.
"""

from __future__ import annotations

import importlib

import click

from conveyor import __version__
from conveyor.cli.call import call
from conveyor.cli.cancel import cancel
from conveyor.cli.dashboard import dashboard
from conveyor.cli.dead_letters import dead_letters
from conveyor.cli.drop import drop
from conveyor.cli.inspect import inspect
from conveyor.cli.logs import loglevel_option, verbose_option
from conveyor.cli.purge import purge
from conveyor.cli.serve import serve
from conveyor.cli.stats import stats
from conveyor.cli.worker import worker
from conveyor.extras import MissingExtraError

WITH_EXTRAS = {"demo": "conveyor.cli.demo"}  # commands that need a pip extra: name -> module, loaded on use


class Commands(click.Group):
    """The command group; the commands of `WITH_EXTRAS` load when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *WITH_EXTRAS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in WITH_EXTRAS:
            return super().get_command(ctx, cmd_name)
        try:
            command: click.Command = getattr(importlib.import_module(WITH_EXTRAS[cmd_name]), cmd_name)
        except MissingExtraError as e:
            return _needs_extra(cmd_name, e)
        return command


def _needs_extra(name: str, error: MissingExtraError) -> click.Command:
    """A command that cannot run without a pip extra: it says which, and exits with status 1."""

    def refuse() -> None:
        raise click.ClickException(str(error))

    return click.Command(
        name,
        callback=refuse,
        help=str(error),
        short_help="(needs the spark extra: pip install 'conveyor[spark]')",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})  # every command inherits -h
@click.version_option(__version__, prog_name="conveyor")
@loglevel_option
@verbose_option
def main() -> None:
    """Conveyor: a durable distributed task queue and dataflow runtime on Apache Spark."""


for command in (serve, worker, call, stats, inspect, dashboard, dead_letters, cancel, purge, drop):
    main.add_command(command)
