"""`conveyor dead-letters`: a queue's dead letters, listed or put back on the queue."""

from __future__ import annotations

import click

from conveyor.cli.connecting import Connection, connect_options, open_pool
from conveyor.cli.tables import dead_letter_table, stdout_console
from conveyor.errors import ConveyorError


@click.command("dead-letters")
@connect_options
@click.option("--queue", required=True, help="The queue whose dead letters to list.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1), help="Show at most this many.")
@click.option("--requeue", is_flag=True, help="Put every dead letter of the queue back on it (fresh attempts), then forget them.")
@click.option("--yes", is_flag=True, help="With --requeue: do not ask first.")
def dead_letters(conn: Connection, queue: str, limit: int, requeue: bool, yes: bool) -> None:
    """List a queue's dead letters: id, attempts, when and why they failed, and a payload preview.

    With --requeue, put them back on the queue instead (for a worker that lacked a task module,
    say); a crash midway can leave a message both requeued and still a dead letter.
    """
    with open_pool(conn) as pool:
        try:
            if not requeue:
                stdout_console().print(dead_letter_table(pool, queue, limit))
                return
            n = len(pool.dead_letters(queue))
            if n == 0:
                click.echo(f"{queue}: no dead letters")
                return
            if not yes:
                click.confirm(f"Put {n:,} dead letter(s) of {queue!r} back on the queue?", abort=True, err=True)
            click.echo(f"{queue}: requeued {pool.requeue_dead_letters(queue):,} dead letter(s)")
        except ConveyorError as e:
            raise click.ClickException(str(e)) from None
