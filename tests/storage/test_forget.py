"""Forgetting finished messages (`Store.forget`) in every store: what stays after, and what it costs.

A forgotten dead letter stays failed once the window of ids slides past it, an id given twice is
forgotten once, and the failures kept below the window do not make every commit rewrite the index.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import conveyor.storage.durable
from conveyor.message import Message, Status
from conveyor.storage import DurableStore, MemoryStore, Store
from conveyor.storage.wal import Header, IndexLog


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
