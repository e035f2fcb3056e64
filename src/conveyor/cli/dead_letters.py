"""`conveyor dead-letters`: a queue's dead letters, listed or put back on the queue."""

from __future__ import annotations

import click

from conveyor.cli.connecting import Connection, connect_options, open_pool
from conveyor.cli.message_ids import message_ids
from conveyor.cli.tables import dead_letter_table, stdout_console
from conveyor.errors import ConveyorError


@click.command("dead-letters")
@connect_options
@click.option("-Q", "--queue", required=True, help="The queue whose dead letters to list.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1), help="Show at most this many.")
@click.option("--requeue", is_flag=True, help="Put the dead letters of the queue back on it (fresh attempts), then forget them.")
@click.option("--yes", is_flag=True, help="With --requeue: do not ask first.")
@click.argument("ids", nargs=-1, callback=message_ids)
def dead_letters(conn: Connection, queue: str, limit: int, requeue: bool, yes: bool, ids: tuple[int, ...]) -> None:
    """List a queue's dead letters: id (shard:n), attempts, when and why they failed, and a payload preview.

    With --requeue, put them back on the queue instead (for a worker that lacked a task module,
    say): every one, or those of IDS (shard:n, as listed); a crash midway can leave a message both
    requeued and still a dead letter.
    """
    if ids and not requeue:
        raise click.UsageError("IDS name dead letters to requeue: give --requeue with them")
    with open_pool(conn) as pool:
        try:
            if not requeue:
                stdout_console().print(dead_letter_table(pool, queue, limit))
                return
            wanted = set(ids)
            n = len([d for d in pool.dead_letters(queue) if not wanted or d.message.id in wanted])
            if n == 0:
                click.echo(f"{queue}: no dead letters" + (" of those ids" if ids else ""))
                return
            if not yes:
                click.confirm(f"Put {n:,} dead letter(s) of {queue!r} back on the queue?", abort=True, err=True)
            click.echo(f"{queue}: requeued {pool.requeue_dead_letters(queue, list(ids) or None):,} dead letter(s)")
        except ValueError as e:  # an id of a shard this pool does not have
            raise click.BadParameter(str(e), param_hint="IDS") from None
        except ConveyorError as e:
            raise click.ClickException(str(e)) from None
