"""The `conveyor` command."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import click
from rich.console import Console, Group
from rich.live import Live

from conveyor import __version__
from conveyor.cli.connecting import Connection, connect_options, open_pool, token_of
from conveyor.cli.demo import DEFAULT_SCENES, SCENE_KEYS, run_demo, summary_table, verdicts
from conveyor.cli.tables import dead_letter_table, servers_table, stats_table, workers_table
from conveyor.cli.worker_command import worker
from conveyor.constants import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MEMORY_BUDGET_BYTES,
    DEFAULT_PORT,
    DEFAULT_REQUEST_TIMEOUT_S,
    MAX_LEASE_S,
    MIN_MEMORY_BUDGET_BYTES,
)
from conveyor.dashboard import DEFAULT_DASHBOARD_PORT, Dashboard
from conveyor.errors import ConveyorError
from conveyor.gc_policy import tune_gc
from conveyor.protocol import requests as calls
from conveyor.protocol.framing import Limits
from conveyor.protocol.tls import cert_fingerprint, server_context
from conveyor.server.queue_server import QueueServer
from conveyor.server.queues import Defaults
from conveyor.server.runtime import check_data_dir, reachable_addresses


@click.group()
@click.version_option(__version__, prog_name="conveyor")
@click.option("-v", "--verbose", is_flag=True, help="Log what the stores do (torn tails cut, segments compacted).")
def main(verbose: bool) -> None:
    """Conveyor: a durable distributed task queue and dataflow runtime on Apache Spark."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@main.command()
@click.option(
    "--pages",
    default=9000,
    show_default=True,
    type=click.IntRange(40),
    help="Pages in the corpus of scenes a and d (b and c take a quarter of it).",
)
@click.option("--workers", default=None, type=click.IntRange(1), help="Consumers (default: one per Spark slot).")
@click.option(
    "--scenes",
    "keys",
    default=DEFAULT_SCENES,
    show_default=True,
    help="Which scenes to run, in order: a skewed documents, b pages that crash their process, c a page "
    "that hangs, d a worker killed midway.",
)
@click.option("--kill-worker", is_flag=True, help="Run scene d (a worker killed midway) too.")
@click.option(
    "--dashboard",
    "with_dashboard",
    is_flag=True,
    help="Serve the dashboard of the demo's queue servers meanwhile, and print its address.",
)
def demo(pages: int, workers: int | None, keys: str, kill_worker: bool, with_dashboard: bool) -> None:
    """Process a corpus of documents page by page through the queue on Spark and with plain Spark, scene by scene."""
    keys = keys.lower() + ("d" if kill_worker and "d" not in keys.lower() else "")
    if not keys or any(k not in SCENE_KEYS for k in keys) or len(set(keys)) != len(keys):
        raise click.BadParameter(f"letters of {SCENE_KEYS!r}, each at most once (got {keys!r})", param_hint="--scenes")
    console = Console(stderr=True)
    console.print(f"[bold]conveyor demo[/]: scenes {', '.join(keys)}; each through conveyor.spark.map, then plain Spark")
    results = run_demo(pages, workers, keys, console, dashboard=with_dashboard)
    out = Console()
    out.print(summary_table(results))
    for line in verdicts(results):
        out.print(line, highlight=False)
    wrong = [r for r in results if not r.expected()]
    if wrong:
        raise click.ClickException(
            "; ".join(
                f"scene {r.scene.key}: the map brought back {r.conveyor.done:,} pages and "
                f"reported {sum(r.conveyor.failed.values())} of {r.total:,}, with "
                f"{sum(r.faults.values())} bad"
                for r in wrong
            )
        )


