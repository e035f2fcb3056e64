"""Fuzzing a live server process: random requests and mutated frames never crash it or disturb others."""

from __future__ import annotations

import math
import random
import socket
import threading
from pathlib import Path
from typing import Any

import msgpack

from conveyor.client.queue_client import QueueClient
from conveyor.message import Message
from conveyor.server.handlers import HANDLERS
from conveyor.server.processes import spawn_server, stop_server

from ..support.servers import RawConnection, frame

FRAMES = 10_000
SEED = 20261122
QUEUES = ["f0", "f1", "f2", "f-mem"]  # a bounded set: every queue is real files on the server


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10 if depth < 2 else 7)
    if kind == 0:
        return rng.choice([0, 1, -1, 3, 255, 2**31, 2**63 - 1, 2**64 - 1, -(2**63)])
    if kind == 1:
        return rng.choice([0.0, 0.05, -1.5, 1e300, math.inf, -math.inf, math.nan])
    if kind == 2:
        return rng.choice(["", "q", "../..", "f0", "x" * 300, "\u00e9\u4e2d", "\x00"])
    if kind == 3:
        return rng.randbytes(rng.randrange(40))
    if kind == 4:
        return rng.choice([None, True, False])
    if kind in (5, 6):
        return rng.choice(QUEUES)
    if kind in (7, 8):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    return {rng.choice(["k", "v", "id", "op", ""]): _value(rng, depth + 1) for _ in range(rng.randrange(4))}


def random_request(rng: random.Random, rid: int) -> tuple[dict[str, Any], list[bytes]]:
    """A well-framed request whose contents are anything: valid, wrong types, unknown operations."""
    op = rng.choice([*HANDLERS, "nope", "", "hello", "auth"])
    keys = [
        "queue",
        "n",
        "ids",
        "lease_s",
        "wait_s",
        "errors",
        "delay_s",
        "prio",
        "nb",
        "ma",
        "hdr",
        "none",
        "after",
        "limit",
        "key",
        "kind",
        "max_attempts",
        "fsync",
    ]
    header: dict[str, Any] = {k: _value(rng) for k in rng.sample(keys, rng.randrange(len(keys)))}
    if rng.random() < 0.8:
        header["queue"] = rng.choice(QUEUES)
    if op == "get" and isinstance(header.get("wait_s"), (int, float)) and not header["wait_s"] <= 0.05:
        header["wait_s"] = 0.0  # a long poll is valid, just slow: not what this test is about
    header.update(op=op, id=rid)
    frames = [rng.randbytes(rng.randrange(64)) for _ in range(rng.choice([0, 0, 1, 2, 5]))]
    if op == "put" and rng.random() < 0.5:
        header["n"] = len(frames)
    return header, frames


def mutate(rng: random.Random, data: bytes) -> bytes:
    """Flip, cut, duplicate or replace bytes of a valid frame set."""
    b = bytearray(data)
    how = rng.randrange(5)
    if how == 0:
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif how == 1:
        del b[rng.randrange(len(b)) :]
    elif how == 2:
        b[:8] = rng.randbytes(8)  # header length and frame count: anything
    elif how == 3:
        b += rng.randbytes(rng.randrange(1, 50))
    else:
        b = bytearray(rng.randbytes(rng.randrange(1, 200)))
    return bytes(b)


class GoodClient(threading.Thread):
    """Works its own queue the whole time; any failure is kept and fails the test."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.client = QueueClient(address, timeout=30)
        self.stop = threading.Event()
        self.rounds = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                ids = self.client.put("good", [Message(payload=b"g%d" % self.rounds)] * 3)
                got = self.client.get("good", 3, lease_s=60)
                assert [m.id for m in got] == ids, (ids, got)
                assert self.client.ack("good", ids, [b"r"] * 3) == [True] * 3
                self.rounds += 1
        except BaseException as e:
            self.error = e
        finally:
            self.client.close()


def _send_and_finish(address: str, data: bytes) -> None:
    """Send bytes on a fresh connection, close our side, read whatever comes until the server closes."""
    raw = RawConnection(address, timeout=10)
    try:
        raw.send(data)
        raw.sock.shutdown(socket.SHUT_WR)
        assert raw.closed_by_server()
    except (ConnectionResetError, BrokenPipeError):
        pass
    finally:
        raw.close()


def test_fuzzed_frames_never_crash_the_server(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    with open(tmp_path / "server.log", "wb") as log:
        proc, address = spawn_server(tmp_path / "data", stderr=log)
    good = GoodClient(address)
    good.start()
    sent = {"framed": 0, "mutated": 0}
    try:
        raw = RawConnection(address, timeout=10)
        for rid in range(1, FRAMES + 1):
            header, frames = random_request(rng, rid)
            try:
                data = frame(header, frames)
            except (OverflowError, ValueError, TypeError):  # msgpack cannot encode it: send junk bytes instead
                data = rng.randbytes(30)
            if rng.random() < 0.25:
                _send_and_finish(address, mutate(rng, data))
                sent["mutated"] += 1
                continue
            try:
                raw.send(data)
                reply = raw.read()
                assert reply["id"] == rid or "error" in reply
                if header["op"] in ("hello", "auth") or reply.get("error") == "protocol":
                    raise EOFError  # the server may close after these
            except (EOFError, ConnectionResetError, BrokenPipeError, TimeoutError):
                raw.close()
                raw = RawConnection(address, timeout=10)
            sent["framed"] += 1
            assert proc.poll() is None, f"server died after frame {rid}"
        raw.close()
    finally:
        good.stop.set()
        good.join(30)
        alive = proc.poll() is None
        stop_server(proc)
    assert alive, (tmp_path / "server.log").read_text()[-3000:]
    assert good.error is None, f"the well-formed client failed: {good.error!r}"
    assert good.rounds > 10 and sum(sent.values()) == FRAMES
    assert sent["mutated"] > 2000 and sent["framed"] > 6000
    assert proc.returncode == 0  # it still stopped cleanly on SIGTERM
    log_text = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log_text, log_text[log_text.index("Traceback") - 500 :][:4000]


def test_msgpack_bombs_in_headers_are_refused(tmp_path: Path) -> None:
    """Deeply nested or huge declared containers in a header are a clean error, not a crash."""
    with open(tmp_path / "server.log", "wb") as log:
        proc, address = spawn_server(None, stderr=log)
    try:
        for header in (b"\x91" * 100_000 + b"\xc0", b"\xdf\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff"):
            _send_and_finish(address, frame(header))
        with QueueClient(address) as c:
            assert c.ping()["pong"]
    finally:
        stop_server(proc)
    assert msgpack  # the bombs above are raw msgpack bytes
