"""Real queue servers for tests, and `Confirmed`, the ledger of what they confirmed.

The servers run in a background thread of this process, or as child processes.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack

from conveyor.constants import FRAME_LENGTH, FRAME_PREFIX
from conveyor.message import Message
from conveyor.server.queue_server import QueueServer


class ThreadServer:
    """A QueueServer running its own event loop in a daemon thread, on a free loopback port."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("port", 0)
        self.server = QueueServer(**options)
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.error: BaseException | None = None

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(self.server.start())
            except BaseException as e:
                self.error = e
                started.set()
                return
            started.set()
            self.loop.run_until_complete(self.server.wait_stopped())

        self.thread = threading.Thread(target=run, name="test-server", daemon=True)
        self.thread.start()
        started.wait(30)
        if self.error is not None:
            self.thread.join(30)
            self.loop.close()
            raise self.error

    @property
    def address(self) -> str:
        return self.server.address

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the server's loop thread (stores are not thread-safe) and return its result."""

        async def wrapped() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(10)

    def stop(self) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
            self.thread.join(30)
        self.loop.close()


@contextmanager
def thread_server(**options: Any) -> Iterator[ThreadServer]:
    s = ThreadServer(**options)
    try:
        yield s
    finally:
        s.stop()


def wait_for(cond: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll `cond` until it returns something truthy (returned), failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(0.01)


def frame(header: dict[str, Any] | bytes, frames: list[bytes] = ()) -> bytes:  # type: ignore[assignment]
    """Raw bytes of a frame set (a header given as bytes is sent as is, valid or not)."""
    h = header if isinstance(header, bytes) else msgpack.packb(header, use_bin_type=True)
    lens = struct.pack(FRAME_LENGTH.format(len(frames)), *map(len, frames))
    return FRAME_PREFIX.pack(len(h), len(frames)) + lens + h + b"".join(frames)


class RawConnection:
    """A bare socket speaking frames, for sending what a real client never would."""

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.buf = b""
        self.hello = self.read()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("closed by the server")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read(self) -> dict[str, Any]:
        hl, nf = FRAME_PREFIX.unpack(self._exactly(FRAME_PREFIX.size))
        lens = struct.unpack(FRAME_LENGTH.format(nf), self._exactly(4 * nf))
        header = msgpack.unpackb(self._exactly(hl))
        self._exactly(sum(lens))
        return header

    def closed_by_server(self) -> bool:
        """True once the server has closed its end (after anything it sent first)."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def data_dir(tmp_path: Path, name: str = "data") -> Path:
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    return d


class Confirmed:
    """Every id a server confirmed, with the payload it was confirmed for."""

    def __init__(self) -> None:
        self.payload: dict[int, bytes] = {}

    def add(self, ids: list[int], messages: list[Message]) -> None:
        assert len(ids) == len(messages)
        for i, m in zip(ids, messages, strict=True):
            had = self.payload.setdefault(i, m.payload)
            assert had == m.payload, f"id {i} was confirmed for two payloads: {had!r} and {m.payload!r}"
