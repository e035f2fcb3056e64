"""Damaged DurableStore files on disk: CRC failures raise with file and offset, torn tails are cut, repair keeps the rest.

Every expected offset is computed here from the layouts in `conveyor.constants`, independently of the
store's own scanning code.

The scan on opening is `conveyor.storage.segment_scan`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from conveyor.constants import (
    BODY_PREFIX,
    INDEX_FIELDS,
    INDEX_HEADER,
    INDEX_NAME,
    INDEX_RECORD,
    KIND_DEAD,
    KIND_MESSAGE,
    KIND_RESULT,
    RECORD_HEAD,
    RECORD_OVERHEAD,
    SEGMENT_GLOB,
    SEGMENT_HEADER,
    SEGMENT_MAGIC,
    SEGMENT_VERSION,
    ST_ACKED,
)
from conveyor.errors import CorruptStoreError
from conveyor.message import Message, Status
from conveyor.storage import DurableStore

SEG = 8192
N = 200
LOGGER = "conveyor.storage"
LONG = 3600.0
T = TypeVar("T")


# --- helpers --------------------------------------------------------------------------------------
def payload(i: int) -> bytes:
    """The checkable payload of the i-th message put (0-based)."""
    return b"msg-%05d-" % i + bytes([65 + i % 26]) * (100 + i % 50)


@dataclass(frozen=True)
class Rec:
    """One segment record as laid out on disk: `crc32 | size | body | footer`."""

    start: int  # offset of the record's crc field
    size: int  # body bytes
    kind: int
    id: int

    @property
    def body(self) -> int:
        return self.start + RECORD_HEAD.size

    @property
    def end(self) -> int:
        return self.start + self.size + RECORD_OVERHEAD


def seg_records(f: Path) -> list[Rec]:
    """Parse a segment file with the layout from constants (header, then records back to back)."""
    data = f.read_bytes()
    pos, out = SEGMENT_HEADER.size, []
    while pos < len(data):
        _, n = RECORD_HEAD.unpack_from(data, pos)
        kind, msg_id = BODY_PREFIX.unpack_from(data, pos + RECORD_HEAD.size)
        out.append(Rec(pos, n, kind, msg_id))
        pos += n + RECORD_OVERHEAD
    assert pos == len(data), f"{f.name}: records do not end at the end of the file"
    return out


def index_records(path: Path) -> list[dict[str, int | float]]:
    """Parse the index with the layout from constants: each record's fields by name."""
    data = (path / INDEX_NAME).read_bytes()
    body = len(data) - INDEX_HEADER.size
    assert body % INDEX_RECORD.size == 0
    return [dict(zip(INDEX_FIELDS, r, strict=True)) for r in INDEX_RECORD.iter_unpack(data[INDEX_HEADER.size :])]


def index_offset(k: int) -> int:
    return INDEX_HEADER.size + k * INDEX_RECORD.size


def segments(path: Path) -> list[Path]:
    return sorted(path.glob(SEGMENT_GLOB))


def flip(f: Path, offset: int) -> None:
    data = bytearray(f.read_bytes())
    data[offset] ^= 0xFF
    f.write_bytes(bytes(data))


def files(path: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(path.iterdir()) if f.is_file()}


def warnings_of(caplog: pytest.LogCaptureFixture, text: str = "") -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING and text in r.getMessage()
    ]


def no_error(what: str, fn: Callable[[], T]) -> T:
    """Call fn, turning an unexpected exception into a plain test failure that says what failed."""
    try:
        return fn()
    except Exception as e:
        pytest.fail(f"{what} raised {e!r}")


def fill(path: Path, n: int = N) -> dict[int, bytes]:
    """Put n messages (puts only: no index records); returns id -> payload."""
    with DurableStore(path, segment_bytes=SEG, fsync="never") as s:
        ids = s.put([Message(payload=payload(i)) for i in range(n)])
    assert len(segments(path)) >= 4
    return dict(zip(ids, map(payload, range(n)), strict=True))


