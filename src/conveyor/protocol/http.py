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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web

MAX_HTTP_CONNECTIONS = 64
HANDSHAKE_S = 10.0
KEEPALIVE_S = 15.0  # idle keep-alive connections do not hold places for long
SHUTDOWN_S = 1.0  # a browser's or a scraper's keep-alive connection holds up no stop for longer


def bearer_ok(header: str, key: bytes) -> bool:
    """Whether an Authorization header is `Bearer <token>` for this token (compared in constant time)."""
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)


class _Refused(asyncio.Protocol):
    """A connection over the limit: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


async def serve_app(app: web.Application, host: str, port: int, tls: ssl.SSLContext | None) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port (0: a free port); (the runner, whose `cleanup()` stops it, the port)."""
    from aiohttp import web

    class Site(web.TCPSite):
        async def start(self) -> None:
            await web.BaseSite.start(self)  # registers the site with its runner, as TCPSite.start does
            server = self._runner.server
            assert server is not None

            def protocol() -> asyncio.BaseProtocol:
                return _Refused() if len(server.connections) >= MAX_HTTP_CONNECTIONS else server()

            self._server = await asyncio.get_running_loop().create_server(
                protocol,
                self._host,
                self._port,
                ssl=self._ssl_context,
                backlog=self._backlog,
                ssl_handshake_timeout=None if self._ssl_context is None else HANDSHAKE_S,
            )
            self._bound_port = self._server.sockets[0].getsockname()[1]

    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_S,
        keepalive_timeout=KEEPALIVE_S,
        handler_cancellation=True,
    )
    await runner.setup()
    site = Site(runner, host, port, ssl_context=tls)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])
