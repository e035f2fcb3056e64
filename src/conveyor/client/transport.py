"""The transport under `QueueClient`: one connection to a queue server, many requests in flight on it.

A client connects lazily and reconnects with exponential backoff (up to `connect_timeout`: its
patience) when its connection is gone; with a patience of 0 it makes one attempt per request, for an
owner that retries on its own terms (a consumer serves the other servers meanwhile, and stops at
once). A request whose connection breaks before its reply raises `ConnectionLostError` and is not
retried: it may have taken effect (a put may have been stored), and only the caller knows whether
repeating it is safe.
"""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from conveyor.constants import DEFAULT_PORT, ERR_AUTH, ERR_PROTOCOL
from conveyor.errors import AuthError, ConnectionLostError, ConveyorError, ProtocolError, RequestError
from conveyor.protocol import framing as protocol
from conveyor.protocol import requests as calls
from conveyor.protocol.auth import as_key, auth_request, check_server_proof
from conveyor.protocol.declarations import LIMITS_KEY
from conveyor.protocol.framing import Frames, Header, Limits
from conveyor.protocol.requests import Call
from conveyor.protocol.tls import TCP_SCHEME, TLS_SCHEME, ClientTLS, connect_hint, netloc, refused_after_handshake

if TYPE_CHECKING:
    from typing import Self

T = TypeVar("T")
PIPELINE_WINDOW = 16  # requests a blocking client keeps in flight in `pipeline`
BYE_TIMEOUT_S = 2.0  # how long `close` waits for the server to hear a tied connection's `bye`
STALE_CHECK_S = 1.0  # a connection idle this long is looked at (closed by the server?) before it is used
CONNECT_ATTEMPT_S = 1.0  # the least one attempt to connect may take, whatever patience is left (a distant server)
_FATAL = (ERR_PROTOCOL, ERR_AUTH)  # error kinds after which the server closes the connection