@main.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0: every IPv4 interface; ::, every IPv6 one). A non-loopback one "
    "needs a token, and TLS to be safe.",
)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where durable queues live. Without it, every queue is transient (memory only).",
)
@click.option(
    "--token",
    envvar="CONVEYOR_TOKEN",
    default=None,
    help="Shared secret clients must prove they know (env CONVEYOR_TOKEN); --token-file keeps it off the command line.",
)
@click.option(
    "--token-file",
    envvar="CONVEYOR_TOKEN_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A file holding the token (its first line), e.g. a mounted secret (env CONVEYOR_TOKEN_FILE).",
)
@click.option("--insecure", is_flag=True, help="Allow a non-loopback address without a token.")
@click.option(
    "--tls-cert",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="TLS certificate (PEM): every connection encrypted and integrity-checked. Needs --tls-key.",
)
@click.option(
    "--tls-key", type=click.Path(dir_okay=False, path_type=Path), default=None, help="The certificate's private key (PEM)."
)
@click.option(
    "--tls-ca",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="CA certificates (PEM): clients must present a certificate one of them signed.",
)
@click.option(
    "--fsync",
    type=click.Choice(["batch", "interval", "never"]),
    default="batch",
    show_default=True,
    help="Default fsync policy of durable queues (see docs/storage.md for what each can lose).",
)
@click.option(
    "--lease",
    "lease_s",
    default=DEFAULT_LEASE_S,
    show_default=True,
    type=click.FloatRange(0, MAX_LEASE_S, min_open=True),
    help="Default lease (visibility timeout) in seconds.",
)
@click.option(
    "--max-attempts",
    default=DEFAULT_MAX_ATTEMPTS,
    show_default=True,
    type=click.IntRange(1, 0xFFFF),
    help="Default deliveries before a dead letter.",
)
@click.option(
    "--max-frame-bytes",
    default=DEFAULT_MAX_FRAME_BYTES,
    show_default=True,
    type=click.IntRange(1, 2**32 - 1),
    help="Largest payload frame accepted.",
)
@click.option(
    "--max-connections",
    default=None,
    type=click.IntRange(1),
    help=f"Connections served at once; more are refused with an error saying so [default: a quarter of "
    f"the descriptor limit, at most {DEFAULT_MAX_CONNECTIONS}].",
)
@click.option(
    "--idle-timeout",
    "idle_timeout_s",
    default=DEFAULT_IDLE_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Seconds after which a connection with nothing under way is closed (clients reconnect unseen).",
)
@click.option(
    "--request-timeout",
    "request_timeout_s",
    default=DEFAULT_REQUEST_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Seconds a request may take to arrive, first bytes to last (and a reply to be read).",
)
@click.option(
    "--memory-budget-mib",
    default=DEFAULT_MEMORY_BUDGET_BYTES >> 20,
    show_default=True,
    type=click.IntRange(MIN_MEMORY_BUDGET_BYTES >> 20),
    help="MiB held at once for requests and unsent replies; past it, the connections holding the most wait "
    "(requests are limited to fit).",
)
@click.option("--repair", is_flag=True, help="Open damaged durable queues keeping what is intact (damaged bytes are kept aside).")
@click.option("--temporary", is_flag=True, help="Remove --data-dir when the server stops: queues on disk, not kept.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (https with TLS; a token, if given, as a "
    "bearer token); 0 picks a free port. Off by default. See docs/metrics.md.",
)
@click.option(
    "--stop-with-parent",
    is_flag=True,
    help="Also stop cleanly when the process that started the server ends, however it ends "
    "(seen at once when stdin is a pipe from that process).",
)
def serve(
    host: str,
    port: int,
    data_dir: Path | None,
    token: str | None,
    token_file: Path | None,
    insecure: bool,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_ca: Path | None,
    fsync: str,
    lease_s: float,
    max_attempts: int,
    max_frame_bytes: int,
    max_connections: int | None,
    idle_timeout_s: float,
    request_timeout_s: float,
    memory_budget_mib: int,
    repair: bool,
    temporary: bool,
    metrics_port: int | None,
    stop_with_parent: bool,
) -> None:
    """Run a queue server until SIGTERM or Ctrl-C.

    Prints "listening on tcp://HOST:PORT" (tls:// with TLS) on stdout once it accepts connections;
    bound to every interface, an address per interface; with TLS, the certificate's fingerprint;
    with --metrics-port, "metrics on URL".
    """
    if (tls_cert is None) != (tls_key is None) or (tls_ca is not None and tls_cert is None):
        raise click.UsageError("--tls-cert and --tls-key go together (and --tls-ca needs them)")
    token = token_of(token, token_file)

    limits = Limits(max_frame_bytes=max_frame_bytes, max_message_bytes=max(DEFAULT_MAX_MESSAGE_BYTES, max_frame_bytes))
    defaults = Defaults(lease_s=lease_s, max_attempts=max_attempts, fsync=fsync)

    def ready(address: str) -> None:  # in one write: a parent reading the first line may close the pipe after it
        first, *more = reachable_addresses(address, server.host, server.port)
        lines = [
            f"listening on {first}",
            *([f"also reachable at {', '.join(more)}"] if more else []),
            *(
                [f"TLS certificate sha256 fingerprint: {cert_fingerprint(tls_cert)} (clients may pin it)"]
                if tls_cert is not None
                else []
            ),
            *([f"metrics on {server.metrics_address}"] if server.metrics_address else []),
        ]
        try:
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:  # nobody reads on: not a reason to stop serving
            pass

    try:
        if data_dir is not None:
            check_data_dir(data_dir)  # what is wrong with it and what to do, before anything is opened there
        tls = None if tls_cert is None or tls_key is None else server_context(tls_cert, tls_key, tls_ca)
        server = QueueServer(
            host,
            port,
            data_dir=data_dir,
            token=token,
            insecure=insecure,
            tls=tls,
            limits=limits,
            defaults=defaults,
            repair=repair,
            temporary=temporary,
            max_connections=max_connections,
            idle_timeout_s=idle_timeout_s,
            request_timeout_s=request_timeout_s,
            metrics_port=metrics_port,
            memory_budget=memory_budget_mib << 20,
        )
        tune_gc()  # this process only serves
        server.run(on_ready=ready, stop_with_parent=stop_with_parent)
    except ConveyorError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        if e.filename is not None:  # a file (in the data directory): not the address
            raise click.ClickException(f"cannot use {e.filename}: {e.strerror}") from None
        raise click.ClickException(f"cannot listen on {host}:{port}: {e}") from None


PIPE_WIDTH = 100_000  # columns of a console into a file or a pipe: more than any line needs
EXIT_SERVER_DOWN = 3  # `conveyor stats`: what it could show is shown, but a server did not answer


def _stdout() -> Console:
    """A console for stdout that, into a file or a pipe, is as wide as what it prints.

    Into a file or a pipe rich would print 80 columns; here a table fits its content, and no queue or
    consumer name is cut or folded.
    """
    console = Console()
    if not console.is_terminal:
        console.width = PIPE_WIDTH
    return console


@main.command()
@connect_options
@click.option("--queue", default=None, help="Only this queue.")
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
        console = _stdout()
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


@main.command()
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


@main.command("dead-letters")
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
                _stdout().print(dead_letter_table(pool, queue, limit))
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


@main.command()
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


main.add_command(worker)
