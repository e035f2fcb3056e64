"""Message ids on the command line: taken as `shard:n` (or the integer), the form every command prints them in."""

from __future__ import annotations

import click

from conveyor.client.sharded import parse_id


def message_ids(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[int, ...]:
    """An argument's ids as pool-wide ids (a click callback): a usage error names one that is not an id."""
    try:
        return tuple(parse_id(v) for v in values)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None
