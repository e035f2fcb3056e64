"""A durable server SIGKILLed while clients put and consume, restarted on the same data dir.

Clients record what the server answered. After every restart, and at the end: every answered put
is still there unless acked, no answered ack is undone (the message is never served again), and
every answered ack's result is stored.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

from conveyor.client.queue_client import QueueClient
from conveyor.errors import ConnectionLostError
from conveyor.message import Message
from conveyor.server.processes import spawn_server, stop_server

from ..support.servers import wait_for

ROUNDS = 5
LEASE_S = 1.0


class Ledger:
    """What the server answered, as seen by the clients."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.put: dict[int, bytes] = {}  # id -> payload, for answered puts
        self.acked: dict[int, bytes | None] = {}  # id -> result, for answered acks that took effect
        self.maybe_acked: set[int] = set()  # acks whose connection broke before the reply


def producer(address: str, ledger: Ledger, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    with QueueClient(address, timeout=10, connect_timeout=30) as c:
        k = 0
        while not stop.is_set():
            batch = [Message(payload=b"p%d-%d" % (seed, k + j)) for j in range(rng.randrange(1, 50))]
            k += len(batch)
            try:
                ids = c.put("jobs", batch)
            except (ConnectionLostError, TimeoutError):
                continue  # unanswered: may or may not be stored
            with ledger.lock:
                ledger.put.update(zip(ids, (m.payload for m in batch), strict=True))


def consumer(address: str, ledger: Ledger, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    with QueueClient(address, timeout=10, connect_timeout=30) as c:
        while not stop.is_set():
            try:
                got = c.get("jobs", rng.randrange(1, 40), lease_s=LEASE_S)
            except (ConnectionLostError, TimeoutError):
                continue
            take = [m for m in got if rng.random() < 0.8]  # the rest: abandoned, back after the lease
            if not take:
                continue
            results = [b"r:" + m.payload if rng.random() < 0.7 else None for m in take]
            ids = [m.id for m in take]
            try:
                ok = c.ack("jobs", ids, results)
            except (ConnectionLostError, TimeoutError):
                with ledger.lock:
                    ledger.maybe_acked.update(ids)
                continue
            with ledger.lock:
                for i, r, o in zip(ids, results, ok, strict=True):
                    if o:
                        ledger.acked[i] = r


def check(address: str, ledger: Ledger, drain: bool) -> None:
    """The server's state against the ledger; with `drain`, consume everything left first."""
    with QueueClient(address, timeout=30) as c:
        # the ledger first: clients go on acking meanwhile, and only acks answered before the
        # results are read must be among them
        with ledger.lock:
            acked = dict(ledger.acked)
            put = dict(ledger.put)
            maybe = set(ledger.maybe_acked)
        results = dict(c.iter_results("jobs"))
        for i, r in acked.items():
            if r is not None:
                assert results.get(i) == r, f"the result of acked message {i} was lost"
        if not drain:
            return
        served: dict[int, bytes] = {}

        def pull() -> bool:
            for m in c.get("jobs", 1000, lease_s=60, wait_s=0.2):
                assert m.id not in acked, f"message {m.id} was served again after an answered ack"
                served[m.id] = m.payload
                c.ack("jobs", [m.id])
            return c.stats("jobs")["jobs"].pending == 0

        wait_for(pull, timeout=60, what="queue drained")
        # a message abandoned on every attempt (its lease ran out each time: a lease that ran out
        # goes ahead of the waiting work, so it is soon served again) ends in the dead letters,
        # payload and all: kept, not lost
        dead: dict[int, bytes] = {}
        while page := c.dead_letters("jobs", max(dead, default=0)):
            dead.update((d.message.id, d.message.payload) for d in page)
        for i, payload in put.items():
            if i in acked or i in maybe or i in results:
                continue
            assert served.get(i, dead.get(i)) == payload, f"answered put {i} ({payload!r}) was lost"


def test_sigkilled_server_loses_nothing_answered(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115
    proc, address = spawn_server(data, args=["--fsync", "batch"], stderr=log)
    port = int(address.rsplit(":", 1)[1])
    ledger = Ledger()
    stop = threading.Event()
    threads = [threading.Thread(target=producer, args=(address, ledger, stop, s), daemon=True) for s in (1, 2)]
    threads += [threading.Thread(target=consumer, args=(address, ledger, stop, s), daemon=True) for s in (3, 4)]
    rng = random.Random(7)
    try:
        for t in threads:
            t.start()
        for _ in range(ROUNDS):
            before = len(ledger.put)
            wait_for(lambda b=before: len(ledger.put) > b + 200, timeout=60, what="progress before the kill")
            time.sleep(rng.uniform(0.05, 0.4))  # a random moment of a busy run: the kill point, not synchronisation
            os.kill(proc.pid, signal.SIGKILL)
            stop_server(proc)  # reaps it, and closes the pipe to its stdin
            proc, _ = spawn_server(data, port, args=["--fsync", "batch"], stderr=log)
            check(address, ledger, drain=False)
        stop.set()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        check(address, ledger, drain=True)
        assert len(ledger.put) > 1000 and len(ledger.acked) > 200
    finally:
        stop.set()
        stop_server(proc)
        log.close()
    assert proc.returncode == 0
