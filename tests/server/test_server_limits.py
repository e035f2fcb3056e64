"""Limits instead of exhaustion.

A connection cap with a clear refusal, idle and partial-request timeouts (with or without a token),
and a bounded number of descriptors per queue.
"""

from __future__ import annotations

import errno
import os
import random
import resource
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conveyor.client.queue_client import QueueClient
from conveyor.constants import ERR_STORE
from conveyor.errors import ConnectionLostError, DiskFullError, RequestError, StoreError
from conveyor.message import Message, Status
from conveyor.server.processes import SERVER_START_TIMEOUT_S, stop_server
from conveyor.storage.files import store_error

from ..support.servers import RawConnection, frame, thread_server, wait_for


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_a_connection_over_the_cap_is_refused_in_words_and_the_others_carry_on(token: str | None) -> None:
    with thread_server(max_connections=3, token=token) as s, QueueClient(s.address, token) as mine:
        mine.put("q", [Message(payload=b"before")])
        others = [RawConnection(s.address) for _ in range(2)]
        with pytest.raises(ConnectionLostError, match="refused the connection: it has 3 connections, its limit"):
            QueueClient(s.address, token, connect_timeout=0.5).ping()
        assert mine.put("q", [Message(payload=b"after")]) == [2]  # connected: never failed by the others
        others.pop().close()
        wait_for(lambda: len(s.server._conns) == 2, what="the closed connection gone")
        with QueueClient(s.address, token) as late:
            assert [m.payload for m in late.get("q", 10)] == [b"before", b"after"]
        for o in others:
            o.close()


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_silent_connections_are_closed_and_clients_reconnect_unseen(token: str | None) -> None:
    with thread_server(idle_timeout_s=0.5, request_timeout_s=0.5, sweep_interval_s=0.05, token=token) as s:
        idle = RawConnection(s.address, timeout=0.1)
        wait_for(idle.closed_by_server, timeout=5, what="an idle connection closed")
        idle.close()
        partial = RawConnection(s.address, timeout=0.1)
        data = frame({"op": "ping", "id": 1, "pad": "x" * 100})
        partial.send(data[: len(data) // 2])  # half a request, and then nothing
        wait_for(partial.closed_by_server, timeout=5, what="a stalled request's connection closed")
        partial.close()
        with QueueClient(s.address, token) as c:
            assert c.connect().server_idle_s == 0.5
            c.put("q", [Message(payload=b"x")])
            wait_for(lambda: not s.server._conns, timeout=5, what="the client's idle connection closed")
            assert [m.payload for m in c.get("q", 1)] == [b"x"]  # on a new connection, unseen
        # a long poll is not silence: the connection stays while the request waits
        with QueueClient(s.address, token) as c:
            assert c.get("q", 1, wait_s=1.5) == []


@contextmanager
def _server_with_fd_limit(data: Path, limit: int, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`conveyor serve` in a process whose descriptor limit (soft and hard) is `limit`."""

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    cmd = [sys.executable, "-m", "conveyor", "serve", "--port", "0", "--data-dir", str(data), "--stop-with-parent"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.PIPE, stderr=err, preexec_fn=lower)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("listening on "), (line, log.read_text())
        yield proc, line.split()[-1]
    finally:
        stop_server(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.timeout(120 + SERVER_START_TIMEOUT_S)
def test_durable_queues_hold_few_descriptors_and_past_the_limit_a_declare_says_so(tmp_path: Path) -> None:
    limit = 1024
    with (
        _server_with_fd_limit(tmp_path / "data", limit, tmp_path / "server.log") as (proc, address),
        QueueClient(address, timeout=60) as c,
    ):
        names = []
        with pytest.raises(RequestError) as e:
            for i in range(limit):
                c.declare(f"q{i}", kind="durable")
                names.append(f"q{i}")
        assert e.value.kind == ERR_STORE and "as many as its descriptor limit allows" in str(e.value), e.value
        assert 400 < len(names) < limit and _fds(proc.pid) < limit
        rng = random.Random(5)
        for name in rng.sample(names, len(names)):  # every queue in turn: most have let go of their files
            (i,) = c.put(name, [Message(payload=name.encode())])
            assert [m.payload for m in c.get(name, 10)] == [name.encode()]
            assert c.ack(name, [i], [b"done"]) == [True] and c.result(name, [i]) == [b"done"]
        assert _fds(proc.pid) < limit
        assert [c.status(n, [1]) for n in names[:3]] == [[Status.ACKED]] * 3
    with (
        _server_with_fd_limit(tmp_path / "data", limit, tmp_path / "server2.log") as (proc, address),
        QueueClient(address, timeout=60) as c,
    ):
        assert len(c.queues()) == len(names)  # reopened, within the limit
        assert c.result(names[-1], [1]) == [b"done"] and _fds(proc.pid) < limit


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ten_thousand_durable_queues_work_with_the_limit_the_server_raises(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    with thread_server(data_dir=tmp_path / "data") as s, QueueClient(s.address, timeout=60) as c:
        n = 10_000
        if hard != resource.RLIM_INFINITY and hard < 16_000:  # the OS allows too few: a clear error instead
            with pytest.raises(RequestError, match="as many as its descriptor limit allows"):
                for i in range(n):
                    c.declare(f"q{i}", kind="durable")
            return
        for i in range(n):
            c.declare(f"q{i}", kind="durable")
        for i in range(0, n, 7):
            c.put(f"q{i}", [Message(payload=b"%d" % i)])
        for i in range(0, n, 7):
            assert [m.payload for m in c.get(f"q{i}", 1)] == [b"%d" % i]
        assert len(c.queues()) == n


def test_os_errors_say_what_ran_out() -> None:
    full = store_error(OSError(errno.ENOSPC, "No space left on device"), "q: put")
    assert isinstance(full, DiskFullError) and "the disk is full" in str(full)
    fds = store_error(OSError(errno.EMFILE, "Too many open files"), "q: open")
    assert type(fds) is StoreError and "too many open files" in str(fds) and "ulimit -n" in str(fds)