def take_all(s: DurableStore) -> dict[int, bytes]:
    """Deliver every ready message (long lease, no ack); returns id -> payload, failing on a repeat."""
    out: dict[int, bytes] = {}
    while got := s.get(500, lease_s=LONG):
        for m in got:
            assert m.id not in out, f"message {m.id} delivered twice"
            out[m.id] = m.payload
    return out


def check_ready(s: DurableStore, expected: dict[int, bytes]) -> None:
    """Exactly `expected` is ready, with intact payloads: counted by stats() and by get()."""
    st = s.stats()
    assert (st.ready, st.delivered, st.delayed) == (len(expected), 0, 0)
    assert all(s.status(i) == Status.READY for i in expected)
    assert take_all(s) == expected


@dataclass
class Busy:
    """A store whose index holds deliveries, acks with results and nacks."""

    payloads: dict[int, bytes]
    results: dict[int, bytes]  # acked id -> result
    statuses: dict[int, Status | None] = field(default_factory=dict)
    acked_mid: int = 0  # an acked id whose ACKED record sits in the middle of the index
    acked_last: int = 0  # the id whose ACKED record is the last one of the index


def busy_store(path: Path) -> Busy:
    """N puts; 120 delivered; every other one acked one by one with results, 20 nacked; one more ack last."""
    with DurableStore(path, segment_bytes=SEG, fsync="never") as s:
        ids = s.put([Message(payload=payload(i)) for i in range(N)])
        b = Busy(dict(zip(ids, map(payload, range(N)), strict=True)), {})
        got = s.get(120, lease_s=LONG)
        evens, odds = got[0::2], got[1::2]  # every segment keeps unfinished messages: none is compacted away
        for m in evens:
            assert s.ack(m.id, b"res-" + m.payload)
            b.results[m.id] = b"res-" + m.payload
        assert all(s.nack_many([m.id for m in odds[:20]], ["e"] * 20))
        last = odds[40]
        assert s.ack(last.id, b"res-" + last.payload)
        b.results[last.id] = b"res-" + last.payload
        b.acked_mid, b.acked_last = evens[30].id, last.id
        b.statuses = {i: s.status(i) for i in ids}
    return b


def acked_record(path: Path, msg_id: int) -> int:
    """The index position of the ACKED record of msg_id."""
    [k] = [k for k, r in enumerate(index_records(path)) if r["id"] == msg_id and r["status"] == ST_ACKED]
    return k


def check_busy(s: DurableStore, b: Busy, reverted: int | None = None) -> None:
    """Every status and result of `b` is intact, except `reverted` whose ack was lost (DELIVERED again)."""
    for i, st in b.statuses.items():
        assert s.status(i) == (Status.DELIVERED if i == reverted else st), i
    want = {i: r for i, r in b.results.items() if i != reverted}
    assert dict(s.results()) == want
    assert all(s.result(i) == r for i, r in want.items())
    st = s.stats()
    delivered = sum(x == Status.DELIVERED for x in b.statuses.values())
    assert (st.acked, st.delivered) == (len(want), delivered + (reverted is not None))
    # nothing intact is lost: every unfinished message comes back once its lease is over
    s.expire(time.time() + 2 * LONG)
    assert take_all(s) == {i: p for i, p in b.payloads.items() if i not in want}


