"""`Dashboard`: the dashboard over a pool, served from an event loop of its own.

`Dashboard`: the dashboard over a pool, served from an event loop of its own (a thread), startable
from Python as from `conveyor dashboard`; the address rules it starts under.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from conveyor.client.pool import QueuePool
from conveyor.dashboard.hosts import Hosts
from conveyor.dashboard.state import PoolWatch
from conveyor.dashboard.web import start
from conveyor.errors import ConveyorError
from conveyor.protocol.auth import is_loopback
from conveyor.protocol.tls import netloc

if TYPE_CHECKING:
    from conveyor.protocol.http import HttpService

DEFAULT_DASHBOARD_PORT = 8470
START_TIMEOUT_S = 30.0


class Dashboard:
    """The dashboard of `pool` on http(s)://host:port (port 0: a free one; `url` tells).

    On loopback (the default) it needs nothing. Elsewhere it needs the pool's `token`, which the
    page asks for to log in, and `tls` (its own certificate: the login carries the token), unless
    `insecure` accepts a plain-HTTP login. It answers requests addressed to a loopback name, to
    `host`, or to a name in `allow_hosts` (NAME, or NAME:PORT), and no other (see `hosts`).
    """

    def __init__(
        self,
        pool: QueuePool,
        host: str = "127.0.0.1",
        port: int = DEFAULT_DASHBOARD_PORT,
        *,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        insecure: bool = False,
        allow_hosts: Iterable[str] = (),
    ) -> None:
        if not is_loopback(host):
            if not token:
                raise ConveyorError(
                    f"refusing to serve the dashboard on {host} without the pool's token: anyone who can "
                    "reach it could read the queues and requeue dead letters. Give the token "
                    "(--token or CONVEYOR_TOKEN), or keep it on loopback"
                )
            if tls is None and not insecure:
                raise ConveyorError(
                    f"refusing to serve the dashboard on {host} without TLS: its login would send the "
                    "token in clear. Give --cert and --key, or --insecure to accept that"
                )
        self.pool, self.host, self.port, self.token, self.tls = pool, host, port, token or None, tls
        self.hosts = Hosts.allowing(host, [allow_hosts] if isinstance(allow_hosts, str) else allow_hosts)
        self.watch: PoolWatch | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: HttpService | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    @property
    def url(self) -> str:
        return f"http{'' if self.tls is None else 's'}://{netloc(self.host, self.port)}/"

    def start(self) -> Dashboard:
        """Start serving (in a daemon thread); returns once it listens, or raises why it could not."""
        if self.watch is not None:
            raise ConveyorError("this dashboard was started already")
        self.watch = PoolWatch(self.pool)
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                assert self.watch is not None
                serving = start(self.watch, self.host, self.port, self.token, self.tls, self.hosts)
                self._runner, self.port = loop.run_until_complete(serving)
            except BaseException as e:
                failed.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._runner.cleanup())
                loop.close()
                self._stopped.set()

        self._thread = threading.Thread(target=run, name="conveyor-dashboard", daemon=True)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S):
            self.stop()
            raise ConveyorError(f"the dashboard did not start within {START_TIMEOUT_S:.0f} s")
        if failed:
            self.watch.close()
            if isinstance(failed[0], OSError):
                raise ConveyorError(f"cannot serve the dashboard on {self.host}:{self.port}: {failed[0]}") from failed[0]
            raise failed[0]
        return self

    def stop(self) -> None:
        """Stop serving (requests under way end first), then stop watching the servers."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT_S)
        if self.watch is not None:
            self.watch.close()

    def serve_forever(self) -> None:
        """Block until SIGINT or SIGTERM (the main thread only), then stop."""
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        try:
            while not stop.wait(1.0) and not self._stopped.is_set():
                pass
        finally:
            self.stop()

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
