"""A damaged `ids.reserved` never makes a store give an id twice.

The server test kills a real server (SIGKILL) after confirmed plain and keyed puts, then zeroes,
truncates or garbles both slots of the queue's `ids.reserved`, in half of the trials also tearing
the newest segment's last record in half (as a crash mid-write leaves it). After each restart an
unrelated put takes the next free ids and every keyed put is retried. Over all trials: no id is
confirmed for two payloads, every confirmed id holds its payload (but for the records the test cut
off), and every keyed message is stored exactly once. The store tests cover the other ways the file
can be unreadable, one bad slot (a torn raise: the other slot's reservation stands, no skip), and a
fresh store, which must not warn.

The reservation is `conveyor.storage.reservation`.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from pathlib import Path

import pytest

from conveyor.client.queue_client import QueueClient
from conveyor.constants import (
    BODY_PREFIX,
    H_IDEMPOTENCY_KEY,
    ID_RESERVE_MOST,
    KEYS_LOG_NAME,
    QUEUES_DIR,
    RECORD_HEAD,
    RECORD_OVERHEAD,
    RESERVED_NAME,
    RESERVED_SLOT,
    RESERVED_SLOT_BYTES,
    SEGMENT_GLOB,
    SEGMENT_HEADER,
)
from conveyor.message import Message
from conveyor.server.processes import spawn_server, stop_server
from conveyor.storage import DurableStore

from ..support.servers import Confirmed

TRIALS = 20
DAMAGES = ("zero", "truncate", "garble")
WARNING = "ids.reserved cannot be read"  # the named warning a store logs for a reservation it cannot read
LONG = 3600.0


def damage_reservation(f: Path, how: str, rng: random.Random) -> None:
    """Zero, truncate (shorter than one slot) or garble `f`, so that no slot checks out."""
    size = f.stat().st_size
    assert size in (RESERVED_SLOT.size, RESERVED_SLOT_BYTES + RESERVED_SLOT.size)  # one slot written, or both
    if how == "zero":
        f.write_bytes(bytes(size))
    elif how == "truncate":
        os.truncate(f, rng.randrange(RESERVED_SLOT.size))
    else:
        f.write_bytes(rng.randbytes(size))


def tear_last_record(q: Path) -> int:
    """Cut the newest segment's last record in half; returns its message id."""
    f = sorted(q.glob(SEGMENT_GLOB))[-1]
    data = f.read_bytes()
    pos, last = SEGMENT_HEADER.size, SEGMENT_HEADER.size
    while pos < len(data):
        last = pos
        pos += RECORD_HEAD.unpack_from(data, pos)[1] + RECORD_OVERHEAD
    assert pos == len(data) and last > SEGMENT_HEADER.size
    _, msg_id = BODY_PREFIX.unpack_from(data, last + RECORD_HEAD.size)
    os.truncate(f, last + (len(data) - last) // 2)
    return int(msg_id)


def drain(c: QueueClient, stored: dict[int, bytes]) -> None:
    """Take every message in the queue into `stored` and ack it (the store's window then moves on)."""
    while got := c.get("q", 10_000, lease_s=LONG):
        for m in got:
            assert m.id not in stored, f"message {m.id} delivered twice"
            stored[m.id] = m.payload
        assert all(c.ack("q", [m.id for m in got]))


@pytest.mark.timeout(180)
def test_a_damaged_reservation_never_gives_an_id_twice(tmp_path: Path) -> None:
    rng = random.Random(38)
    data = tmp_path / "data"
    q = data / QUEUES_DIR / "q"
    log_path = tmp_path / "server.log"
    log = open(log_path, "wb")  # noqa: SIM115
    proc, address = spawn_server(data, stderr=log)
    port = int(address.rsplit(":", 1)[1])
    confirmed = Confirmed()
    stored: dict[int, bytes] = {}
    cut: set[int] = set()  # ids whose records the test tore off
    keyed_payloads: set[bytes] = set()
    try:
        for t in range(TRIALS):
            how, torn = DAMAGES[t % 3], (t // 3) % 2 == 1  # every damage with and without a torn tail
            plain = [Message(payload=b"p%d-%d" % (t, j)) for j in range(rng.randint(1, 200))]
            keyed = [
                Message(payload=b"k%d-%d" % (t, j), headers={H_IDEMPOTENCY_KEY: f"k{t}-{j}"}) for j in range(rng.randint(1, 200))
            ]
            keyed_payloads.update(m.payload for m in keyed)
            with QueueClient(address, timeout=30) as c:
                batches = [plain, keyed] if rng.random() < 0.5 else [keyed, plain]  # either may be torn
                for batch in batches:
                    confirmed.add(c.put("q", batch), batch)
            os.kill(proc.pid, signal.SIGKILL)
            stop_server(proc)
            damage_reservation(q / RESERVED_NAME, how, rng)
            if torn:
                cut.add(tear_last_record(q))
            proc, _ = spawn_server(data, port, stderr=log)
            with QueueClient(address, timeout=30) as c:
                other = [Message(payload=b"o%d-%d" % (t, j)) for j in range(rng.randint(1, 200))]
                confirmed.add(c.put("q", other), other)  # takes the next free ids
                retried = c.put("q", keyed)
                confirmed.add(retried, keyed)
                drain(c, stored)
    finally:
        stop_server(proc)
        log.close()
    text = log_path.read_text()
    assert text.count(WARNING) == TRIALS, f"{text.count(WARNING)} warnings about {RESERVED_NAME} in {TRIALS} trials"
    for i, p in confirmed.payload.items():
        if i not in cut:
            assert stored.get(i) == p, f"confirmed id {i} ({p!r}) holds {stored.get(i)!r}"
    assert not cut & set(stored), "an id whose record was torn off was given to another message"
    kept = [p for p in stored.values() if p.startswith(b"k")]
    assert sorted(kept) == sorted(keyed_payloads), "a keyed message was lost or stored twice"


# --- the store on its own ---------------------------------------------------------------------------
def put_some(path: Path, n: int = 10) -> list[int]:
    with DurableStore(path, fsync="never") as s:
        return s.put([Message(payload=b"m%d" % i) for i in range(n)])


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and RESERVED_NAME in r.getMessage()]


@pytest.mark.parametrize("how", ["missing", "empty", "short", "both-slots-bad"])
def test_an_unreadable_reservation_is_a_named_warning_and_a_skip_past_any_chunk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """An unreadable reservation: reopening warns and starts past any chunk that can have been reserved.

    However the file is unreadable, reopening warns and starts past the highest id shown plus the
    largest chunk that can have been reserved, and the file is whole again (the next open is quiet).
    """
    path = tmp_path / "q"
    ids = put_some(path)
    f = path / RESERVED_NAME
    with DurableStore(path, fsync="never") as s:  # a second raise: both slots written
        ids += s.put([Message(payload=b"more")])
    data = f.read_bytes()
    assert len(data) == RESERVED_SLOT_BYTES + RESERVED_SLOT.size
    if how == "missing":
        f.unlink()
    elif how == "empty":
        f.write_bytes(b"")
    elif how == "short":
        f.write_bytes(data[:5])
    else:
        f.write_bytes(
            bytes([data[0] ^ 1])
            + data[1 : RESERVED_SLOT_BYTES + 3]
            + bytes([data[RESERVED_SLOT_BYTES + 3] ^ 1])
            + data[RESERVED_SLOT_BYTES + 4 :]
        )
    with caplog.at_level(logging.WARNING), DurableStore(path, fsync="never") as s:
        [w] = warnings(caplog)
        assert str(f) in w
        assert s.next_id >= max(ids) + 1 + 2 * ID_RESERVE_MOST
        assert [s.status(i) is not None for i in ids] == [True] * len(ids)
    caplog.clear()
    with caplog.at_level(logging.WARNING), DurableStore(path, fsync="never") as s:
        assert warnings(caplog) == []


@pytest.mark.parametrize("slot", [0, 1], ids=["older-torn", "newer-damaged"])
def test_one_bad_slot_keeps_the_other_reservation_without_a_skip(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, slot: int
) -> None:
    """One bad slot (as a raise torn by a crash leaves) keeps the other slot's reservation, without a skip.

    One slot failing its checksum is what a raise torn by a crash leaves (it writes the older slot):
    the other slot's reservation stands, with a warning naming the slot and no skip; the file is
    whole again. Damage to the newer slot alone looks the same: ids still start past every id the
    files show.
    """
    path = tmp_path / "q"
    ids = put_some(path)
    f = path / RESERVED_NAME
    with DurableStore(path, fsync="never") as s:  # a second raise: both slots written, slot 1 the newer
        ids += s.put([Message(payload=b"more")])
    data = bytearray(f.read_bytes())
    assert len(data) == RESERVED_SLOT_BYTES + RESERVED_SLOT.size
    other = RESERVED_SLOT.unpack_from(data, (1 - slot) * RESERVED_SLOT_BYTES)[0]
    data[slot * RESERVED_SLOT_BYTES] ^= 1
    f.write_bytes(data)
    with caplog.at_level(logging.WARNING), DurableStore(path, fsync="never") as s:
        [w] = warnings(caplog)
        assert str(f) in w and f"slot {slot} fails its checksum" in w and WARNING not in w
        assert s.next_id == max(other, max(ids) + 1)  # no skip
        assert [s.status(i) is not None for i in ids] == [True] * len(ids)
        assert s.put([Message(payload=b"after")])[0] > max(ids)
    caplog.clear()
    with caplog.at_level(logging.WARNING), DurableStore(path, fsync="never") as s:
        assert warnings(caplog) == []


def test_a_fresh_or_unused_store_has_no_reservation_to_miss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A store that never handed out an id opens quietly, however often, and starts at id 1.

    So does one whose first raise a crash cut short before its bytes reached the disk (an empty
    file).
    """
    path = tmp_path / "q"
    for k in range(3):
        if k == 2:
            (path / RESERVED_NAME).write_bytes(b"")
        with caplog.at_level(logging.WARNING), DurableStore(path, fsync="never") as s:
            assert s.next_id == 1
    assert warnings(caplog) == []


def test_keys_past_the_store_ids_are_never_given_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Ids a server's keys log names beyond what the store's files show are never given again.

    Ids a server's keys log names beyond what the store's files show are skipped, and past them the
    margin when the reservation is lost: a retried keyed put whose message never reached the
    segments gets new ids.
    """
    from conveyor.server.idempotency import Dedupe

    path = tmp_path / "q"
    ids = put_some(path)
    keys = Dedupe(path)
    keys.add([("lost", max(ids) + 5)])  # written before a put whose messages a crash then lost
    keys.close()
    assert (path / KEYS_LOG_NAME).exists()
    (path / RESERVED_NAME).write_bytes(bytes(RESERVED_SLOT.size))
    with caplog.at_level(logging.WARNING), DurableStore(path, fsync="never") as s:
        keys = Dedupe(path)
        s.keep_ids_past(keys.highest)
        assert keys.highest == max(ids) + 5
        assert s.next_id >= max(ids) + 6 + 2 * ID_RESERVE_MOST
        keys.close()
