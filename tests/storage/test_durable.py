"""DurableStore behaviour beyond the shared contract: reopening, compaction, the index rewrite, fsync policies.

Reopening is `conveyor.storage.recovery` over the record bodies of `conveyor.storage.bodies`;
compaction is `conveyor.storage.compaction`.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

import conveyor.storage.durable as durable
from conveyor.constants import INDEX_NAME, INDEX_REWRITE_MIN_RECORDS, SEGMENT_GLOB
from conveyor.errors import DiskFullError, StoreError
from conveyor.message import Message, Status
from conveyor.storage import DurableStore
from conveyor.storage.segments import SegmentLog

from ..support.servers import wait_for
from .test_crash import spy_fsync


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def snapshot(s: DurableStore) -> tuple[object, ...]:
    return (s.stats(), list(s.results()), [(d.message, d.error, d.failed_at) for d in s.dead_letters()])


def test_reopen_rebuilds_state_exactly(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with DurableStore(path, segment_bytes=8192) as s:
        ids = s.put([Message(payload=b"m%d" % i, priority=i % 3, headers={"n": str(i)}, max_attempts=2) for i in range(300)])
        s.put([Message(payload=b"delayed", not_before=time.time() + 3600)])
        got = s.get(100, lease_s=3600)
        s.ack_many([m.id for m in got[:40]], [b"r%d" % m.id for m in got[:40]])
        for m in got[40:60]:
            s.nack(m.id, f"err {m.id}")
        again = s.get(30, lease_s=3600)
        for m in again:
            if m.attempts == 2:
                s.nack(m.id, f"final {m.id}")
        before = snapshot(s)
        statuses = {i: s.status(i) for i in ids}
        assert before[0].failed > 0 and before[0].acked == 40 and before[0].delayed == 1
    with DurableStore(path, segment_bytes=8192) as s:
        assert snapshot(s) == before
        assert {i: s.status(i) for i in ids} == statuses
        # ready messages come back in priority order with their attempts
        rest = s.get(1000)
        assert [m.priority for m in rest] == sorted((m.priority for m in rest), reverse=True)
        assert all(
            m.attempts == (2 if statuses[m.id] == Status.READY and m.id in {x.id for x in got[40:60]} else 1) for m in rest
        )


def test_delivered_at_crash_come_back_after_their_lease(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with DurableStore(path) as s:
        [a, b] = s.put([Message(payload=b"a"), Message(payload=b"b")])
        s.get(1, lease_s=0.3)
        s.get(1, lease_s=3600)
    with DurableStore(path) as s:
        assert s.status(a) == Status.DELIVERED and s.status(b) == Status.DELIVERED
        assert s.get(10) == []
        got: list[Message] = []
        wait_for(lambda: got.extend(s.get(10)) or got)
        assert [m.id for m in got] == [a] and got[0].attempts == 2
        assert s.status(b) == Status.DELIVERED


def test_compaction_deletes_dead_segments_and_rewrites_the_index(tmp_path: Path) -> None:
    path = tmp_path / "q"
    seg = 64 * 1024
    n = INDEX_REWRITE_MIN_RECORDS  # get + ack writes 2 index records each: enough to trigger a rewrite
    with DurableStore(path, segment_bytes=seg, fsync="never") as s:
        for _ in range(n // 1000 + 1):
            s.put([Message(payload=b"p" * 100) for _ in range(1000)])
        assert len(list(path.glob(SEGMENT_GLOB))) > 10
        while got := s.get(1000):
            s.ack_many([m.id for m in got])
        assert s.stats().acked == (n // 1000 + 1) * 1000
        assert len(list(path.glob(SEGMENT_GLOB))) <= 2
        assert (path / INDEX_NAME).stat().st_size < 4096
        assert dir_bytes(path) < 2 * seg
        last = s.put([Message(payload=b"after")])[0]
    with DurableStore(path, segment_bytes=seg) as s:
        assert s.stats().acked == (n // 1000 + 1) * 1000
        assert s.put([Message(payload=b"x")])[0] > last  # ids are never reused (reopened: past its reservation)
        assert [m.payload for m in s.get(10)] == [b"after", b"x"]


@pytest.mark.parametrize("fsync", ["batch-group", "interval"])
def test_dead_segments_are_deleted_only_once_the_acks_that_killed_them_are_synced(tmp_path: Path, fsync: str) -> None:
    """Deleted earlier, a machine crash could keep the deletion and lose the acks: answered puts would be gone."""
    path = tmp_path / "q"
    group = fsync == "batch-group"
    opts = {"fsync": "batch", "group_commit": True} if group else {"fsync": "interval", "fsync_interval_s": 3600.0}
    with DurableStore(path, segment_bytes=4096, **opts) as s:  # type: ignore[arg-type]
        ids = s.put([Message(payload=b"p" * 200) for _ in range(60)])  # several segments
        s.sync()
        first = sorted(path.glob(SEGMENT_GLOB))[0]
        s.get(60)
        s.ack_many(ids)
        assert first.exists() and s._index.dirty  # dead, but its acks are not synced yet
        s.sync()
        assert not first.exists() and len(list(path.glob(SEGMENT_GLOB))) == 1
    with DurableStore(path, segment_bytes=4096, fsync="never") as s:
        assert s.stats().acked == 60


@pytest.mark.parametrize("fsync", ["batch-group", "interval"])
def test_a_rewritten_index_reaches_the_disk_only_after_the_segments_it_points_into(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: str
) -> None:
    """A rewritten index reaches the disk only after the segments its records point into.

    A rewrite syncs the new index at once, while syncs of operations come later: the messages its
    records name must be on disk first, or a machine crash between the two could leave an index
    confirming deliveries of messages whose bodies never reached the disk (an open refused as a
    segment cut short).
    """
    synced = spy_fsync(monkeypatch)
    monkeypatch.setattr(durable, "INDEX_REWRITE_MIN_RECORDS", 64)
    group = fsync == "batch-group"
    opts = {"fsync": "batch", "group_commit": True} if group else {"fsync": "interval", "fsync_interval_s": 3600.0}
    with DurableStore(tmp_path / "q", **opts) as s:  # type: ignore[arg-type]
        s.put([Message(payload=b"p" * 100) for _ in range(10)])  # written, not synced
        synced.clear()
        for _ in range(10):  # deliveries and releases: index records enough for a rewrite
            s.release_many([m.id for m in s.get(10)])
            if INDEX_NAME + ".tmp" in synced:
                break
        assert INDEX_NAME + ".tmp" in synced, "the index was never rewritten"
        before = synced[: synced.index(INDEX_NAME + ".tmp")]
        assert any(n.startswith("seg-") for n in before), f"the index was rewritten with only {before} synced before"


def test_results_and_dead_letters_survive_compaction_until_forgotten(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with DurableStore(path, segment_bytes=4096, fsync="never") as s:
        [keep] = s.put([Message(payload=b"keep")])
        [dead] = s.put([Message(payload=b"dead", max_attempts=1)])
        s.get(2)
        s.ack(keep, b"the result")
        s.nack(dead, "the error")
        for _ in range(20):  # roll many segments past the one holding the result
            ids = s.put([Message(payload=b"f" * 200) for _ in range(50)])
            s.get(50)
            s.ack_many(ids)
        assert s.result(keep) == b"the result"
    with DurableStore(path, segment_bytes=4096) as s:
        assert s.result(keep) == b"the result"
        [dl] = s.dead_letters()
        assert (dl.message.payload, dl.error) == (b"dead", "the error")
        assert s.forget([keep, dead]) == 2
        s.put([Message(payload=b"roll")])
    with DurableStore(path, segment_bytes=4096) as s:
        assert s.result(keep) is None and s.dead_letters() == []
        assert s.status(keep) == Status.ACKED


@pytest.mark.parametrize("fsync", ["batch", "interval", "never"])
def test_fsync_policies_persist(tmp_path: Path, fsync: str) -> None:
    path = tmp_path / "q"
    with DurableStore(path, fsync=fsync, fsync_interval_s=0.01) as s:  # type: ignore[arg-type]
        ids = s.put([Message(payload=b"%d" % i) for i in range(100)])
        s.get(10)
        s.ack_many(ids[:10], [b"r"] * 10)
    assert not any(t.name.startswith("conveyor-fsync") for t in threading.enumerate())
    with DurableStore(path) as s:
        st = s.stats()
        assert (st.ready, st.acked) == (90, 10)
        assert s.result(ids[0]) == b"r"


def test_constructor_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync"):
        DurableStore(tmp_path / "a", fsync="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="segment_bytes"):
        DurableStore(tmp_path / "b", segment_bytes=10)
    with pytest.raises(ValueError, match="max_attempts"):
        DurableStore(tmp_path / "c", max_attempts=0)
    with pytest.raises(ValueError, match="lease_s"):
        DurableStore(tmp_path / "d", lease_s=0)


def test_large_message_gets_its_own_segment(tmp_path: Path) -> None:
    path = tmp_path / "q"
    big = b"B" * 20000
    with DurableStore(path, segment_bytes=4096) as s:
        ids = s.put([Message(payload=b"small"), Message(payload=big), Message(payload=b"small2")])
    with DurableStore(path, segment_bytes=4096) as s:
        assert [m.payload for m in s.get(3)] == [b"small", big, b"small2"]
        assert [m.id for m in s.get(0)] == [] and ids == sorted(ids)


def test_store_directory_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with DurableStore(path) as s:
        s.put([Message(payload=b"x")])
        with pytest.raises(StoreError, match="open elsewhere"):
            DurableStore(path)
        assert s.stats().ready == 1  # the refused open changed nothing
    with DurableStore(path) as s:  # released on close
        assert s.stats().ready == 1


def test_purged_messages_stay_gone_after_reopen_and_index_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with DurableStore(path, fsync="never") as s:
        keep = s.put([Message(payload=b"keep")])[0]
        s.get(1)
        purged = s.put([Message(payload=b"p%d" % i) for i in range(10)])
        assert s.purge() == 10
        s._rewrite_index()  # the rewrite must keep the purge records of bodies still on disk
    with DurableStore(path, fsync="never") as s:
        assert s.status(purged[0]) is None
        st = s.stats()
        assert (st.ready, st.delivered) == (0, 1)
        assert s.ack(keep)


def test_absent_ids_below_the_window_stay_absent_after_index_rewrite_and_reopen(tmp_path: Path) -> None:
    """Purged ids the window slid past are kept as ranges (gap records in the rewritten index)."""
    path = tmp_path / "s"
    with DurableStore(path, fsync="never") as s:
        first = s.put([Message(payload=b"p")] * 5)
        s.purge()
        for _ in range(30):
            s.put([Message(payload=b"y")] * 100)
            s.ack_many([m.id for m in s.get(100)])
        middle = s.put([Message(payload=b"q")] * 3)
        s.purge()
        s._rewrite_index()
        assert s.status(first[0]) is None and s._state.base > first[-1]
    for _ in range(2):  # and again after a rewrite made from the recovered ranges
        with DurableStore(path, fsync="never") as s:
            assert [s.status(i) for i in (*first, *middle)] == [None] * 8
            assert s.status(first[-1] + 1) == Status.ACKED and s.stats().acked == 3000
            s._rewrite_index()


def test_group_commit_defers_fsync_to_sync(tmp_path: Path) -> None:
    """With group_commit, operations write to the OS and sync() makes them durable, from any thread."""
    with DurableStore(tmp_path / "s", fsync="batch", group_commit=True) as s:
        s.put([Message(payload=b"x")])
        assert s._segments.dirty  # written, not yet synced
        t = threading.Thread(target=s.sync)
        t.start()
        t.join()
        assert not s._segments.dirty and not s._index.dirty
    with DurableStore(tmp_path / "s", fsync="batch") as s:
        assert s.stats().ready == 1


def test_release_and_final_nack_survive_reopening(tmp_path: Path) -> None:
    with DurableStore(tmp_path / "s", fsync="never") as s:
        a, b = s.put([Message(payload=b"a", max_attempts=3), Message(payload=b"b", max_attempts=3)])
        s.get(2)
        s.release_many([a])
        s.nack(b, "no retry can mend this", final=True)
    with DurableStore(tmp_path / "s", fsync="never") as s:
        [m] = s.get(5)
        assert m.id == a and m.attempts == 1
        assert s.status(b) == Status.FAILED and s.dead_letters()[0].error == "no retry can mend this"


def test_skipped_ids_stay_skipped_after_reopen_without_messages(tmp_path: Path) -> None:
    s = DurableStore(tmp_path / "q", fsync="never")
    s.skip_ids(123_456)
    s.close()
    s = DurableStore(tmp_path / "q", fsync="never")
    assert s.next_id == 123_456 and s.status(17) is None  # never assigned here
    assert s.put([Message(payload=b"x")]) == [123_456]
    s.close()
    s = DurableStore(tmp_path / "q", fsync="never")
    assert s.status(17) is None and s.status(123_456) == Status.READY
    s.close()


def test_a_batch_spread_over_many_segments_comes_whole_and_in_order(tmp_path: Path) -> None:
    """Requeued messages from old segments among new ones: read segment by segment, delivered in order."""
    with DurableStore(tmp_path / "q", segment_bytes=4096) as s:
        ids = s.put([Message(payload=b"%04d" % i + b"." * 200, priority=i % 3) for i in range(300)])
        early = s.get(40, lease_s=60)
        assert all(s.nack_many([m.id for m in early[::2]], ["again"] * 20))  # back behind the others, from old segments
        s.put([Message(payload=b"late" + b"." * 200, priority=2) for _ in range(20)])
        got = s.get(1000, lease_s=60)
        assert {m.id for m in got} | {m.id for m in early[1::2]} == set(ids) | set(range(ids[-1] + 1, ids[-1] + 21))
        assert [m.priority for m in got] == sorted((m.priority for m in got), reverse=True)
        assert all(m.payload.startswith(b"%04d" % (m.id - ids[0]) if m.id <= ids[-1] else b"late") for m in got)


def _segment_files(path: Path) -> list[Path]:
    return sorted(path.glob(SEGMENT_GLOB))


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