def parse_address(address: str) -> tuple[str, int]:
    """("host", port) from "tcp://host:port", "tls://host:port", "host:port" or "[::1]:port"."""
    rest = address.removeprefix(TCP_SCHEME).removeprefix(TLS_SCHEME)
    if "://" in rest:
        raise ValueError(f"unsupported address {address!r}: use tcp://host:port (or tls://host:port)")
    host, sep, port = rest.rpartition(":")
    if not sep:
        host, port = rest, str(DEFAULT_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad address {address!r}: use tcp://host:port")
    return host, int(port)


def _raise_remote(header: Header) -> NoReturn:
    kind, message = header.get("error"), str(header.get("message", ""))
    if kind == ERR_PROTOCOL:
        raise ProtocolError(f"server: {message}", header.get("id", 0))
    if kind == ERR_AUTH:
        raise AuthError(message)
    raise RequestError(str(kind), message)


def _result(call: Call[T], header: Header, frames: Frames) -> T:
    if "error" in header:
        _raise_remote(header)
    return call.parse(header, frames)


class Transport:
    """A blocking connection to one queue server; thread-safe (one request at a time, or `pipeline`).

    TLS (`ClientTLS.make`): `tls=True` (or a tls:// address) trusts the system's CAs, `ca` a CA file,
    `fingerprint` pins the server's certificate (as `conveyor serve` prints it); `cert` and `key`: this
    client's certificate, for a server started with --tls-ca. The address then reads tls://.
    `connect_timeout`: how long a request may wait for a connection, its owner may change it (0: one attempt).
    """

    def __init__(
        self,
        address: str = f"tcp://127.0.0.1:{DEFAULT_PORT}",
        token: str | bytes | None = None,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        limits: Limits | None = None,
        tls: bool | ClientTLS | None = None,
        ca: str | Path | None = None,
        fingerprint: str | Sequence[str] | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
    ) -> None:
        self.host, self.port = parse_address(address)
        if tls is False and address.startswith(TLS_SCHEME):
            raise ValueError(f"tls=False with the TLS address {address}: use tcp:// for plain TCP")
        self.tls = ClientTLS.make(tls or address.startswith(TLS_SCHEME), ca=ca, fingerprint=fingerprint, cert=cert, key=key)
        self.address = f"{TCP_SCHEME if self.tls is None else TLS_SCHEME}{netloc(self.host, self.port)}"
        self._key = as_key(token)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.limits = limits or Limits()  # what this client accepts in a reply
        # told to the server in every request when not the default (a server never sends more)
        self._lim = None if self.limits == Limits() else self.limits.as_list()
        self.server_limits = Limits()  # what the server accepts in a request: from its hello
        self.server_idle_s: float | None = None  # the server closes a connection silent for this long
        self._used = 0.0  # monotonic time of the last reply (or of connecting)
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None
        self._reader: protocol.SocketReader | None = None
        self._lock = threading.RLock()
        self.tied = False  # this connection took leases tied to it (`get(tie=True)`): see `close`
        self._torn = False  # a send failed part way: see `_drop`
        # monotonic time of the first failure in the current run of failures (None: the last exchange worked)
        self.unreachable_since: float | None = None

    def _idle_too_long(self) -> bool:
        """Idle for half the server's idle timeout: connect anew before the server closes this one.

        Otherwise the server could close it under a request (which would then be lost to the caller
        as may-or-may-not-have-happened). Never a tied connection: the server keeps it while its
        leases stand (they would lose their tie on another), and `_stale` finds it closed once they
        are gone.
        """
        return not self.tied and self.server_idle_s is not None and time.monotonic() - self._used > self.server_idle_s / 2

    def _greeted(self, greeting: Header) -> None:
        """Take in what a server's hello says of it (a server before these fields: the defaults)."""
        try:
            self.server_limits = Limits.from_list(greeting.get("limits", Limits().as_list()))
        except ValueError:
            self.server_limits = Limits()
        idle = greeting.get("idle_s")
        self.server_idle_s = float(idle) if isinstance(idle, (int, float)) and idle > 0 else None

    def _request(self, call: Call[Any], rid: int) -> Header:
        header = {**call.args, "op": call.op, "id": rid}
        if self._lim is not None:
            header[LIMITS_KEY] = self._lim
        return header

    def _attempts(self) -> Iterator[float]:
        """The patience left before each connection attempt.

        The first attempt at once, the next after a backoff (0.05 s, doubling up to 1 s) while
        `connect_timeout` lasts; one attempt with a patience of 0.
        """
        deadline = time.monotonic() + self.connect_timeout
        delay = 0.05
        yield self.connect_timeout
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(delay, left))
            yield deadline - time.monotonic()
            delay = min(delay * 2, 1.0)

    def _failed(self) -> None:
        if self.unreachable_since is None:
            self.unreachable_since = time.monotonic()

    def unreachable_s(self) -> float:
        """Seconds since the server stopped answering (0.0 while it answers)."""
        since = self.unreachable_since
        return 0.0 if since is None else time.monotonic() - since

    def _cannot_connect(self, started: float, error: BaseException | None) -> ConnectionLostError:
        return ConnectionLostError(
            f"cannot connect to {self.address} (tried for {time.monotonic() - started:.1f} s): "
            f"{error}{connect_hint(error, self.tls is not None)}"
        )

    def _secure(self, sock: socket.socket) -> socket.socket:
        return sock if self.tls is None else self.tls.wrap(sock, self.host, self.address)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r})"

    # --- transport ------------------------------------------------------------------------
    def connect(self) -> Self:
        """Connect now (otherwise the first request does), retrying with backoff."""
        with self._lock:
            if self._sock is None:
                self._connect()
        return self

    def _connect(self) -> None:
        started, error = time.monotonic(), None
        for left in self._attempts():
            try:  # a server that drops the packets holds an attempt as long as the patience left, not `timeout`
                sock = socket.create_connection((self.host, self.port), timeout=min(self.timeout, max(left, CONNECT_ATTEMPT_S)))
                sock.settimeout(self.timeout)  # the handshakes, once connected, as long as any reply
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock = self._secure(sock)
            except OSError as e:
                error = e
                self._failed()
                continue
            self._sock, self._reader = sock, protocol.SocketReader(sock, self.limits)
            self._used = time.monotonic()
            try:
                self._handshake()
            except ssl.SSLError as e:  # after the TLS handshake: the server refused our certificate, say
                self._drop()
                raise refused_after_handshake(e, self.address) from None
            except OSError as e:  # a server starting or stopping: try again
                self._drop()
                error = e
                self._failed()
                continue
            except BaseException:
                self._drop()
                raise
            return
        raise self._cannot_connect(started, error)

    def _handshake(self) -> None:
        assert self._reader is not None
        greeting, _ = self._reader.read()
        req = auth_request(greeting, self._key, self.address, next(self._ids))
        self._greeted(greeting)
        if req is not None:
            header, mine = req
            self._send(header, ())
            reply, _ = self._reader.read()
            assert self._key is not None
            check_server_proof(reply, self._key, greeting["nonce"], mine, self.address)

    def _send(self, header: Header, frames: Sequence[bytes]) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(b"".join(protocol.encode(header, frames)))
        except BaseException:
            self._torn = True  # some of the frame may have gone: nothing may follow it on this connection
            raise

    def _recv(self, want: int, got: dict[int, tuple[Header, Frames]], pending: set[int]) -> tuple[Header, Frames]:
        """The reply to request `want`, keeping replies to other pending requests that come first."""
        assert self._reader is not None
        while want not in got:
            header, frames = self._reader.read()
            rid = header.get("id")
            if rid in pending:  # anything else is the late reply of a request that timed out
                got[rid] = (header, frames)
        pending.discard(want)
        return got.pop(want)

    def call(self, call: Call[T]) -> T:
        """Send one request and return its parsed reply."""
        result: T = self.pipeline([call])[0]
        return result

    def pipeline(self, batch: Sequence[Call[Any]]) -> list[Any]:
        """Run several requests with up to PIPELINE_WINDOW in flight at once; results in order.

        The first failing request's error is raised after every reply has been read.
        """
        with self._lock:
            if self._sock is not None and self._stale():
                self.close()
            if self._sock is None:
                self._connect()
            assert self._sock is not None
            self.tied = self.tied or any(c.ties for c in batch)
            wait = self.timeout + max((c.wait_s for c in batch), default=0.0)
            try:
                self._sock.settimeout(wait)
                rids = [next(self._ids) for _ in batch]
                pending = set(rids)
                got: dict[int, tuple[Header, Frames]] = {}
                replies: list[tuple[Header, Frames]] = []
                for k, (rid, c) in enumerate(zip(rids, batch, strict=True)):
                    if k >= PIPELINE_WINDOW:
                        replies.append(self._recv(rids[k - PIPELINE_WINDOW], got, pending))
                    self._send(self._request(c, rid), c.frames)
                replies += [self._recv(rid, got, pending) for rid in rids[len(replies) :]]
                self._used = time.monotonic()
                self.unreachable_since = None
                if any(h.get("error") in _FATAL for h, _ in replies):
                    self._drop()  # the server closes a connection after a protocol error
            except TimeoutError:  # the server is slow, not gone: its late replies cannot be told apart from the next
                self._drop(farewell=True)
                self._failed()
                raise TimeoutError(f"{self.address}: no reply within {wait:.1f} s") from None
            except ProtocolError:
                self._drop()
                raise
            except ssl.SSLError as e:  # a record that fails its integrity check: refused by either end
                self._drop()
                self._failed()
                raise ConnectionLostError(
                    f"{self.address}: connection lost: TLS error ({e.reason or e}): data altered on "
                    "the way, or the connection broke mid-record"
                ) from None
            except OSError as e:
                self._drop()
                self._failed()
                why = " (over TLS, a server also closes a connection whose data fails its integrity check)" if self.tls else ""
                raise ConnectionLostError(f"{self.address}: connection lost: {e}{why}") from None
        out: list[Any] = []
        error: ConveyorError | None = None
        for c, (h, f) in zip(batch, replies, strict=True):
            try:
                out.append(_result(c, h, f))
            except ConveyorError as e:
                error = error or e
                out.append(None)
        if error is not None:
            raise error
        return out

    def _stale(self) -> bool:
        """Whether the connection was idle long enough that the server may have closed it, or has.

        The server says after how long in its hello. Then a request is sent on a new one, never lost
        on it.
        """
        if self._idle_too_long():
            return True
        if time.monotonic() - self._used < STALE_CHECK_S:
            return False
        assert self._sock is not None
        try:
            poll = select.poll()  # not select(): a server's process may hold descriptors past FD_SETSIZE
            poll.register(self._sock, select.POLLIN)
            if not poll.poll(0):
                return False
            if isinstance(self._sock, ssl.SSLSocket):  # no peeking through TLS: a late reply is dropped with it
                return True
            return self._sock.recv(1, socket.MSG_PEEK) == b""  # else: a late reply, read in turn
        except OSError:
            return True

    def close(self) -> None:
        """Close the connection; one that took tied leases (`get(tie=True)`) says `bye` first.

        Then the server leaves those leases to their time: this process lives on, only the
        connection goes.
        """
        self._drop(farewell=True)

    def _drop(self, farewell: bool = False) -> None:
        """Close the socket: without a word when it broke or cannot be read on (a protocol error).

        With `farewell`, a tied connection says `bye`, then waits for the server to close its side
        (so that no reset of ours, for replies left unread, overtakes it), for BYE_TIMEOUT_S at most
        in all. Not after a request was cut mid-frame: the bye would complete it, whereas a close
        makes the server drop it (its ties kept: a broken frame is a protocol error, not a death).
        """
        with self._lock:
            sock = self._sock
            try:
                if sock is not None and farewell and self.tied and not self._torn:
                    with contextlib.suppress(OSError):
                        deadline = time.monotonic() + min(self.timeout, BYE_TIMEOUT_S)
                        sock.settimeout(deadline - time.monotonic())
                        self._send(self._request(calls.bye(), next(self._ids)), ())
                        sock.shutdown(socket.SHUT_WR)
                        while (left := deadline - time.monotonic()) > 0:
                            sock.settimeout(left)
                            if not sock.recv(65536):  # late replies are dropped; b"": the server closed
                                break
            finally:
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
                self._sock = self._reader = None
                self.tied = self._torn = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # a client crosses to Spark executors as its settings
        state = self.__dict__.copy()
        state.update(_sock=None, _reader=None, _lock=None, _ids=None, unreachable_since=None, tied=False, _torn=False)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.RLock(), _ids=itertools.count(1))