# --- (a), (g): a flipped byte outside a torn tail raises --------------------------------------------
@pytest.mark.parametrize("field", ["body", "size", "footer"])
@pytest.mark.parametrize("which", ["sealed", "newest"])
def test_flipped_byte_in_a_segment_record_raises(tmp_path: Path, which: str, field: str) -> None:
    """A bad record with valid ones after it raises CorruptStoreError at the record's start, even in the newest segment."""
    path = tmp_path / "q"
    payloads = fill(path)
    segs = segments(path)
    f = segs[1] if which == "sealed" else segs[-1]
    recs = seg_records(f)
    bad = recs[len(recs) // 2]
    assert bad.kind == KIND_MESSAGE and len(recs) >= 5
    at = {"body": bad.body + bad.size // 2, "size": bad.start + 4, "footer": bad.end - 1}[field]
    flip(f, at)
    before = files(path)
    with pytest.raises(CorruptStoreError) as e:
        DurableStore(path, segment_bytes=SEG)
    assert (e.value.path, e.value.offset) == (str(f), bad.start)
    assert "repair=True" in str(e.value)
    assert files(path) == before  # a refused open changes nothing (the newest segment is not cut)
    # nothing intact was dropped: with the byte restored, every message is there
    flip(f, at)
    with DurableStore(path, segment_bytes=SEG) as s:
        check_ready(s, payloads)


@pytest.mark.parametrize("which", ["sealed-segment", "index"])
def test_damaged_file_header_raises_at_offset_zero(tmp_path: Path, which: str) -> None:
    """A bad segment header or index header raises CorruptStoreError at offset 0 and changes nothing."""
    path = tmp_path / "q"
    b = busy_store(path)
    f = segments(path)[1] if which == "sealed-segment" else path / INDEX_NAME
    flip(f, 3)  # inside the magic
    before = files(path)
    with pytest.raises(CorruptStoreError) as e:
        DurableStore(path, segment_bytes=SEG)
    assert (e.value.path, e.value.offset) == (str(f), 0)
    assert files(path) == before
    flip(f, 3)
    with DurableStore(path, segment_bytes=SEG) as s:
        check_busy(s, b)


# --- (b): a flipped byte in the middle of the index raises ------------------------------------------
def test_flipped_byte_in_the_index_raises(tmp_path: Path) -> None:
    """A bad index record with valid ones after it raises CorruptStoreError naming index.wal and the record offset."""
    path = tmp_path / "q"
    b = busy_store(path)
    k = acked_record(path, b.acked_mid)
    total = len(index_records(path))
    assert 0 < k < total - 10
    flip(path / INDEX_NAME, index_offset(k) + INDEX_RECORD.size // 2)
    before = files(path)
    with pytest.raises(CorruptStoreError) as e:
        DurableStore(path, segment_bytes=SEG)
    assert (e.value.path, e.value.offset) == (str(path / INDEX_NAME), index_offset(k))
    assert files(path) == before
    flip(path / INDEX_NAME, index_offset(k) + INDEX_RECORD.size // 2)
    with DurableStore(path, segment_bytes=SEG) as s:
        check_busy(s, b)


# --- (c), (h): torn tails of the newest segment ------------------------------------------------------
def test_newest_segment_truncated_mid_record_is_cut(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A record cut short at the end of the newest segment is dropped with a warning; everything before it is intact."""
    path = tmp_path / "q"
    payloads = fill(path)
    f = segments(path)[-1]
    last = seg_records(f)[-1]
    assert last.kind == KIND_MESSAGE and last.id == max(payloads)
    with open(f, "r+b") as fh:
        fh.truncate(last.body + last.size // 2)
    del payloads[last.id]
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG) as s:
        assert warnings_of(caplog, "torn tail")
        assert f.stat().st_size == last.start  # the partial record is gone from the file too
        assert s.status(last.id) is None
        st = s.stats()
        assert (st.ready, st.acked, st.failed) == (len(payloads), 0, 0)
        [new] = s.put([Message(payload=b"after the tear")])
    payloads[new] = b"after the tear"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG) as s:
        assert warnings_of(caplog) == []  # what was written after the cut is clean
        check_ready(s, payloads)


@pytest.mark.parametrize("kind", [KIND_RESULT, KIND_DEAD], ids=["result", "dead-letter"])
def test_torn_result_or_dead_letter_is_not_served_as_other_bytes(tmp_path: Path, kind: int) -> None:
    """A result or dead letter torn off a segment's tail is never served as the bytes written there next.

    A tail cut off the newest segment that holds a result (or dead letter) whose index record
    survived loses what the index confirmed: the open is refused, naming the file and where its
    records end; repaired, the id reads FAILED with a dead letter saying so, never the bytes of
    whatever is written there next. (Segments and index are separate files: under fsync "interval"
    or "never" a machine crash can keep the index record and lose the segment's tail.)
    """
    path = tmp_path / "q"
    with DurableStore(path, segment_bytes=SEG, fsync="never", max_attempts=1) as s:
        ids = s.put([Message(payload=payload(i)) for i in range(100)])
        [m] = s.get(1, lease_s=LONG)
        if kind == KIND_RESULT:
            assert s.ack(m.id, b"res-" + m.payload)
        else:
            assert s.nack(m.id, "the error")
    f = segments(path)[-1]
    last = seg_records(f)[-1]
    assert (last.kind, last.id) == (kind, m.id)
    with open(f, "r+b") as fh:
        fh.truncate(last.body + last.size // 2)
    before = files(path)
    with pytest.raises(CorruptStoreError) as e:
        DurableStore(path, segment_bytes=SEG, fsync="never")
    assert (e.value.path, e.value.offset) == (str(f), last.start)
    assert f"results or dead letters {m.id}" in str(e.value) and "--repair" in str(e.value)
    assert files(path) == before  # refused: nothing cut

    def check(s: DurableStore) -> None:
        assert s.status(m.id) == Status.FAILED
        r = s.result(m.id)
        assert r is None, f"result({m.id}) is {len(r)} bytes {r[:24]!r}, but its record was cut off"
        assert m.id not in dict(s.results())
        [d] = no_error("dead_letters()", s.dead_letters)
        assert (d.message.id, d.message.payload) == (m.id, m.payload)  # its body was not cut
        assert d.error.startswith("lost:") and f.name in d.error

    with DurableStore(path, segment_bytes=SEG, fsync="never", repair=True) as s:
        check(s)
        s.put([Message(payload=b"new" * 60) for _ in range(3)])  # lands where the cut record was
        check(s)
        assert s.stats().ready == len(ids) - 1 + 3
    with DurableStore(path, segment_bytes=SEG) as s:
        check(s)


TAILS: dict[str, bytes] = {
    "zeros": bytes(300),
    "few-zeros": bytes(3),
    "garbage": random.Random(7).randbytes(500),
    "ones": b"\xff" * 40,
    "half-header": RECORD_HEAD.pack(0x1234, 100),
}


@pytest.mark.parametrize("tail", list(TAILS), ids=list(TAILS))
def test_garbage_after_the_newest_segment_is_a_torn_tail(tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: str) -> None:
    """Zero or garbage bytes appended to the newest segment are cut off with a warning; no message is lost."""
    path = tmp_path / "q"
    payloads = fill(path)
    f = segments(path)[-1]
    size = f.stat().st_size
    with open(f, "ab") as fh:
        fh.write(TAILS[tail])
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG) as s:
        assert warnings_of(caplog, "torn tail")
        assert f.stat().st_size == size
        [new] = s.put([Message(payload=b"after the tear")])
        payloads[new] = b"after the tear"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG) as s:
        assert warnings_of(caplog) == []
        check_ready(s, payloads)


def test_torn_header_of_a_new_segment_is_removed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A newest segment shorter than its header (a crash while rolling) is removed with a warning."""
    path = tmp_path / "q"
    payloads = fill(path)
    last = segments(path)[-1]
    torn = last.with_name(f"seg-{int(last.name[4:-4]) + 1:08d}.log")
    torn.write_bytes(SEGMENT_HEADER.pack(SEGMENT_MAGIC, SEGMENT_VERSION, int(torn.name[4:-4]), 0)[:5])
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG) as s:
        assert warnings_of(caplog, "torn segment header")
        check_ready(s, payloads)


# --- (d): torn tail of the index ------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["truncate", "zeros"])
def test_torn_index_tail_is_cut(tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str) -> None:
    """index.wal cut mid-record (or followed by zeros) opens with a warning: only the torn record's change is lost."""
    path = tmp_path / "q"
    b = busy_store(path)
    idx = path / INDEX_NAME
    total = len(index_records(path))
    if how == "truncate":
        assert acked_record(path, b.acked_last) == total - 1
        with open(idx, "r+b") as fh:
            fh.truncate(index_offset(total - 1) + INDEX_RECORD.size // 2)
        reverted: int | None = b.acked_last
        keep = index_offset(total - 1)
    else:
        with open(idx, "ab") as fh:
            fh.write(bytes(3 * INDEX_RECORD.size + 7))
        reverted, keep = None, index_offset(total)
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG) as s:
        assert warnings_of(caplog, "torn tail")
        assert idx.stat().st_size == keep
        assert s.result(b.acked_last) == (None if reverted else b.results[b.acked_last])
        check_busy(s, b, reverted)
        s.put([Message(payload=b"after the tear")])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG) as s:
        assert warnings_of(caplog) == []
        assert s.stats().ready == 1  # the one put after reopening; everything else was taken above


# --- (e), (f): repair ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("delivered", [False, True], ids=["ready", "delivered"])
def test_repair_sets_a_damaged_segment_aside_and_keeps_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, delivered: bool
) -> None:
    """repair=True pads the damaged record in place, keeps its bytes aside, and loses only the damaged record's message."""
    path = tmp_path / "q"
    payloads = fill(path)
    if delivered:  # the damaged message then also has an index record pointing at its lost body
        with DurableStore(path, segment_bytes=SEG, fsync="never") as s:
            assert len(s.get(N, lease_s=LONG)) == N
    f = segments(path)[1]
    recs = seg_records(f)
    bad = recs[len(recs) // 2]
    flip(f, bad.body + bad.size // 2)
    damaged = f.read_bytes()
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG, repair=True) as s:
        assert warnings_of(caplog, "padding")
        [aside] = path.glob(f"{f.name}.damaged-*")
        kept = aside.read_bytes()  # the damaged bytes, at their offsets (a sparse file: no room for a copy needed)
        assert len(kept) == len(damaged) and kept[bad.start : bad.end] == damaged[bad.start : bad.end]
        assert kept[: bad.start] == bytes(bad.start) and kept[bad.end :] == bytes(len(damaged) - bad.end)
        assert f.stat().st_size == len(damaged)  # every intact record keeps its offset
        assert [(r.start, r.id) for r in seg_records(f) if r.start != bad.start] == [
            (r.start, r.id) for r in recs if r.start != bad.start
        ]
        del payloads[bad.id]
        if delivered:  # the index confirmed it: it reads FAILED, its dead letter saying what was lost where
            [w] = warnings_of(caplog, "could not keep")
            assert f" 1 ids: {bad.id};" in w
            assert s.status(bad.id) == Status.FAILED
            [d] = s.dead_letters()
            assert (d.message.id, d.message.payload) == (bad.id, b"")
            assert d.error.startswith("lost:") and f.name in d.error
            assert s.stats().delivered == len(payloads)
            s.expire(time.time() + 2 * LONG)
        else:  # put and never delivered: no index record names it
            assert s.status(bad.id) is None
        check_ready(s, payloads)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG) as s:
        # the repaired store opens without repair=True, and reports nothing again
        assert warnings_of(caplog) == []
        assert s.stats().delivered == len(payloads)
        assert s.status(bad.id) == (Status.FAILED if delivered else None)


def test_repair_drops_a_damaged_index_record_and_keeps_the_rest(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """repair=True on a damaged index keeps every valid record (the original aside): only that record's change is lost."""
    path = tmp_path / "q"
    b = busy_store(path)
    idx = path / INDEX_NAME
    k = acked_record(path, b.acked_mid)
    total = len(index_records(path))
    flip(idx, index_offset(k) + INDEX_RECORD.size // 2)
    damaged = idx.read_bytes()
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG, repair=True) as s:
        assert warnings_of(caplog, "damaged index")
        [aside] = path.glob(f"{INDEX_NAME}.damaged-*")
        assert aside.read_bytes() == damaged
        assert len(index_records(path)) == total - 1
        # the lost ack means at-least-once: the message is delivered again, never lost
        assert s.result(b.acked_mid) is None
        check_busy(s, b, reverted=b.acked_mid)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), DurableStore(path, segment_bytes=SEG) as s:
        assert warnings_of(caplog) == []
        assert s.stats().acked == len(b.results) - 1


# --- repair must never hand out padding or shifted bytes -------------------------------------------------------
@pytest.mark.parametrize("kind", [KIND_RESULT, KIND_DEAD], ids=["result", "dead-letter"])
def test_repair_of_a_damaged_result_or_dead_letter_serves_no_padding(tmp_path: Path, kind: int) -> None:
    """After repair=True, a result or dead letter in a damaged span is gone, not served as the padding's bytes."""
    path = tmp_path / "q"
    with DurableStore(path, segment_bytes=SEG, fsync="never", max_attempts=1) as s:
        ids = s.put([Message(payload=payload(i)) for i in range(40)])
        got = s.get(20, lease_s=LONG)
        if kind == KIND_RESULT:
            assert all(s.ack_many([m.id for m in got], [b"res-" + m.payload for m in got]))
        else:
            assert all(s.nack_many([m.id for m in got], [f"err {m.id}" for m in got]))
        s.put([Message(payload=payload(i)) for i in range(40, N)])  # seal the segment holding them
    f = next(f for f in segments(path)[:-1] if any(r.kind == kind for r in seg_records(f)))
    kept = [r for r in seg_records(f) if r.kind == kind]
    bad = kept[len(kept) // 2]
    flip(f, bad.body + bad.size // 2)
    others = {m.id for m in got} - {bad.id}
    with DurableStore(path, segment_bytes=SEG, repair=True) as s:
        # what was lost reads FAILED, its dead letter saying so; the message's body was not damaged: kept
        assert s.status(bad.id) == Status.FAILED
        dls = no_error("dead_letters() after repair", s.dead_letters)
        lost = [d for d in dls if d.message.id == bad.id]
        assert [(d.message.payload, d.error.startswith("lost:")) for d in lost] == [(payload(bad.id - ids[0]), True)]
        if kind == KIND_RESULT:
            res = dict(s.results())
            assert {i: res.get(i) for i in others} == {i: b"res-" + payload(i - ids[0]) for i in others}
            r = s.result(bad.id)
            assert r is None, f"result({bad.id}) after repair is {len(r)} bytes {r[:12]!r}...: the padding, served as a result"
            assert bad.id not in res
        else:
            assert {d.message.id: (d.message.payload, d.error) for d in dls if d not in lost} == {
                i: (payload(i - ids[0]), f"err {i}") for i in others
            }


@pytest.mark.parametrize("where", ["sealed-tail", "between-records"])
def test_repair_of_a_damaged_span_shorter_than_a_record(tmp_path: Path, where: str) -> None:
    """repair=True copes with a damaged span too short for a padding record.

    Nothing intact shifts or is lost, and the repaired store then opens without repair=True.
    """
    path = tmp_path / "q"
    with DurableStore(path, segment_bytes=SEG, fsync="never") as s:
        ids = s.put([Message(payload=payload(i)) for i in range(20)])
        got = s.get(10, lease_s=LONG)
        assert all(s.ack_many([m.id for m in got], [b"res-" + m.payload for m in got]))
        ids += s.put([Message(payload=payload(i)) for i in range(20, N)])
    payloads = {i: p for i, p in zip(ids, map(payload, range(N)), strict=True) if i not in {m.id for m in got}}
    results = {m.id: b"res-" + m.payload for m in got}
    f = segments(path)[0]
    recs = seg_records(f)
    assert any(r.kind == KIND_RESULT for r in recs[5:]) and len(segments(path)) > 2
    data = f.read_bytes()
    if where == "sealed-tail":  # 5 zero bytes after the last record of a sealed segment
        f.write_bytes(data + bytes(5))
    else:  # 5 stray bytes between two records, ending like a record footer
        f.write_bytes(data[: recs[5].start] + b"xENDE" + data[recs[5].start :])
    with pytest.raises(CorruptStoreError) as e:
        DurableStore(path, segment_bytes=SEG)
    assert (e.value.path, e.value.offset) == (str(f), len(data) if where == "sealed-tail" else recs[5].start)
    with DurableStore(path, segment_bytes=SEG, repair=True) as s:
        assert {i: s.result(i) for i in results} == results
        served = no_error("get() after repair", lambda: take_all(s))
        assert sorted(i for i, p in served.items() if p != payloads[i]) == [], "messages served with other bytes"
        lost = set(payloads) - set(served)
        assert len(lost) <= (0 if where == "sealed-tail" else 1), f"intact messages lost: {sorted(lost)}"
    with no_error("reopening the repaired store", lambda: DurableStore(path, segment_bytes=SEG)) as s:
        assert {i: s.result(i) for i in results} == results
        assert s.stats().delivered == len(served)


@pytest.mark.parametrize("damage", ["flip", "torn"])
def test_damaged_idempotency_key_log_keeps_every_intact_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """A flipped byte costs the one record it hits, not every one after it; a copy of the file is kept aside."""
    from conveyor.constants import KEYS_LOG_NAME
    from conveyor.server.idempotency import Dedupe

    keys = Dedupe(tmp_path)
    for i in range(50):
        keys.add([(f"key-{i}", i + 1)])
    keys.close()
    f = tmp_path / KEYS_LOG_NAME
    data = f.read_bytes()
    if damage == "flip":
        flip(f, len(data) // 2)
    else:
        f.write_bytes(data[:-7])
    damaged = f.read_bytes()
    with caplog.at_level(logging.WARNING):
        keys = Dedupe(tmp_path)
    kept = {f"key-{i}": keys.get(f"key-{i}") for i in range(50)}
    assert sum(v is None for v in kept.values()) == 1 and all(v in (None, i + 1) for i, v in enumerate(kept.values()))
    assert (kept["key-49"] is None) == (damage == "torn")
    [warning] = [r.getMessage() for r in caplog.records if KEYS_LOG_NAME in r.getMessage()]
    assert ("torn tail" if damage == "torn" else "damaged records") in warning
    assert [p.read_bytes() for p in tmp_path.glob(f"{KEYS_LOG_NAME}.damaged-*")] == [damaged]
    keys.add([("after", 99)])
    keys.close()
    reopened = Dedupe(tmp_path)
    assert reopened.get("after") == 99 and reopened.get("key-0") == 1
    reopened.close()


def test_an_empty_index_needs_repair_and_then_loses_no_message(tmp_path: Path) -> None:
    """Finished messages come back (at least once); no message is lost."""
    path = tmp_path / "q"
    with DurableStore(path, segment_bytes=SEG, fsync="never") as s:
        ids = s.put([Message(payload=payload(i)) for i in range(N)])
        s.ack_many([m.id for m in s.get(10)])
    (path / INDEX_NAME).write_bytes(b"")
    with pytest.raises(CorruptStoreError, match="shorter than the index header"):
        DurableStore(path, segment_bytes=SEG)
    with DurableStore(path, segment_bytes=SEG, repair=True) as s:
        assert sorted(take_all(s)) == ids
    with DurableStore(path, segment_bytes=SEG) as s:  # repaired: opens without repair
        assert s.stats().delivered == N
