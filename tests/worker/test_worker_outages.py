"""A worker and servers out of reach: it serves those that answer and retries the others.

It keeps serving the servers that answer, retries the others and says so (when it notices, then once
a minute), serves them again once they are back, gives up on them only when told to
(`--unreachable-s`), and its counts survive consumer processes that die.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool
from conveyor.constants import DEFAULT_UNREACHABLE_S
from conveyor.errors import ConnectionLostError
from conveyor.server.processes import spawn_server, stop_server
from conveyor.worker import ConsumerPool
from conveyor.worker.outages import Outages

from ..support import worker_tasks as wt
from ..support.procs import free_port, kill_tree
from ..support.servers import ThreadServer, thread_server, wait_for
from ..support.worker_command import start_worker

MODULES = ["tests.support.worker_tasks"]


def test_a_consumer_says_which_server_is_out_of_reach_now_and_then_and_when_it_is_back(caplog: pytest.LogCaptureFixture) -> None:
    with thread_server() as live:
        down = ThreadServer()
        port = down.server.port
        with QueuePool.connect([live.address, down.address], connect_timeout=0) as pool:
            outages = Outages(pool.queues, "consumer c", None, every_s=0.5)
            pool.queues.clients[1].ping()
            down.stop()
            with pytest.raises(ConnectionLostError):
                pool.queues.clients[1].ping()
            outages.say()
            outages.say()  # said just now: not again yet
            said = said_by_c(caplog)
            meanwhile = "retrying it for as long as it takes (serving the 1 that answer meanwhile)"
            assert said == [f"consumer c: queue server {down.address} out of reach for 0 s: {meanwhile}"]
            t0 = time.monotonic()
            wait_for(lambda: outages.say() or len(said_by_c(caplog)) == 2, timeout=10, what="the outage said again")
            assert time.monotonic() - t0 >= 0.4  # not before its time
            back = ThreadServer(port=port)
            try:
                pool.queues.clients[1].ping()
                outages.say()
            finally:
                back.stop()
    assert said_by_c(caplog)[-1] == f"consumer c: queue server {down.address} answers again"


def said_by_c(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What consumer c said: other tests' consumers, still stopping in this process, may log meanwhile."""
    return [m for m in (r.getMessage() for r in caplog.records) if m.startswith("consumer c: ")]


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    servers = [spawn_server(tmp_path / name) for name in ("a", "b")]
    try:
        yield servers
    finally:
        for proc, _ in servers:
            stop_server(proc)


# one worker of each kind through the same outage, each on a queue of its own: one consumer in the
# worker's process, and two consumer processes (a ConsumerPool)
KINDS = {"1": ("jobs", wt.add), "2": ("jobs2", wt.add_too)}


