"""`conveyor dashboard`: the live web dashboard of running servers, until SIGTERM or Ctrl-C."""

from __future__ import annotations

from pathlib import Path

import click

from conveyor.cli.connecting import Connection, connect_options, open_pool
from conveyor.cli.logs import loglevel_option
from conveyor.dashboard import DEFAULT_DASHBOARD_PORT, Dashboard
from conveyor.errors import ConveyorError
from conveyor.protocol.tls import server_context


@click.command()
@loglevel_option
@connect_options
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address of the page. Off loopback it needs the pool's token (the page asks for it) and TLS.",
)
@click.option("--port", default=DEFAULT_DASHBOARD_PORT, show_default=True, type=click.IntRange(0, 65535), help="0: a free port.")
@click.option("--cert", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Serve over HTTPS: certificate.")
@click.option("--key", type=click.Path(dir_okay=False, path_type=Path), default=None, help="The key of --cert (PEM).")
@click.option("--insecure", is_flag=True, help="Allow a non-loopback address without TLS (the login then crosses in clear).")
@click.option("--allow-host", multiple=True, metavar="NAME", help="Also answer requests to NAME (or NAME:PORT). Repeatable.")
def dashboard(
    conn: Connection, host: str, port: int, cert: Path | None, key: Path | None, insecure: bool, allow_host: tuple[str, ...]
) -> None:
    """Serve a live web dashboard of the servers: queues, rates, consumers, map jobs, dead letters (with requeue).

    Prints "dashboard on URL"; runs until SIGTERM or Ctrl-C. See docs/dashboard.md.
    """
    if (cert is None) != (key is None):
        raise click.UsageError("--cert and --key go together")
    try:
        tls = None if cert is None or key is None else server_context(cert, key)
        with open_pool(conn) as pool:
            board = Dashboard(pool, host, port, token=conn.token, tls=tls, insecure=insecure, allow_hosts=allow_host).start()
            click.echo(f"dashboard on {board.url}")
            board.serve_forever()
    except ConveyorError as e:
        raise click.ClickException(str(e)) from None
