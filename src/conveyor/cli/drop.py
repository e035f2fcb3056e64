"""`conveyor drop`: queues removed from every server, with everything in them."""

from __future__ import annotations

import click

from conveyor.cli.connecting import Connection, connect_options, open_pool
from conveyor.errors import ConveyorError


@click.command()
@connect_options
@click.argument("queues", nargs=-1, required=True)
@click.option("--yes", is_flag=True, help="Do not ask first.")
def drop(conn: Connection, queues: tuple[str, ...], yes: bool) -> None:
    """Remove QUEUES from every server, with their messages, results and dead letters.

    For queues nothing uses any more, such as those `conveyor.spark.map` leaves holding its
    results. Stop their consumers first: a consumer still fetching would make a queue anew.
    """
    if not yes:
        click.confirm(f"Remove {', '.join(queues)} and everything in them?", abort=True, err=True)
    with open_pool(conn) as pool:
        try:
            for q in queues:
                click.echo(f"{q}: {'dropped' if pool.drop(q) else 'no such queue'}")
        except ConveyorError as e:
            raise click.ClickException(str(e)) from None
