"""How the `conveyor` commands log: `-l/--loglevel` (and `-v`), to stderr, each line dated (LOG_FORMAT).

The group takes the options (`conveyor -l INFO worker ...`), and so does each command that runs until
stopped (`conveyor worker -l INFO ...`, as Celery's worker takes it); the last one given wins. The
processes a worker starts (consumers, task processes) log at the level set here, in the same format.
"""

from __future__ import annotations

import logging
from typing import Any

import click

from conveyor.constants import LOG_FORMAT

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _configure() -> logging.Logger:
    """The root logger, writing dated lines to stderr (set up once; WARNING until a level is given)."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    return root


def _set_level(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    root = _configure()
    if value is not None:
        root.setLevel(value.upper())


def _verbose(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    root = _configure()
    if value:
        root.setLevel(min(root.level, logging.INFO))


def loglevel_option(f: Any) -> Any:
    """`-l/--loglevel LEVEL`: log at LEVEL from here on (the command's logging is set up as it is parsed)."""
    return click.option(
        "-l",
        "--loglevel",
        type=click.Choice(LEVELS, case_sensitive=False),
        default=None,
        expose_value=False,
        callback=_set_level,
        metavar="LEVEL",
        help="Log at LEVEL (DEBUG, INFO, WARNING or ERROR, any case) and above, to stderr, each line dated [default: WARNING].",
    )(f)


def verbose_option(f: Any) -> Any:
    """`-v/--verbose`: at least INFO (-l INFO)."""
    return click.option(
        "-v",
        "--verbose",
        is_flag=True,
        expose_value=False,
        callback=_verbose,
        help="Log at INFO at least (-l INFO): what the stores, servers and workers do.",
    )(f)
