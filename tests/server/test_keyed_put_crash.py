"""A keyed put cut short by a SIGKILL of its server, then retried: stored exactly once, with its own ids.

A keyed put writes its keys (with the ids it is about to use) before its messages. Each round kills
the server at a random moment while a large keyed put is under way, restarts it, lets another
client put plain messages (which take the next free ids), then retries the keyed put. Whatever the
moment: every confirmed put's ids hold its own payloads, no id is confirmed for two payloads, and
every key's message is stored once.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from conveyor.client.queue_client import QueueClient
from conveyor.constants import H_IDEMPOTENCY_KEY
from conveyor.errors import ConnectionLostError
from conveyor.message import Message
from conveyor.server.processes import spawn_server, stop_server

from ..support.servers import Confirmed

ROUNDS = 12  # x 3 fsync policies: 36 kills at random moments (about 25 s a policy)
N = 10_000  # messages per put: big enough that a kill often lands between the keys and the messages
KILL_WITHIN_S = 0.4  # the kill comes at a random moment this long after the put is sent


def _put(address: str, messages: list[Message], out: dict[str, list[int]]) -> None:
    try:
        with QueueClient(address, timeout=30, connect_timeout=5) as c:
            out["ids"] = c.put("q", messages)
    except (ConnectionLostError, TimeoutError):
        pass  # cut short by the kill: may or may not be stored


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("fsync", ["batch", "interval", "never"])
def test_a_keyed_put_retried_after_a_crash_is_stored_once_with_its_own_ids(tmp_path: Path, fsync: str) -> None:
    data = tmp_path / "data"
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115
    args = ["--fsync", fsync]
    proc, address = spawn_server(data, args=args, stderr=log)
    port = int(address.rsplit(":", 1)[1])
    rng = random.Random(hash(fsync) & 0xFFFF)
    confirmed = Confirmed()
    keyed_ids: dict[str, int] = {}  # key -> the id its message was confirmed under
    try:
        for rnd in range(ROUNDS):
            keyed = [Message(payload=b"k%d-%d" % (rnd, j), headers={H_IDEMPOTENCY_KEY: f"r{rnd}-{j}"}) for j in range(N)]
            first: dict[str, list[int]] = {}
            t = threading.Thread(target=_put, args=(address, keyed, first), daemon=True)
            t.start()
            time.sleep(rng.uniform(0.0, KILL_WITHIN_S))  # the kill point, not synchronisation
            os.kill(proc.pid, signal.SIGKILL)
            stop_server(proc)
            t.join(60)
            assert not t.is_alive()
            proc, _ = spawn_server(data, port, args=args, stderr=log)
            with QueueClient(address, timeout=30) as c:
                plain = [Message(payload=b"o%d-%d" % (rnd, j)) for j in range(N)]
                confirmed.add(c.put("q", plain), plain)  # takes the ids after what the store holds
                ids = c.put("q", keyed)  # the retry
            confirmed.add(ids, keyed)
            if "ids" in first:  # the first try was answered before the kill: the retry names the same messages
                assert ids == first["ids"], f"round {rnd}: the retry was answered with other ids than the first try"
            for m, i in zip(keyed, ids, strict=True):
                keyed_ids[m.headers[H_IDEMPOTENCY_KEY]] = i
        with QueueClient(address, timeout=60) as c:
            stored: dict[int, bytes] = {}
            while got := c.get("q", 50_000, lease_s=3600):
                stored.update((m.id, m.payload) for m in got)
    finally:
        stop_server(proc)
        log.close()
    for i, p in confirmed.payload.items():
        assert stored.get(i) == p, f"confirmed id {i} ({p!r}) holds {stored.get(i)!r}"
    keyed_payloads = [p for p in stored.values() if p.startswith(b"k")]
    assert len(keyed_payloads) == len(set(keyed_payloads)), "a keyed message was stored twice"
    assert len(keyed_ids) == ROUNDS * N and len(set(keyed_ids.values())) == ROUNDS * N
