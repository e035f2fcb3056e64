"""`conveyor stats`: each server, each queue's counts and rates, and the consumers, once or refreshed."""

from __future__ import annotations

import time

import click
from rich.console import Group
from rich.live import Live

from conveyor.cli.connecting import Connection, connect_options, open_pool
from conveyor.cli.tables import servers_table, stats_table, stdout_console, workers_table
from conveyor.protocol import requests as calls

EXIT_SERVER_DOWN = 3  # what it could show is shown, but a server did not answer


@click.command()
@connect_options
@click.option("-Q", "--queue", default=None, help="Only this queue.")
@click.option("--per-shard", is_flag=True, help="One row per queue and shard.")
@click.option("--watch", type=click.FloatRange(0.1), default=None, help="Refresh every N seconds until Ctrl-C.")
@click.option(
    "--timeout",
    "timeout_s",
    default=3.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Seconds to wait for a server (to connect, then to answer) before showing it DOWN.",
)
def stats(conn: Connection, queue: str | None, per_shard: bool, watch: float | None, timeout_s: float) -> None:
    """Show each server, each queue's counts and rates, and the consumers.

    Each server shows UP, or DOWN with its error; each queue, its ready, delivered, delayed, acked and
    failed counts and rates (summed over the servers that answered).

    Exit status: 0 when every server answered; 3 when one did not (after showing the others; with
    --watch, as of the last refresh); 1 on other errors, such as a --queue no server has.
    """
    with open_pool(conn, connect_timeout=timeout_s, timeout=timeout_s) as pool:
        got = pool.queues.on_every_server(calls.server_stats())

        def tables() -> Group:
            shown = (servers_table(pool.addresses, got), stats_table(pool.addresses, got, queue, per_shard), workers_table(got))
            return Group(*(t for t in shown if t is not None))

        if queue is not None and watch is None and all(not isinstance(g, Exception) and queue not in g.queues for g in got):
            raise click.ClickException(f"no queue named {queue!r} on any of the {len(got)} servers")
        console = stdout_console()
        try:
            if watch is None:
                console.print(tables())
            elif not console.is_terminal:  # a file or a pipe: one dated snapshot per interval, as it comes
                while True:
                    console.print(time.strftime("%Y-%m-%d %H:%M:%S"), tables())
                    console.file.flush()
                    time.sleep(watch)
                    got = pool.queues.on_every_server(calls.server_stats())
            else:
                with Live(tables(), console=console, auto_refresh=False) as live:
                    while True:
                        time.sleep(watch)
                        got = pool.queues.on_every_server(calls.server_stats())
                        live.update(tables(), refresh=True)
        except KeyboardInterrupt:
            pass
    if any(isinstance(g, Exception) for g in got):
        click.get_current_context().exit(EXIT_SERVER_DOWN)