def test_a_worker_rides_out_a_server_outage(two_servers: list[tuple[subprocess.Popen[bytes], str]], tmp_path: Path) -> None:
    """A worker rides out one of two servers down: it serves the other, then the first again once back.

    One of two servers down for longer than a consumer used to wait for it (30 s): the worker keeps
    serving the other, says which server is out of reach, serves it again once it is back (restarted
    on its data) and says so, and its summary counts every task.
    """
    (_, a), (b_proc, b) = two_servers
    logs = {kind: tmp_path / f"worker-{kind}.err" for kind in KINDS}
    done = dict.fromkeys(KINDS, 0)

    def serve(pool: QueuePool, tag: int, n: int) -> None:
        """Publish n tasks of each worker's and wait for them all (the servers answering are served)."""
        handles = {kind: task.publish_many([(i, tag) for i in range(n)], _pool=pool) for kind, (_, task) in KINDS.items()}
        for kind, hs in handles.items():
            assert pool.gather(hs, timeout=60) == [i + tag for i in range(n)]
            done[kind] += n

    workers: dict[str, subprocess.Popen[str]] = {}
    try:
        for kind, (queue, _) in KINDS.items():
            with logs[kind].open("w") as err:
                workers[kind] = start_worker([a, b], "--processes", kind, queue=queue, stderr=err)
        with QueuePool.connect([a, b]) as both, QueuePool.connect([a]) as only_a:
            serve(both, 1, 40)  # on both servers
            b_proc.kill()  # down, as a machine that is lost
            stop_server(b_proc)
            out_since = time.monotonic()
            while time.monotonic() - out_since < DEFAULT_UNREACHABLE_S + 5:  # past what it used to wait
                assert all(w.poll() is None for w in workers.values()), "a worker gave up"
                serve(only_a, 2, 10)  # the live server is served
        b_proc, _ = spawn_server(tmp_path / "b", port=int(b.rsplit(":", 1)[1]))  # back, on its data
        two_servers[1] = (b_proc, b)
        with QueuePool.connect([b]) as only_b:
            serve(only_b, 3, 10)
        back = f"queue server {b} answers again"
        for log in logs.values():  # each consumer says so at its next look, once it has tried the server again
            wait_for(lambda log=log: back in log.read_text(), timeout=30, what=f"{log.name} saying {b} is back")
        for w in workers.values():
            os.killpg(w.pid, signal.SIGTERM)
        for w in workers.values():
            w.wait(timeout=60)
    finally:
        for w in workers.values():
            if w.poll() is None:
                kill_tree(w)
    for kind, w in workers.items():
        stderr = logs[kind].read_text()
        assert w.returncode == 0, stderr
        assert f"queue server {b} out of reach for 0 s: retrying it for as long as it takes" in stderr
        assert "Traceback" not in stderr and "exited with code" not in stderr, stderr
        summary = stderr.strip().splitlines()[-1]
        assert summary.startswith(f"processed {done[kind]:,}, failed 0"), stderr


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_worker_gives_up_on_a_server_out_of_reach_when_told_to(processes: str) -> None:
    with thread_server() as live:
        dead = f"tcp://127.0.0.1:{free_port()}"
        w = start_worker([live.address, dead], "--processes", processes, "--unreachable-s", "2")
        try:
            _, stderr = w.communicate(timeout=60)
        finally:
            if w.poll() is None:
                kill_tree(w)
    assert w.returncode == 1, stderr
    assert re.search(rf"queue server {dead} unreachable for \d+ s", stderr), stderr


def test_the_counts_of_a_consumer_process_that_dies_are_not_lost(tmp_path: Path) -> None:
    """A consumer process killed (here by SIGKILL) is restarted, and what it did still counts.

    What it did still counts in the pool's stats (as `conveyor worker --processes N` prints them),
    from the tally it kept as it went.
    """
    with QueuePool.local(n_servers=2, data_dir=tmp_path) as pool:
        handles = wt.add.publish_many([(i, 1) for i in range(20)], _pool=pool)
        cp = ConsumerPool(pool, 2, queues=["jobs"], concurrency=2, task_modules=MODULES).start()
        try:
            assert len(pool.gather(handles, timeout=60)) == 20
            steady = SteadyReports(pool)
            victim = wait_for(steady.consumer, timeout=30, what="two reports alike of a consumer that ran tasks")
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: cp.check() or cp.restarts == 1, timeout=30, what="the killed consumer restarted")
            more = wt.add.publish_many([(i, 2) for i in range(10)], _pool=pool)
            assert len(pool.gather(more, timeout=60)) == 10
        finally:
            cp.cancel()
    assert cp.stats.processed == 30


class SteadyReports:
    """Finds a consumer that ran tasks and whose last two reports (2 s apart) give the same count.

    Idle since, its tally (copied every 0.5 s) holds that count.
    """

    def __init__(self, pool: QueuePool) -> None:
        self.pool = pool
        self.last: dict[str, tuple[float, float]] = {}  # consumer -> (processed, seconds since its report) as last read

    def consumer(self) -> int | None:
        """Its pid, once there is one."""
        for name, counts in self.pool.queues.workers().items():
            processed, seen = float(counts["processed"]), float(counts["seen"])
            before, self.last[name] = self.last.get(name), (processed, seen)
            if processed and before is not None and seen < before[1] and processed == before[0]:  # a new report, alike
                return int(counts["pid"])
        return None
