"""`conveyor cancel`: messages taken off their queue before they run, by id."""

from __future__ import annotations

import click

from conveyor.cli.connecting import Connection, connect_options, open_pool
from conveyor.cli.message_ids import message_ids
from conveyor.client.sharded import format_id
from conveyor.errors import ConveyorError
from conveyor.protocol.requests import CancelOutcome

EXIT_NOT_ALL = 1  # some ids were not cancelled (each said why)


@click.command()
@connect_options
@click.option("-Q", "--queue", required=True, help="The queue the messages are in.")
@click.argument("ids", nargs=-1, required=True, callback=message_ids)
def cancel(conn: Connection, queue: str, ids: tuple[int, ...]) -> None:
    """Cancel messages of a queue by id (shard:n, as `conveyor call` and `dead-letters` print them).

    A message still waiting (ready, or delayed: for its time or for a retry) becomes a dead letter
    with the error "cancelled before it ran": a wait for its result ends with that error, and
    `conveyor dead-letters --requeue ID` puts it back. A message delivered to a worker is not
    cancelled (its task may be running, and is not stopped), nor one that has finished: each id's
    line says what became of it.

    Exit status: 0 when every id was cancelled; 1 when one was not (after every id's line).
    """
    with open_pool(conn) as pool:
        try:
            outcomes = pool.queues.cancel(queue, ids)
        except ValueError as e:  # an id of a shard this pool does not have
            raise click.BadParameter(str(e), param_hint="IDS") from None
        except ConveyorError as e:
            raise click.ClickException(str(e)) from None
    for i, outcome in zip(ids, outcomes, strict=True):
        click.echo(f"{format_id(i)}: {outcome.value}")
    if any(o is not CancelOutcome.CANCELLED for o in outcomes):
        click.get_current_context().exit(EXIT_NOT_ALL)
