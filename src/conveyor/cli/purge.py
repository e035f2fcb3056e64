"""`conveyor purge`: the messages waiting in queues (ready or delayed) dropped on every server."""

from __future__ import annotations

import click

from conveyor.cli.connecting import Connection, connect_options, open_pool
from conveyor.constants import ERR_NO_QUEUE
from conveyor.errors import ConveyorError, RequestError


@click.command()
@connect_options
@click.argument("queues", nargs=-1, required=True)
@click.option("--yes", is_flag=True, help="Do not ask first.")
def purge(conn: Connection, queues: tuple[str, ...], yes: bool) -> None:
    """Drop the messages waiting in QUEUES, ready or delayed, on every server; print how many per queue.

    Messages delivered to a worker are left to it, and results and dead letters stay (`conveyor
    drop` removes a queue with everything in it). A purged message is gone: no result, no dead letter.
    """
    if not yes:
        click.confirm(f"Drop every message waiting in {', '.join(queues)}?", abort=True, err=True)
    with open_pool(conn) as pool:
        try:
            for q in queues:
                try:
                    click.echo(f"{q}: purged {pool.purge(q):,} message(s)")
                except RequestError as e:
                    if e.kind != ERR_NO_QUEUE:
                        raise
                    click.echo(f"{q}: no such queue")
        except ConveyorError as e:
            raise click.ClickException(str(e)) from None
