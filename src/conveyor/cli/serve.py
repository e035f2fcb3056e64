"""`conveyor serve`: a queue server, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from conveyor.cli.connecting import token_of
from conveyor.cli.logs import loglevel_option
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
from conveyor.errors import ConveyorError
from conveyor.gc_policy import tune_gc
from conveyor.protocol.framing import Limits
from conveyor.protocol.tls import cert_fingerprint, server_context
from conveyor.server.queue_server import QueueServer
from conveyor.server.queues import Defaults
from conveyor.server.runtime import check_data_dir, reachable_addresses


@click.command()
@loglevel_option
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
    show_envvar=True,
    default=None,
    help="Shared secret clients must prove they know; --token-file keeps it off the command line.",
)
@click.option(
    "--token-file",
    envvar="CONVEYOR_TOKEN_FILE",
    show_envvar=True,
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A file holding the token (its first line), e.g. a mounted secret.",
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
