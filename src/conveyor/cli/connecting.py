"""How the `conveyor` commands reach servers: `--connect`, the token (or its file) and TLS, as one `Connection`."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from conveyor.client.pool import QueuePool
from conveyor.errors import ConveyorError
from conveyor.protocol.auth import load_token
from conveyor.protocol.tls import ClientTLS


def token_of(token: str | None, token_file: Path | None) -> str | None:
    """The token given, or read from its file (an error that names the file, never its content)."""
    if token and token_file:
        raise click.UsageError("give the token or a token file, not both")
    try:
        return load_token(token_file) if token_file is not None else token
    except ConveyorError as e:
        raise click.ClickException(str(e)) from None


@dataclass(frozen=True)
class Connection:
    """How the commands that connect reach the servers: --connect, the token, and TLS."""

    addresses: tuple[str, ...]
    token: str | None
    tls: ClientTLS | None


def connect_options(f: Any) -> Any:
    """--connect and the options that go with it, passed on as `conn` (a Connection)."""

    @functools.wraps(f)
    def wrapped(
        addresses: tuple[str, ...],
        token: str | None,
        token_file: Path | None,
        tls: bool,
        tls_ca: Path | None,
        tls_fingerprint: str | None,
        tls_client_cert: Path | None,
        tls_client_key: Path | None,
        **kw: Any,
    ) -> Any:
        try:
            client_tls = ClientTLS.make(
                tls or None, ca=tls_ca, fingerprint=tls_fingerprint, cert=tls_client_cert, key=tls_client_key
            )
        except (ValueError, ConveyorError) as e:
            raise click.BadParameter(str(e), param_hint="--tls-*") from None
        return f(conn=Connection(addresses, token_of(token, token_file), client_tls), **kw)

    for option in reversed(
        [
            click.option(
                "--connect",
                "addresses",
                multiple=True,
                required=True,
                envvar="CONVEYOR_CONNECT",
                show_envvar=True,
                help="A server address (tcp://HOST:PORT, or tls://HOST:PORT); repeat it or separate with commas for a pool.",
            ),
            click.option("--token", envvar="CONVEYOR_TOKEN", show_envvar=True, default=None, help="The servers' token."),
            click.option(
                "--token-file",
                envvar="CONVEYOR_TOKEN_FILE",
                show_envvar=True,
                type=click.Path(dir_okay=False, path_type=Path),
                default=None,
                help="A file holding the token.",
            ),
            click.option("--tls", is_flag=True, help="Connect over TLS, trusting the system's CAs (as a tls:// address does)."),
            click.option(
                "--tls-ca",
                type=click.Path(dir_okay=False, path_type=Path),
                default=None,
                help="Trust the servers' certificates this CA file (PEM) signed.",
            ),
            click.option(
                "--tls-fingerprint",
                default=None,
                envvar="CONVEYOR_TLS_FINGERPRINT",
                show_envvar=True,
                help="Trust only the server certificate with this sha256 fingerprint (as `conveyor serve` prints it).",
            ),
            click.option(
                "--tls-client-cert",
                type=click.Path(dir_okay=False, path_type=Path),
                default=None,
                help="This client's certificate (PEM), for servers started with --tls-ca; with --tls-client-key.",
            ),
            click.option(
                "--tls-client-key",
                type=click.Path(dir_okay=False, path_type=Path),
                default=None,
                help="The key of --tls-client-cert (PEM).",
            ),
        ]
    ):
        wrapped = option(wrapped)
    return wrapped


def open_pool(conn: Connection, connect_timeout: float = 5.0, timeout: float = 30.0) -> QueuePool:
    flat = [a.strip() for item in conn.addresses for a in item.split(",") if a.strip()]
    try:
        return QueuePool.connect(flat, conn.token, tls=conn.tls, connect_timeout=connect_timeout, timeout=timeout)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--connect") from None
