"""A segment shorter than what the index confirms is named, not hidden as a torn tail.

A segment cut short (a sealed one, at a record boundary or mid-record, or the newest one mid-file
below records the index confirmed) makes the open fail with a CorruptStoreError naming the file, the
offset where its intact records end and the ids beyond; a server serves the queue as unavailable
with that error until it is started with --repair, and the repair names every id it could not keep,
each of which then reads FAILED with a dead letter saying what was lost where (and stays so through
requeueing, compaction and reopening). A torn tail holding only records the index never confirmed
is still cut with a warning. Offsets are computed here from the layouts in constants.

What is lost is found by `conveyor.storage.losses`.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

import conveyor.storage.durable as durable
from conveyor.client.queue_client import QueueClient
from conveyor.constants import (
    BODY_PREFIX,
    INDEX_NAME,
    KIND_MESSAGE,
    QUEUES_DIR,
    RECORD_HEAD,
    RECORD_OVERHEAD,
    SEGMENT_GLOB,
    SEGMENT_HEADER,
)
from conveyor.errors import CorruptStoreError, RequestError
from conveyor.message import Message, Status
from conveyor.server.processes import spawn_server, stop_server
from conveyor.storage import DurableStore, Stats

SEG = 8192
N = 430  # the newest of 8 segments holds 31 messages
LONG = 3600.0
LOGGER = "conveyor.storage"


def records(f: Path) -> list[tuple[int, int, int, int]]:
    """(start, end, kind, id) of each record of a segment file, parsed with the layout from constants."""
    data = f.read_bytes()
    pos, out = SEGMENT_HEADER.size, []
    while pos + RECORD_HEAD.size <= len(data):
        n = RECORD_HEAD.unpack_from(data, pos)[1]
        if pos + n + RECORD_OVERHEAD > len(data):
            break
        kind, msg_id = BODY_PREFIX.unpack_from(data, pos + RECORD_HEAD.size)
        out.append((pos, pos + n + RECORD_OVERHEAD, kind, msg_id))
        pos += n + RECORD_OVERHEAD
    return out


def files(path: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(path.iterdir()) if f.is_file()}


def delivered_store(path: Path) -> dict[int, bytes]:
    """N messages over several segments, every one delivered (so the index names each); id -> payload."""
    with DurableStore(path, segment_bytes=SEG, fsync="never") as s:
        ids = s.put([Message(payload=b"m%04d-" % i + b"x" * 90) for i in range(N)])
        assert len(s.get(N, lease_s=LONG)) == N
    assert len(sorted(path.glob(SEGMENT_GLOB))) >= 4
    return {i: b"m%04d-" % k + b"x" * 90 for k, i in enumerate(ids)}


def cut(f: Path, at: int) -> list[int]:
    """Truncate `f` to `at` bytes; returns the ids of the message records that do not fit any more."""
    gone = [i for _, end, kind, i in records(f) if end > at and kind == KIND_MESSAGE]
    os.truncate(f, at)
    return gone


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING and text in r.getMessage()
    ]


@pytest.mark.parametrize("which", ["sealed", "sealed-mid-record", "newest"])
def test_a_segment_cut_short_below_what_the_index_confirms_is_named_and_repair_names_each_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, which: str
) -> None:
    path = tmp_path / "q"
    payloads = delivered_store(path)
    segs = sorted(path.glob(SEGMENT_GLOB))
    f = segs[-1] if which == "newest" else segs[1]
    recs = records(f)
    start = recs[len(recs) // 3][0]
    at = start if which == "sealed" else start + 7  # at a record boundary, or mid-record: like a torn tail
    lost = cut(f, at)
    assert len(lost) >= 10
    before = files(path)
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(CorruptStoreError) as e:
        DurableStore(path, segment_bytes=SEG)
    assert (e.value.path, e.value.offset) == (str(f), start)
    assert f"records of {len(lost)} ids" in str(e.value) and f"{lost[0]}-{lost[-1]}" in str(e.value)
    assert "--repair" in str(e.value)
    assert warnings_of(caplog, "torn tail") == []  # not a torn tail
    assert files(path) == before  # refused: nothing cut or changed
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG, repair=True) as s:
        [w] = warnings_of(caplog, "could not keep")
        assert f"{len(lost)} ids: {lost[0]}-{lost[-1]};" in w
        assert warnings_of(caplog, "torn") == []  # cut short, and said so
        assert {i: s.status(i) for i in lost} == dict.fromkeys(lost, Status.FAILED)
        dead = {d.message.id: d for d in s.dead_letters()}
        assert sorted(dead) == lost
        assert all(d.error.startswith("lost:") and f.name in d.error and d.message.payload == b"" for d in dead.values())
        kept = {i: p for i, p in payloads.items() if i not in lost}
        assert s.stats().delivered == len(kept)
        s.expire(s.clock() + 2 * LONG)
        got = s.get(N, lease_s=LONG)
        assert {m.id: m.payload for m in got} == kept  # every other message intact
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG) as s:
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []  # repaired for good
        assert {i: s.status(i) for i in lost} == dict.fromkeys(lost, Status.FAILED)


def test_what_a_repair_could_not_keep_stays_failed_through_requeue_compaction_and_reopening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lost ids' FAILED status and counts hold through requeues, compaction and reopening.

    The lost ids' FAILED status and counts hold when their dead letters are requeued (put back, then
    forgotten, as `QueuePool.requeue_dead_letters` does), when everything finishes (segments
    dropped, the index rewritten), and after reopening.
    """
    monkeypatch.setattr(durable, "INDEX_REWRITE_MIN_RECORDS", 64)
    path = tmp_path / "q"
    payloads = delivered_store(path)
    f = sorted(path.glob(SEGMENT_GLOB))[-1]
    recs = records(f)
    lost = cut(f, recs[len(recs) // 3][0] + 7)
    with DurableStore(path, segment_bytes=SEG, repair=True) as s:
        assert s.stats().failed == len(lost)
        dead = s.dead_letters()
        again = s.put([Message(payload=d.message.payload, headers=d.message.headers) for d in dead])
        assert s.forget([d.message.id for d in dead]) == len(lost)
        s.expire(s.clock() + 2 * LONG)
        got = s.get(2 * N, lease_s=LONG)
        assert sorted(m.id for m in got) == sorted([i for i in payloads if i not in lost] + again)
        index_before = (path / INDEX_NAME).stat().st_size
        assert all(s.ack_many([m.id for m in got]))
        assert (path / INDEX_NAME).stat().st_size < index_before / 4, "the index was not rewritten"
        assert len(list(path.glob(SEGMENT_GLOB))) <= 2  # finished segments dropped
        done = replace(s.stats(), bytes_on_disk=0)
        assert done == Stats(ready=0, delivered=0, acked=N - len(lost) + len(again), failed=len(lost), delayed=0, bytes_on_disk=0)
        assert {s.status(i) for i in lost} == {Status.FAILED} and s.dead_letters() == []
    with DurableStore(path, segment_bytes=SEG) as s:
        assert replace(s.stats(), bytes_on_disk=0) == done
        assert {s.status(i) for i in lost} == {Status.FAILED} and s.dead_letters() == []


def test_a_torn_tail_beyond_what_the_index_confirms_is_still_cut_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Records after the last one the index names (puts never delivered) torn off: a crash's torn tail, cut."""
    path = tmp_path / "q"
    with DurableStore(path, segment_bytes=SEG, fsync="never") as s:
        ids = s.put([Message(payload=b"m%04d" % i) for i in range(N)])
        assert len(s.get(N // 2, lease_s=LONG)) == N // 2
    f = sorted(path.glob(SEGMENT_GLOB))[-1]
    start, _, kind, last = records(f)[-1]
    assert kind == KIND_MESSAGE and last == ids[-1]
    os.truncate(f, start + 5)
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG) as s:
        assert len(warnings_of(caplog, "torn tail")) == 1
        assert s.status(last) is None
        assert s.stats().delivered == N // 2 and s.stats().ready == N // 2 - 1


def test_a_server_serves_a_queue_cut_short_as_unavailable_until_repair(tmp_path: Path) -> None:
    """Through `conveyor serve`, a queue cut short is unavailable until --repair; the others serve.

    Through `conveyor serve`: the queue is unavailable with the error naming the file and --repair,
    the other queues serve; with --repair the lost ids read FAILED with a reason and the log names
    each.
    """
    data = tmp_path / "data"
    log_path = tmp_path / "server.log"
    log = open(log_path, "wb")  # noqa: SIM115
    proc, address = spawn_server(data, stderr=log)
    port = int(address.rsplit(":", 1)[1])
    try:
        with QueueClient(address, timeout=30) as c:
            ids = c.put("q", [Message(payload=b"m%04d-" % i + b"y" * 500) for i in range(N)])
            assert len(c.get("q", N, lease_s=LONG)) == N  # delivered: the index names every one
            c.put("other", [Message(payload=b"fine")])
        os.kill(proc.pid, signal.SIGKILL)
        stop_server(proc)
        f = sorted((data / QUEUES_DIR / "q").glob(SEGMENT_GLOB))[-1]
        recs = records(f)
        lost = cut(f, recs[len(recs) // 2][0] + 3)
        assert lost and lost[-1] == ids[-1]
        proc, _ = spawn_server(data, port, stderr=log)
        with QueueClient(address, timeout=30) as c:
            with pytest.raises(RequestError) as e:
                c.get("q", 1)
            assert e.value.kind == "unavailable"
            assert str(f) in str(e.value) and "--repair" in str(e.value) and f"records of {len(lost)} ids" in str(e.value)
            assert [m.payload for m in c.get("other", 10)] == [b"fine"]
        stop_server(proc)
        proc, _ = spawn_server(data, port, args=["--repair"], stderr=log)
        with QueueClient(address, timeout=30) as c:
            assert c.status("q", lost) == [Status.FAILED] * len(lost)
            assert c.status("q", [ids[0]]) == [Status.DELIVERED]
            dead = c.dead_letters("q")
            assert [d.message.id for d in dead] == lost and all(d.error.startswith("lost:") for d in dead)
    finally:
        stop_server(proc)
        log.close()
    assert f"could not keep what the index confirmed of {len(lost)} ids: {lost[0]}-{lost[-1]};" in log_path.read_text()
