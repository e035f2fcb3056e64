"""Regression tests for bugs found in review of the queue stores."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path

import pytest

import conveyor.storage.durable
from conveyor.errors import DiskFullError
from conveyor.message import Message, Status
from conveyor.storage import DurableStore, MemoryStore, Store
from conveyor.storage.segments import SegmentLog
from conveyor.storage.wal import Header, IndexLog


def _segment_files(path: Path) -> list[Path]:
    return sorted(path.glob("seg-*.log"))


def test_reopen_keeps_ready_messages_when_bodies_and_index_records_are_equally_many(tmp_path: Path) -> None:
    # Segment 1 fills with k messages; acking them all deletes it. Then exactly k bodies remain on disk
    # (none with an index record) and the index holds exactly k records (none with a body): recovery's
    # `_member(l_ids, m_ids)` shortcut takes equal lengths for equal sets and pairs records with the wrong ids.
    s = DurableStore(tmp_path, segment_bytes=4096)
    try:
        first: list[int] = []
        while len(_segment_files(tmp_path)) < 2:
            first += s.put([Message(payload=b"x" * 100)])
        in_seg1 = first[:-1]  # the last put rolled to segment 2
        k = len(in_seg1)
        assert s.ack_many(in_seg1) == [True] * k
        pending = [first[-1], *s.put([Message(payload=b"y" * 100) for _ in range(k - 1)])]
        assert s.stats().ready == k
    finally:
        s.close()
    s = DurableStore(tmp_path, segment_bytes=4096)
    try:
        assert s.stats().ready == k
        assert [s.status(i) for i in pending] == [Status.READY] * k
        assert [s.status(i) for i in in_seg1] == [Status.ACKED] * k
        assert [m.id for m in s.get(2 * k)] == pending
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["memory", "durable"])
def test_forgotten_dead_letter_stays_failed_after_the_window_slides(tmp_path: Path, kind: str) -> None:
    # status_of() answers ACKED for every id below the window's base, and forget() removes the id from
    # _failed_ids: a forgotten dead letter turns into ACKED once enough later messages are finished.
    s: Store = MemoryStore(max_attempts=1) if kind == "memory" else DurableStore(tmp_path, max_attempts=1)
    try:
        [dead] = s.put([Message(payload=b"d")])
        assert [m.id for m in s.get(1)] == [dead]
        assert s.nack(dead, "boom")
        assert s.forget([dead]) == 1
        assert s.status(dead) == Status.FAILED
        for _ in range(4):
            ids = s.put([Message(payload=b"p") for _ in range(1000)])
            assert all(s.ack_many(ids))
        assert s.stats().failed == 1
        assert s.status(dead) == Status.FAILED
    finally:
        s.close()


def test_reopen_after_a_failed_put_counts_segment_liveness_correctly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A put that fails (disk full) leaves its ids unused at the top. On reopen, skip_to() past them can
    # slide the state window after load() returned array indices relative to the old base; the segment
    # live counts are then read through the stale indices, so a segment is deleted while still needed.
    s = DurableStore(tmp_path, segment_bytes=4096, fsync="never")
    try:
        ids = s.put([Message(payload=b"x" * 20) for _ in range(1000)])

        def disk_full(self: SegmentLog, bodies: Sequence[bytes]) -> tuple[list[int], list[int]]:
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as m:
            m.setattr(SegmentLog, "append", disk_full)
            with pytest.raises(DiskFullError):
                s.put([Message(payload=b"y") for _ in range(30)])
        # big results roll segments, so the newest segment's id floor is above every stored id
        assert s.ack_many(ids[:10], [b"r" * 3000] * 10) == [True] * 10
    finally:
        s.close()
    s = DurableStore(tmp_path, segment_bytes=4096, fsync="never")
    try:
        done: list[int] = []
        while got := s.get(1):  # one at a time, so each segment is compacted as soon as its count says so
            done.append(got[0].id)
            assert s.ack(got[0].id)
        assert done == ids[10:]
    finally:
        s.close()
    s = DurableStore(tmp_path, segment_bytes=4096, fsync="never")
    try:
        assert s.stats().acked == 1000 and s.stats().ready == 0
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["memory", "durable"])
def test_forget_with_a_repeated_id(tmp_path: Path, kind: str) -> None:
    # DurableStore._forget lists an id once per occurrence and pops it from _kept each time: KeyError.
    s: Store = MemoryStore() if kind == "memory" else DurableStore(tmp_path)
    try:
        [i] = s.put([Message(payload=b"a")])
        assert s.ack(i, b"r")
        assert s.forget([i, i]) == 1
        assert list(s.results()) == []
    finally:
        s.close()


def test_forgotten_failures_do_not_make_every_commit_rewrite_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The rewritten index keeps one record per failed id below the window, but `_compact` compares the
    # record count with `next_id - low + len(_kept)`, which leaves those records out: once they outnumber
    # twice the live ones, every commit rewrites (and fsyncs) the whole index again.
    monkeypatch.setattr(conveyor.storage.durable, "INDEX_REWRITE_MIN_RECORDS", 64)
    rewrites: list[int] = []
    real_rewrite = IndexLog.rewrite

    def counting(self: IndexLog, header: Header, records: bytes) -> None:
        rewrites.append(len(records))
        real_rewrite(self, header, records)

    monkeypatch.setattr(IndexLog, "rewrite", counting)
    s = DurableStore(tmp_path, max_attempts=1, fsync="never")
    try:
        ids = s.put([Message(payload=b"x") for _ in range(200)])
        assert len(s.get(200)) == 200
        assert all(s.nack_many(ids, ["boom"] * 200))
        assert s.forget(ids) == 200
        rewrites.clear()
        for _ in range(50):
            [i] = s.put([Message(payload=b"y")])
            assert s.ack(i)
        assert len(rewrites) <= 2
        assert [s.status(i) for i in ids] == [Status.FAILED] * 200
    finally:
        s.close()
