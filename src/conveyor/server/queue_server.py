"""QueueServer: an asyncio process hosting named queues behind the framed protocol.

Each connection is read in a loop; every request runs as its own task (bounded per connection),
so one connection carries many requests at once and replies go out as they finish, in any order.
A malformed frame set gets an error reply where one can be addressed, then the connection is
closed; the server and its other connections carry on. Payloads are never deserialized.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
import signal
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from conveyor.constants import (
    AUTH_SERVER_LABEL,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MEMORY_BUDGET_BYTES,
    DEFAULT_PORT,
    DEFAULT_REQUEST_TIMEOUT_S,
    ERR_AUTH,
    ERR_PROTOCOL,
    METRICS_PATH,
    TASK_LABELS,
)
from conveyor.errors import ConveyorError, ProtocolError, StoreError
from conveyor.protocol import framing as protocol
from conveyor.protocol.auth import as_key, client_proved, hello, is_loopback, new_nonce, proof, refusal
from conveyor.protocol.declarations import BYE
from conveyor.protocol.framing import Limits
from conveyor.protocol.http import MAX_HTTP_CONNECTIONS, HttpService
from conveyor.protocol.throttle import Throttle
from conveyor.protocol.tls import TCP_SCHEME, TLS_SCHEME, netloc
from conveyor.server.budget import MemoryBudget, RequestBytes, Share
from conveyor.server.connection import Connection, finished, linger, unless_gone
from conveyor.server.connection_leases import CONNECTION_LEASES
from conveyor.server.dispatch import handle
from conveyor.server.metrics import RequestTimes, ServerCollector, start_endpoint
from conveyor.server.queues import Defaults, QueueHost
from conveyor.server.runtime import close_listener, raise_fd_limit, run_loop, stop_accepting, watch_parent

log = logging.getLogger("conveyor.server.queue_server")

AUTH_TIMEOUT_S = 10.0
RESERVED_FDS = 128  # descriptors kept for the rest: listening socket, pipes, blobs, logs, thread pools
COMPLAIN_EVERY_S = 60.0  # a store error that recurs at every sweep is logged this often
_AUTH_LIMITS = Limits(max_header_bytes=4096, max_frames=1, max_frame_bytes=1, max_message_bytes=1)


class QueueServer:
    """Serves the queues under `data_dir` (durable) or in memory (no data dir) on host:port.

    Binds 127.0.0.1 by default. A non-loopback address needs a `token` (every client must prove it
    knows it) unless `insecure` is set, and without `tls` (`conveyor.protocol.tls.server_context`)
    draws a warning: on a network, what follows the token's handshake could be read and altered.
    Port 0 picks a free port; `address` tells which. With `temporary`, `data_dir` is removed once
    the server has stopped.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        data_dir: str | Path | None = None,
        token: str | bytes | None = None,
        insecure: bool = False,
        tls: ssl.SSLContext | None = None,
        limits: Limits | None = None,
        defaults: Defaults | None = None,
        repair: bool = False,
        sweep_interval_s: float = 0.5,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        temporary: bool = False,
        max_connections: int | None = None,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        metrics_port: int | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET_BYTES,
        task_labels: int = TASK_LABELS,
    ) -> None:
        """A server's settings; it listens once `start` or `run` runs.

        max_connections: more are refused with a clear error (None: as many as the descriptor
        limit leaves room for, at most DEFAULT_MAX_CONNECTIONS). A connection with no request under
        way is closed after `idle_timeout_s` of silence (clients reconnect unseen: the hello says
        when), and one that sent part of a request but not the rest within `request_timeout_s`.
        `metrics_port`: serve Prometheus metrics there too (0: a free port; `metrics_address` tells).
        `memory_budget`: bytes held at once for requests and unsent replies (`conveyor.server.budget`);
        `limits` are lowered to fit it. `task_labels`: the task names the metrics give a `task` label
        of their own, the most run (`conveyor.server.task_tallies`).
        """
        if temporary and data_dir is None:
            raise ConveyorError("a temporary server needs a data directory (to remove when it stops)")
        if temporary and data_dir is not None and Path(data_dir).is_dir() and any(Path(data_dir).iterdir()):
            raise ConveyorError(
                f"a temporary server needs a new or empty data directory: {data_dir} holds files, "
                "which it would delete when it stops"
            )
        self._key = as_key(token)
        self._throttle = Throttle()  # failed tokens, for the protocol and the metrics endpoint alike
        if self._key is None and not insecure and not is_loopback(host):
            raise ConveyorError(
                f"refusing to listen on {host} without a token: anyone who can reach it could read and "
                "change the queues. Give a token (--token or CONVEYOR_TOKEN), or --insecure "
                "to accept that"
            )
        if metrics_port is not None and self._key is not None and tls is None and not is_loopback(host):
            raise ConveyorError(
                f"refusing to serve metrics on {host} with a token but without TLS: each scrape would "
                "send the token in clear over the network. Give --tls-cert and --tls-key"
            )
        if tls is None and not is_loopback(host):
            log.warning(
                "listening on %s without TLS: the traffic can be read and altered by anyone on the network "
                "path (the token only proves who connects). Give --tls-cert and --tls-key",
                host,
            )
        self.tls, self.host, self.port = tls, host, port
        self.data_dir = None if data_dir is None else Path(data_dir)
        self.budget = MemoryBudget(memory_budget)
        self.limits = self.budget.fit(limits or Limits())
        self.defaults = defaults or Defaults()
        self.repair = repair
        self.temporary = temporary
        self.sweep_interval_s = sweep_interval_s
        self.max_in_flight = max_in_flight
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if not idle_timeout_s > 0 or not request_timeout_s > 0:
            raise ValueError("idle_timeout_s and request_timeout_s must be positive")
        self.max_connections, self.idle_timeout_s, self.request_timeout_s = max_connections, idle_timeout_s, request_timeout_s
        self.queues: QueueHost | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[Connection] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._stopped: asyncio.Event | None = None
        self._closing = False
        self._quiet_until = 0.0  # see _complain
        if task_labels < 0:
            raise ValueError(f"task_labels must be >= 0, got {task_labels}")
        self.task_labels = task_labels
        self.metrics_port = metrics_port
        self.request_times = RequestTimes()
        self._metrics: HttpService | None = None

    @property
    def address(self) -> str:
        return f"{TCP_SCHEME if self.tls is None else TLS_SCHEME}{netloc(self.host, self.port)}"

    @property
    def metrics_address(self) -> str | None:
        """Where the Prometheus metrics are served (None: nowhere)."""
        if self.metrics_port is None:
            return None
        return f"http{'' if self.tls is None else 's'}://{netloc(self.host, self.metrics_port)}{METRICS_PATH}"

    async def start(self) -> None:
        """Open the queues and start listening."""
        self._stopped = asyncio.Event()
        fds = raise_fd_limit()
        if self.max_connections is None:
            self.max_connections = max(1, min(DEFAULT_MAX_CONNECTIONS, fds // 4))
        budget = fds - self.max_connections - RESERVED_FDS - (MAX_HTTP_CONNECTIONS if self.metrics_port is not None else 0)
        if budget < 16:
            raise ConveyorError(
                f"a descriptor limit of {fds} (ulimit -n) leaves no room for queues beside "
                f"{self.max_connections} connections: raise it, or lower --max-connections"
            )
        self.queues = QueueHost(self.data_dir, self.defaults, self.repair, fd_budget=budget, task_labels=self.task_labels)
        try:
            if self.metrics_port is not None:  # first: a failure here leaves no client connected
                collector = ServerCollector(lambda: self.queues, self.request_times, lambda: len(self._conns), self.budget)
                self._metrics, self.metrics_port = await start_endpoint(
                    collector, self.host, self.metrics_port, self._key, self.tls, self._throttle
                )
            handshake_s = None if self.tls is None else AUTH_TIMEOUT_S  # unaccounted until done: kept short
            self._server = await asyncio.start_server(
                self._serve, self.host, self.port, limit=2**20, ssl=self.tls, ssl_handshake_timeout=handshake_s
            )
        except BaseException:
            if self._metrics is not None:
                await self._metrics.cleanup()
            self.queues.close()
            raise
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = asyncio.create_task(self._sweep())
        log.info("listening on %s%s", self.address, " (token required)" if self._key else "")

    async def wait_stopped(self) -> None:
        assert self._stopped is not None
        await self._stopped.wait()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop listening, let running requests finish (long polls return at once), close the stores."""
        if self._closing or self._server is None:
            return
        self._closing = True  # from here a connection accepted is closed at once (_serve)
        stop_accepting(self._server)
        self._sweeper.cancel() if self._sweeper is not None else None
        assert self.queues is not None
        self.queues.closing = True
        for q in self.queues.queues.values():
            q.changed.notify()
        self.queues.settled.notify()
        conns = list(self._conns)
        readers = [c.reader_task for c in conns if c.reader_task is not None and c.reader_task is not asyncio.current_task()]
        for t in readers:
            t.cancel()
        running = [t for c in conns for t in c.tasks]
        await close_listener(self._server)
        if running:
            _, late = await asyncio.wait(running, timeout=grace_s)
            for t in late:
                t.cancel()
        for c in conns:
            c.writer.close()
        if readers:  # cancelled, they still have to run their clean-up: a loop closed before that warns of them
            await asyncio.wait(readers, timeout=grace_s)
        if self._metrics is not None:  # not before: the connections above are taken before any await
            await self._metrics.cleanup()
        self.queues.close()
        if self.temporary:
            assert self.data_dir is not None
            shutil.rmtree(self.data_dir, ignore_errors=True)
        log.info("stopped; queues closed%s", f", {self.data_dir} removed" if self.temporary else "")
        assert self._stopped is not None
        self._stopped.set()

    def run(self, on_ready: Callable[[str], None] | None = None, *, stop_with_parent: bool = False) -> None:
        """Serve until SIGTERM or SIGINT, then stop cleanly. `on_ready(address)` runs once listening.

        With `stop_with_parent`, the end of the process that started it stops it too, however that
        process ended (even SIGKILL): seen at once when stdin is a pipe from that process (it
        closes), else within PARENT_CHECK_S (this process is handed to another parent).
        """

        async def main() -> None:
            await self.start()
            loop = asyncio.get_running_loop()
            stopping: list[asyncio.Future[None]] = []  # a reference, so the stop is not collected midway

            def stop() -> None:
                stopping.append(asyncio.ensure_future(self.stop()))

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop)
            if stop_with_parent:
                stopping.append(asyncio.ensure_future(watch_parent(loop, stop)))
            if on_ready is not None:
                on_ready(self.address)
            await self.wait_stopped()

        run_loop(main())

    # --- connections ----------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:  # accepted as the server stops, after stop() took the connections it closes
            writer.close()
            return
        peer = writer.get_extra_info("peername")
        name = f"{peer[0]}:{peer[1]}" if peer else "?"
        conn = Connection(writer, name, Share(self.budget, name), asyncio.current_task(), tls=self.tls is not None)
        assert self.max_connections is not None
        if len(self._conns) >= self.max_connections:  # refused in words, not by running out of descriptors
            self._complain(f"refused {conn.peer}: {self.max_connections} connections already (--max-connections)")
            await conn.send(refusal(f"it has {self.max_connections} connections, its limit (--max-connections); try again later"))
            writer.close()
            return
        self._conns.add(conn)
        CONNECTION_LEASES.set(conn.leases)  # its requests' tasks start from this context: `get` finds its connection's ties
        peer_closed = False
        try:
            nonce = new_nonce()
            await conn.send(hello(self._key, nonce, self.limits.as_list(), self.idle_timeout_s))
            if self._key is not None and not await self._authenticate(reader, conn, nonce):
                await linger(reader, writer)
                return
            slots = asyncio.Semaphore(self.max_in_flight)
            assert self.queues is not None
            while not self._closing:
                try:
                    header, frames = await protocol.read(reader, self.limits, True, conn.started, conn.share.admit)
                except EOFError:
                    peer_closed = True
                    break
                except ProtocolError as e:
                    log.warning("%s: protocol error, closing the connection: %s", conn.peer, e)
                    await conn.error(e.request_id, ERR_PROTOCOL, str(e))
                    await linger(reader, writer)
                    break
                finally:
                    conn.reading = None
                if header["op"] == BYE.name:  # now, not in its task: the close that follows may cancel that
                    conn.leases.clear()
                await slots.acquire()
                request_bytes = RequestBytes(conn.share)
                task = asyncio.create_task(handle(conn, self.queues, self.request_times, header, frames, request_bytes))
                del frames  # the task's now: freed when it is done
                conn.tasks.add(task)
                task.add_done_callback(functools.partial(finished, conn, slots, request_bytes))
        except ConnectionError:
            peer_closed = True
        except asyncio.CancelledError:
            pass
        except ssl.SSLError as e:  # a record failed its integrity check, say: the peer is told only by the close
            log.warning("%s: TLS error, closing the connection: %s (data altered on the way?)", conn.peer, e.reason or e)
        finally:
            RequestBytes(conn.share).release()  # a request cut short
            self._conns.discard(conn)
            if not self._closing:  # else stop() lets running requests answer, then closes
                for t in conn.tasks:
                    t.cancel()  # the client is gone: nobody will read these replies
                writer.close()
                if peer_closed and not conn.dropped:
                    assert self.queues is not None
                    conn.leases.end(self.queues, conn.peer)

    async def _authenticate(self, reader: asyncio.StreamReader, conn: Connection, nonce: bytes) -> bool:
        assert self._key is not None
        try:
            header, _ = await asyncio.wait_for(protocol.read(reader, _AUTH_LIMITS, request=True), AUTH_TIMEOUT_S)
        except (EOFError, TimeoutError, asyncio.TimeoutError):  # two classes before Python 3.11
            return False
        except ProtocolError as e:
            await conn.error(e.request_id, ERR_AUTH, f"authentication required first: {e}")
            return False
        rid = header["id"]
        if header["op"] != "auth":
            await conn.error(rid, ERR_AUTH, "this server requires a token: authenticate before anything else")
            log.warning("%s: refused: no token", conn.peer)
            return False
        key, peer = self._key, conn.writer.get_extra_info("peername")  # failures are throttled per source address
        check = self._throttle.check(peer[0] if peer else None, lambda: client_proved(key, nonce, header))
        passed = await unless_gone(reader, check)  # a guesser gone waits no longer (its guess, if checked, counted)
        if passed is None:
            return False
        if not passed:
            await conn.error(rid, ERR_AUTH, "wrong token")
            log.warning("%s: refused: wrong token", conn.peer)
            return False
        await conn.send({"id": rid, "ok": True, "proof": proof(key, AUTH_SERVER_LABEL, nonce, header["nonce"])})
        return True

    def _complain(self, message: str) -> None:
        """Log a warning that may recur often (a flood of connections) at most once a COMPLAIN_EVERY_S."""
        now = time.monotonic()
        if now >= self._quiet_until:
            self._quiet_until = now + COMPLAIN_EVERY_S
            log.warning("%s", message)

    def _close_silent(self) -> None:
        """Close connections idle past the idle timeout, and those stuck in the middle of a request, or not reading their replies.

        A request that waited that long for room in the memory budget is closed only by a sweep that
        closes nothing else: room may come back from those closed.
        """
        now = time.monotonic()
        waited, closed = [], False
        for c in list(self._conns):
            if c.reading is not None and now - c.reading > self.request_timeout_s:
                if c.share.waiting:
                    waited.append(c)
                    continue
                log.warning(
                    "%s: sent part of a request and not the rest within %g s: closing the connection",
                    c.peer,
                    self.request_timeout_s,
                )
            elif c.sending is not None and now - c.sending > self.request_timeout_s:
                log.warning("%s: read none of its replies for %g s: closing the connection", c.peer, self.request_timeout_s)
            elif c.reading is not None or c.tasks or now - c.active <= self.idle_timeout_s:
                continue
            elif c.leases.any_standing():  # a consumer whose tasks all run long: its silence counts from their end
                c.active = now
                continue
            self._drop(c)
            closed = True
        for c in [] if closed else waited:
            log.warning(
                "%s: its request waited %g s for room in the memory budget (--memory-budget-mib): closing the connection",
                c.peer,
                self.request_timeout_s,
            )
            self._drop(c)

    @staticmethod
    def _drop(c: Connection) -> None:
        c.dropped = True
        c.writer.transport.abort()
        if c.reader_task is not None:  # it may be waiting for room in the budget, not on its socket
            c.reader_task.cancel()

    async def _sweep(self) -> None:
        """Return expired leases to their queues, close silent connections, and sample the counters behind the rates."""
        assert self.queues is not None
        next_sample = 0.0
        complained: dict[str, float] = {}  # queue -> when its expiry last failed (a full disk fails it often)
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            self._close_silent()
            now = time.time()
            for q in list(self.queues.queues.values()):
                try:
                    if q.store.expire():
                        self.queues.touch(q)  # it wrote: its files are open again
                        q.changed.notify()
                        self.queues.settled.notify()  # past its last attempt, a message ends here
                    q.tasks.sweep(q.store.status, now)  # the deliveries whose leases ended: settled in its records
                except StoreError as e:
                    if time.monotonic() - complained.get(q.info.name, -COMPLAIN_EVERY_S) >= COMPLAIN_EVERY_S:
                        complained[q.info.name] = time.monotonic()
                        log.error("expiring leases of queue %s: %s (tried again at every sweep)", q.info.name, e)
                except Exception:
                    log.exception("expiring leases of queue %s", q.info.name)
            if time.monotonic() >= next_sample:
                self.queues.sample()
                next_sample = time.monotonic() + 1.0
