"""The `conveyor` command."""

from __future__ import annotations

import logging
from pathlib import Path

import click
from rich.console import Console

from . import __version__


@click.group()
@click.version_option(__version__, prog_name="conveyor")
@click.option("-v", "--verbose", is_flag=True, help="Log what the stores do (torn tails cut, segments compacted).")
def main(verbose: bool) -> None:
    """Conveyor: a durable distributed task queue and dataflow runtime on Apache Spark."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--messages", default=200_000, show_default=True, type=click.IntRange(1), help="Messages to put and consume.")
@click.option("--poison-every", default=1000, show_default=True, type=click.IntRange(1),
              help="Every Nth message fails each attempt and ends in the dead letters.")  # fmt: skip
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the durable store lives (default: a temporary directory, removed afterwards).")  # fmt: skip
def demo(messages: int, poison_every: int, data_dir: Path | None) -> None:
    """Put a workload through the memory and durable stores and print a summary."""
    from .demo import run_demo, summary_table

    console = Console(stderr=True)
    console.print(f"[bold]conveyor demo[/]: {messages:,} messages, every {poison_every:,}th a poison message")
    outcomes = run_demo(messages, data_dir, poison_every, console)
    Console().print(summary_table(outcomes))
    poison = messages // poison_every
    for o in outcomes:
        if o.acked != messages - poison or o.dead_letters != poison:
            raise click.ClickException(f"{o.store}: expected {messages - poison} acked and {poison} dead letters, "
                                       f"got {o.acked} and {o.dead_letters}")  # fmt: skip
