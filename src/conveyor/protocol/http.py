"""Serving an aiohttp application on the same terms as the queue protocol.

Serving an aiohttp application on the same terms as the queue protocol (the metrics endpoint, the
dashboard): a TLS handshake ends within HANDSHAKE_S; at most MAX_HTTP_CONNECTIONS connections are
served at once (one more is closed once it is set up, rather than held: over TLS, after its
handshake; a burst accepted together may pass the mark by up to the listen backlog); an idle one is
closed after KEEPALIVE_S; a stop waits at most SHUTDOWN_S for the requests under way, then as long
again once it has asked them to end (aiohttp's way), then cancels them: a wrong token's answer held
back by the throttle holds a stop up for 2 x SHUTDOWN_S; a request whose client went away is dropped
at once.

aiohttp is imported where used: a process that never serves HTTP does not pay for it.
"""

from __future__ import annotations

import asyncio
import hmac
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web

MAX_HTTP_CONNECTIONS = 64
HANDSHAKE_S = 10.0
KEEPALIVE_S = 15.0  # idle keep-alive connections do not hold places for long
LISTEN_BACKLOG = 128  # aiohttp's sites' default
SHUTDOWN_S = 1.0  # a browser's or a scraper's keep-alive connection holds up no stop for longer


def bearer_ok(header: str, key: bytes) -> bool:
    """Whether an Authorization header is `Bearer <token>` for this token (compared in constant time)."""
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)


class _Refused(asyncio.Protocol):
    """A connection over the limit: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


@dataclass
class HttpService:
    """An application being served: `cleanup()` stops it (the listening socket first, then the requests under way)."""

    runner: web.AppRunner
    listener: asyncio.Server

    async def cleanup(self) -> None:
        self.listener.close()
        await self.runner.cleanup()


async def serve_app(app: web.Application, host: str, port: int, tls: ssl.SSLContext | None) -> tuple[HttpService, int]:
    """Serve `app` on host:port (0: a free port); (the service, whose `cleanup()` stops it, the port).

    The listening socket is the event loop's own server over the runner's request handler factory
    (aiohttp's public `AppRunner.server`), so that a connection over the limit is refused and a TLS
    handshake is bounded, which aiohttp's sites do not offer.
    """
    from aiohttp import web

    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_S,
        keepalive_timeout=KEEPALIVE_S,
        handler_cancellation=True,
    )
    await runner.setup()
    handlers = runner.server
    assert handlers is not None  # set up just above

    def protocol() -> asyncio.BaseProtocol:
        return _Refused() if len(handlers.connections) >= MAX_HTTP_CONNECTIONS else handlers()

    try:
        listener = await asyncio.get_running_loop().create_server(
            protocol, host, port, ssl=tls, backlog=LISTEN_BACKLOG, ssl_handshake_timeout=None if tls is None else HANDSHAKE_S
        )
    except BaseException:
        await runner.cleanup()
        raise
    return HttpService(runner, listener), int(listener.sockets[0].getsockname()[1])
