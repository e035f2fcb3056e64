"""A full disk is an error, never damage: a durable server on a small real file system (tmpfs, ext4).

Puts fill the disk until the server refuses them; a filler file takes the last bytes. While the disk
is full: puts, keyed puts and acks with results get a `store` error that says the disk is full and
change nothing; deliveries, acks without results, lease extensions and nacks keep working. Once the
filler is removed, everything works again with no restart; the refused acks go through when retried.
Then every confirmed operation is reconciled, before and after a restart.

The space held back for this is `conveyor.storage.space`.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from conveyor.client.queue_client import QueueClient
from conveyor.constants import ERR_STORE, H_IDEMPOTENCY_KEY
from conveyor.errors import CorruptStoreError, DiskFullError, RequestError
from conveyor.message import Message, Status
from conveyor.server.processes import spawn_server, stop_server
from conveyor.storage import DurableStore

from ..support.disks import KINDS, fill, small_disk
from ..support.servers import wait_for

MIB = 24
PAYLOAD = 48 * 1024


def _payload(k: int) -> bytes:
    return random.Random(k).randbytes(PAYLOAD)  # incompressible, and each its own


def _refused(call: object) -> RequestError:
    with pytest.raises(RequestError) as e:
        call()  # type: ignore[operator]
    assert e.value.kind == ERR_STORE and "disk is full" in str(e.value), e.value
    return e.value


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_a_full_disk_refuses_whole_operations_and_loses_nothing(tmp_path: Path, kind: str) -> None:
    with small_disk(kind, tmp_path / "disk", MIB) as disk:
        log = open(tmp_path / "server.log", "wb")  # noqa: SIM115
        proc, address = spawn_server(disk / "data", args=["--fsync", "batch"], stderr=log)
        port = int(address.rsplit(":", 1)[1])
        try:
            with QueueClient(address, timeout=30) as c:
                c.declare("q", kind="durable", lease_s=600)
                (disk / "spare").write_bytes(bytes(4 * 1024 * 1024))  # someone else's files, removed later
                put: dict[int, bytes] = {}  # confirmed puts
                k = 0
                while True:  # fill the disk with puts until the server says it is full
                    batch = [Message(payload=_payload(k + j)) for j in range(3)]
                    try:
                        ids = c.put("q", batch)
                    except RequestError as e:
                        assert e.kind == ERR_STORE and "disk is full" in str(e), e
                        break
                    put.update(zip(ids, (m.payload for m in batch), strict=True))
                    k += 3
                assert len(put) > 100
                fill(disk / "filler")  # the last bytes, by someone else

                before = c.stats("q")["q"]
                _refused(lambda: c.put("q", [Message(payload=b"small")]))
                keyed = [Message(payload=b"keyed-%d" % j, headers={H_IDEMPOTENCY_KEY: f"key-{j}"}) for j in range(20)]
                _refused(lambda: c.put("q", keyed))
                # deliveries, acks without results, lease extensions and nacks keep working
                got = c.get("q", 40)
                assert len(got) == 40 and all(m.payload == put[m.id] for m in got)
                plain, with_results, nacked = got[:10], got[10:30], got[30:]
                assert c.ack("q", [m.id for m in plain]) == [True] * 10
                assert c.extend_lease("q", [m.id for m in with_results], 900) == [True] * 20
                assert c.nack("q", [m.id for m in nacked], ["retry"] * 10) == [True] * 10
                results = [b"result-%d" % m.id for m in with_results]
                _refused(lambda: c.ack("q", [m.id for m in with_results], results))
                assert c.status("q", [m.id for m in with_results]) == [Status.DELIVERED] * 20  # not acked
                after = c.stats("q")["q"]
                assert (after.ready + after.delivered + after.acked) == (before.ready + before.delivered + before.acked)
                assert after.acked == before.acked + 10

                (disk / "filler").unlink()  # space again: everything works, with no restart
                (disk / "spare").unlink()
                ids = wait_for(lambda: _try_put(c, [Message(payload=b"after")]), timeout=30, what="a put after freeing")
                put[ids[0]] = b"after"
                assert c.ack("q", [m.id for m in with_results], results) == [True] * 20
                assert c.result("q", [m.id for m in with_results]) == results
                kids = c.put("q", keyed)
                assert c.put("q", keyed) == kids  # the keys were not taken by the refused try
                put.update(zip(kids, (m.payload for m in keyed), strict=True))
                acked = {m.id for m in plain} | {m.id for m in with_results}
                _reconcile(c, put, acked, {m.id: r for m, r in zip(with_results, results, strict=True)})
            stop_server(proc)  # and once more after a restart, from the files alone
            proc, _ = spawn_server(disk / "data", port, args=["--fsync", "batch"], stderr=log)
            with QueueClient(address, timeout=30) as c:
                assert c.queues() and c.ping()
                served = _drain(c)
                for i, p in put.items():
                    assert i in acked or served.get(i) == p, f"confirmed put {i} lost or changed after the restart"
                assert not (set(served) & acked), "an acked message was served again"
        finally:
            stop_server(proc)
            log.close()


def _try_put(c: QueueClient, batch: list[Message]) -> list[int] | None:
    try:
        return c.put("q", batch)
    except RequestError as e:
        assert e.kind == ERR_STORE and "disk is full" in str(e), e
        return None


def _drain(c: QueueClient) -> dict[int, bytes]:
    served: dict[int, bytes] = {}
    while got := c.get("q", 100, lease_s=600):
        served.update((m.id, m.payload) for m in got)
    return served


def _reconcile(c: QueueClient, put: dict[int, bytes], acked: set[int], results: dict[int, bytes]) -> None:
    """Every confirmed put is acked or served with its own bytes; every confirmed result is stored."""
    assert dict(c.iter_results("q")) == results
    # what the test holds delivered comes back after its lease: serve the rest now
    served = _drain(c)
    for i, p in put.items():
        if i not in acked and i not in served:
            assert c.status("q", [i]) == [Status.DELIVERED], f"confirmed put {i} is gone"
        elif i in served:
            assert served[i] == p, f"message {i} was served with other bytes"
    c.release("q", list(served))  # back for the check after the restart


def _files(path: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(path.iterdir()) if f.name != "LOCK"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_a_store_on_a_full_disk_leaves_its_files_as_they_were(tmp_path: Path, kind: str) -> None:
    """With no reserve at all (a store used alone): each refused operation leaves every file byte for byte."""
    with small_disk(kind, tmp_path / "disk", 16) as disk:
        (disk / "spare").write_bytes(bytes(2 * 1024 * 1024))
        path = disk / "q"
        put: dict[int, bytes] = {}
        with DurableStore(path, segment_bytes=1024 * 1024, max_attempts=1) as s:
            k = 0
            with pytest.raises(DiskFullError):
                while True:
                    batch = [Message(payload=_payload(k + j)) for j in range(5)]
                    put.update(zip(s.put(batch), (m.payload for m in batch), strict=True))
                    k += 5
            got = s.get(20, lease_s=600)
            fill(disk / "filler")
            files, stats = _files(path), s.stats()
            refused = [
                lambda: s.put([Message(payload=b"x" * PAYLOAD)]),
                lambda: s.ack_many([m.id for m in got], [b"r" * PAYLOAD] * len(got)),
                lambda: s.nack_many([m.id for m in got], ["failed for good"] * len(got)),  # dead letters
            ]
            for op in refused:
                with pytest.raises(DiskFullError, match="disk is full"):
                    op()
                assert _files(path) == files and s.stats() == stats
                assert [s.status(m.id) for m in got] == [Status.DELIVERED] * len(got)
            (disk / "filler").unlink()
            (disk / "spare").unlink()
            assert s.ack_many([m.id for m in got], [b"r%d" % m.id for m in got]) == [True] * len(got)
            put[s.put([Message(payload=b"after")])[0]] = b"after"
        with DurableStore(path, segment_bytes=1024 * 1024) as s:  # the files alone say the same
            assert dict(s.results()) == {m.id: b"r%d" % m.id for m in got}
            served = {m.id: m.payload for m in s.get(len(put), lease_s=600)}
            assert served == {i: p for i, p in put.items() if i not in {m.id for m in got}}


@pytest.mark.timeout(120)
def test_repair_needs_no_room_for_a_copy(tmp_path: Path) -> None:
    """A damaged 4 MiB segment is repaired in place on a disk with far less than that free."""
    with small_disk("tmpfs", tmp_path / "disk", 16) as disk:
        path = disk / "q"
        with DurableStore(path, segment_bytes=4 * 1024 * 1024, fsync="never") as s:
            put = dict(zip(s.put([Message(payload=_payload(k)) for k in range(80)]), map(_payload, range(80)), strict=True))
        seg = sorted(path.glob("seg-*.log"))[0]
        assert seg.stat().st_size > 3 * 1024 * 1024
        data = bytearray(seg.read_bytes())
        hit = len(data) // 2
        data[hit] ^= 0xFF  # one flipped byte in a message in the middle
        seg.write_bytes(bytes(data))
        with pytest.raises(CorruptStoreError):
            DurableStore(path)
        size = fill(disk / "filler")
        os.truncate(disk / "filler", size - 1024 * 1024)  # a MiB free: room for the damaged bytes, not for a copy
        assert shutil.disk_usage(disk).free < seg.stat().st_size / 2
        with DurableStore(path, repair=True) as s:
            served = {m.id: m.payload for m in s.get(100, lease_s=600)}
        lost = set(put) - set(served)
        assert len(lost) == 1 and all(served[i] == put[i] for i in served)
        [aside] = path.glob(f"{seg.name}.damaged-*")
        assert aside.read_bytes()[hit] == data[hit]
