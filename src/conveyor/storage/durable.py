"""DurableStore: a queue store on disk that survives crashes of its process and of the machine.

Layout (see constants): message bodies, results and dead letters are records in append-only
segment files; every state change after a put is a fixed-size record in the index WAL. Opening
replays both into a `QueueState`. A segment is deleted once nothing in it is needed, and not
before the index records that say so are synced; the index is rewritten once it is mostly
superseded records.

fsync policies, and what a crash can lose (a crash of the *process* alone loses nothing that
an operation returned: every write reaches the OS before the call returns):
- "batch": every operation is on disk before it returns. A machine crash loses nothing returned.
- "interval": a background thread syncs every `fsync_interval_s` (default 0.2 s). A machine crash
  loses at most the operations of the last interval (puts vanish, acks are redone).
- "never": the OS writes back when it likes (typically within ~30 s on Linux).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, cast

import msgpack
import numpy as np

from conveyor.constants import (
    BODY_PREFIX,
    DEFAULT_FSYNC_INTERVAL_S,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_SEGMENT_BYTES,
    ID_RESERVE_CHUNK,
    ID_RESERVE_MOST,
    INDEX_NAME,
    INDEX_REWRITE_MIN_RECORDS,
    INDEX_REWRITE_RATIO,
    KIND_DEAD,
    KIND_MESSAGE,
    KIND_RESULT,
    LOCK_NAME,
    MAX_SEGMENT_BYTES,
    MESSAGE_PREFIX,
    ST_ACKED,
    ST_DELAYED,
    ST_FAILED,
    ST_NONE,
    ST_READY,
)
from conveyor.errors import StoreError
from conveyor.message import DeadLetter, Message, MessageBatch, make_message
from conveyor.storage.base import Store
from conveyor.storage.files import DISK_FULL, store_error
from conveyor.storage.reservation import IdReservation
from conveyor.storage.segments import KEPT_DTYPE, SCAN_DTYPE, SegmentLog
from conveyor.storage.space import SpaceReserve
from conveyor.storage.wal import Header, IndexLog, gap_ranges, last_per_id, make_gap_records, make_records

log = logging.getLogger("conveyor.storage")

FsyncPolicy = Literal["batch", "interval", "never"]
_MSG_PREFIX = MESSAGE_PREFIX.size
_unpack_msg = MESSAGE_PREFIX.unpack_from


def _lock_dir(path: Path) -> int:
    """Lock the store directory for this process; the OS drops the lock when the process dies."""
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreError(f"{path}: the store is open elsewhere (in this or another process)") from None
    return fd


def _member(ids: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """Mask of `ids` (sorted, unique) that are in `sub` (sorted, unique)."""
    if not len(sub):
        return np.zeros(len(ids), bool)
    pos = np.searchsorted(sub, ids)
    return cast(np.ndarray, (pos < len(sub)) & (sub[np.minimum(pos, len(sub) - 1)] == ids))


def _parse(buf: bytes | mmap.mmap, off: int, size: int, queue: str, attempts: int, lease_s: float) -> Message:
    """A Message from its KIND_MESSAGE body at `buf[off:off + size]`."""
    _, msg_id, prio, max_att, nb, at, hlen = _unpack_msg(buf, off)
    start = off + _MSG_PREFIX
    headers = msgpack.unpackb(buf[start : start + hlen]) if hlen else {}
    return make_message(msg_id, queue, buf[start + hlen : off + size], prio, attempts, at, nb, lease_s, max_att, headers)


_packb = msgpack.Packer(use_bin_type=True).pack


class DurableStore(Store):
    """A queue store in a directory: crash-safe, compacting, and compact in memory."""

    def __init__(self, path: str | Path, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 fsync: FsyncPolicy = "batch", fsync_interval_s: float = DEFAULT_FSYNC_INTERVAL_S,
                 repair: bool = False, queue: str = "", max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 lease_s: float = DEFAULT_LEASE_S, group_commit: bool = False,
                 space: SpaceReserve | None = None) -> None:  # fmt: skip
        """Open (or create) the store in `path`.

        group_commit: with fsync="batch", operations return before their fsync and the owner calls
        `sync()` before it acknowledges them, so that concurrent operations share one fsync (the
        queue server does this). Ignored by the other policies.
        space: the reserve of the disk the store is on (see `conveyor.storage.space`), if any.
        """
        if fsync not in ("batch", "interval", "never"):
            raise ValueError(f"fsync must be 'batch', 'interval' or 'never', got {fsync!r}")
        if not 4096 <= segment_bytes <= MAX_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be within [4096, {MAX_SEGMENT_BYTES}], got {segment_bytes}")
        super().__init__(queue, max_attempts, lease_s, {"seg": np.uint32, "off": np.uint32, "size": np.uint32})
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_dir(self.path)
        self.fsync = fsync
        self._space = space
        self._sync_each = fsync == "batch" and not group_commit
        self._segments = SegmentLog(self.path, segment_bytes)
        self._index = IndexLog(self.path)
        self._kept: dict[int, tuple[int, int, int]] = {}  # id -> (seg, off, size) of result/dead letter
        self._live: dict[int, int] = {}  # segment -> records in it still needed
        # segments whose records are all dead, kept until the index records saying so are synced:
        # deleted before, a machine crash could leave answered puts with neither body nor record
        self._doomed: list[int] = []
        self._reserved = IdReservation(self.path)  # no id below it is ever assigned again
        self._chunk, self._raised_at = ID_RESERVE_CHUNK, -1.0  # see _reserve_ids
        self._rewrite_from = 0  # after a rewrite failed (a full disk): the index records before the next try
        self._lock = threading.Lock()  # between operations and the interval syncer
        self._sync_lock = threading.Lock()  # one sync at a time: a sync drops what was doomed before it began
        self._syncer: threading.Thread | None = None
        self._stop = threading.Event()
        try:
            self._recover(repair)
        except BaseException:
            self._segments.close()
            self._index.close()
            os.close(self._lock_fd)
            raise
        if fsync == "interval":
            self._syncer = threading.Thread(target=self._sync_every, args=(fsync_interval_s,),
                                            name=f"conveyor-fsync-{self.path.name}", daemon=True)  # fmt: skip
            self._syncer.start()

    # --- recovery -------------------------------------------------------------------------
    def _recover(self, repair: bool) -> None:
        scan = self._segments.open(repair)
        had_index = self._index.file.exists()
        rec = self._index.open(repair)
        if not had_index and scan.messages:
            log.warning("%s: no %s beside the segments: every message in them is READY again", self.path, INDEX_NAME)
        header = self._index.header
        st = self._state
        st.base = st.low = st.next_id = header.base
        if not header.acked_below and not header.failed_below:  # none below base was ever assigned (or all purged)
            st.first_id = header.base
        st.finished_below_base = {ST_ACKED: header.acked_below, ST_FAILED: header.failed_below}
        now = time.time()

        msgs = np.concatenate(scan.messages) if scan.messages else np.zeros(0, SCAN_DTYPE)
        msgs = msgs[msgs["id"] >= header.base]
        last = last_per_id(rec)
        # results and dead letters still kept, whatever their id
        kept = ((last["status"] == ST_ACKED) | (last["status"] == ST_FAILED)) & (last["len"] > 0)
        cols = (last[c][kept].tolist() for c in ("id", "status", "seg", "off", "len"))
        found: dict[tuple[int, int], tuple[int, int, int]] | None = None
        for i, status_, s, o, n in zip(*cols, strict=True):
            kind = KIND_RESULT if status_ == ST_ACKED else KIND_DEAD
            loc: tuple[int, int, int] | None = (s, o, n)
            if not self._segments.holds(s, o, n, kind, i):
                # the record moved (a repaired segment) or is gone: look for it by kind and id
                if found is None:
                    k = np.concatenate(scan.kept) if scan.kept else np.zeros(0, KEPT_DTYPE)
                    found = dict(zip(zip(k["kind"].tolist(), k["id"].tolist(), strict=True),
                                     zip(k["seg"].tolist(), k["off"].tolist(), k["size"].tolist(), strict=True),
                                     strict=True))  # fmt: skip
                loc = found.get((kind, i))
            if loc is not None:
                self._kept[i] = loc
            else:
                what = "result" if kind == KIND_RESULT else "dead letter"
                log.warning("%s: the %s of message %d was lost (cut off or damaged)", self.path, what, i)
        self._failed_ids.update(last["id"][last["status"] == ST_FAILED].tolist())
        st.add_gaps(r for r in gap_ranges(last) if r[0] < header.base)
        last = last[last["id"] >= header.base]

        # merge: a message body with no index record is READY as put (both id lists are sorted)
        m_ids, l_ids = msgs["id"], last["id"].astype(np.int64)
        ids = m_ids
        if len(l_ids) and not _member(l_ids, m_ids).all():
            ids = np.sort(np.concatenate([m_ids, l_ids]), kind="stable")  # radix sort: linear for ints
            ids = ids[np.r_[True, ids[1:] != ids[:-1]]]
        n = len(ids)
        in_msgs = _member(ids, m_ids)
        in_last = _member(ids, l_ids)
        status = np.full(n, ST_READY, np.uint8)
        attempts = np.zeros(n, np.uint16)
        until = np.zeros(n, np.float64)
        prio = np.zeros(n, np.int32)
        max_att = np.zeros(n, np.uint16)
        prio[in_msgs], max_att[in_msgs], until[in_msgs] = msgs["priority"], msgs["max_attempts"], msgs["not_before"]
        status[in_last], attempts[in_last], until[in_last] = last["status"], last["attempts"], last["until"]
        lost = ~in_msgs & (status != ST_ACKED) & (status != ST_FAILED) & (status != ST_NONE)
        if lost.any():
            log.warning("%s: %d messages have index records but no body (lost to repair): %s",
                        self.path, int(lost.sum()), ids[lost][:10].tolist())  # fmt: skip
            status[lost] = ST_NONE
        status[status == ST_DELAYED] = ST_READY
        idx = st.load(ids, status, prio, attempts, max_att, until, now)
        c = st.cols
        body_idx = idx[in_msgs]
        for name in ("seg", "off", "size"):
            c[name][body_idx] = msgs[name]
        # ids a put reserved before a crash stay unused: keys written for them must never name another message
        st.skip_to(max(header.next_id, scan.id_floor, st.next_id, self._reserved.upto))  # may slide the window
        self._segments.id_floor = st.next_id

        # segment liveness: unfinished message bodies plus kept results and dead letters
        unfinished = in_msgs & (status != ST_ACKED) & (status != ST_FAILED) & (status != ST_NONE)
        for s, k in zip(*np.unique(c["seg"][ids[unfinished] - st.base], return_counts=True), strict=True):
            self._live[int(s)] = self._live.get(int(s), 0) + int(k)
        for s, _, _ in self._kept.values():
            self._live[s] = self._live.get(s, 0) + 1
        with contextlib.suppress(OSError):  # room for index records, made while there is space (see make_room)
            self._index.make_room(0)
        self._compact()

    # --- writes, and what a full disk does to them -------------------------------------------
    def _disk_error(self, e: OSError, what: str) -> StoreError:
        """The store error for a failed write (which left the files as they were); a full disk gives
        up the space reserve, so that the writes that take little keep working."""
        if e.errno in DISK_FULL and self._space is not None:
            self._space.give_up()
        return store_error(e, f"{self.path}: {what}")

    def _append(self, bodies: list[bytes], what: str) -> tuple[list[int], list[int]]:
        """Append records to the segments, all or nothing (refused while the disk is full)."""
        if self._space is not None:
            self._space.check(self.path, what)
        with self._lock:
            self._segments.id_floor = max(self._state.next_id, self._reserved.upto)  # new segments say so too
            try:
                return self._segments.append(bodies)
            except OSError as e:
                raise self._disk_error(e, what) from e

    def _prepare(self, n: int) -> None:
        if not n:
            return
        with self._lock:
            for last in (False, True):
                try:
                    self._index.make_room(n)
                    return
                except OSError as e:
                    if last or e.errno not in DISK_FULL or self._space is None or self._space.given_up:
                        raise self._disk_error(e, "index") from e
                    self._space.give_up()  # what the reserve is for: try again in the room it leaves

    # --- hooks ----------------------------------------------------------------------------
    def _store_messages(self, ids: np.ndarray, payloads: Sequence[bytes], headers: Sequence[dict[str, str]] | None,
                        now: float) -> None:  # fmt: skip
        c = self._state.cols
        a = int(ids[0]) - self._state.base
        b = a + len(ids)
        pack = MESSAGE_PREFIX.pack
        cols = (ids.tolist(), c["priority"][a:b].tolist(), c["max_attempts"][a:b].tolist(), c["until"][a:b].tolist())
        if headers is None or not any(headers):
            bodies = [pack(KIND_MESSAGE, i, p, x, t, now, 0) + d for d, i, p, x, t in zip(payloads, *cols, strict=True)]
        else:
            bodies = [
                pack(KIND_MESSAGE, i, p, x, t, now, 0) + d
                if not h
                else b"".join((pack(KIND_MESSAGE, i, p, x, t, now, len(hb := _packb(h))), hb, d))
                for d, h, i, p, x, t in zip(payloads, headers, *cols, strict=True)
            ]
        segs, offs = self._append(bodies, "put")
        c["seg"][a:b] = segs
        c["off"][a:b] = offs
        c["size"][a:b] = list(map(len, bodies))
        for s, k in zip(*np.unique(c["seg"][a:b], return_counts=True), strict=True):
            self._live[int(s)] = self._live.get(int(s), 0) + int(k)

    def _reserve_ids(self, upto: int) -> None:
        """Make sure no id below `upto` can be assigned again after a crash (see `IdReservation`:
        synced whatever the fsync policy, once per ID_RESERVE_CHUNK ids). A put starts here: while
        the disk is full it is refused before anything is written."""
        if self._space is not None:
            self._space.check(self.path, "put")
        if upto > self._reserved.upto:
            now = time.monotonic()
            self._chunk = min(2 * self._chunk, ID_RESERVE_MOST) if now - self._raised_at < 1.0 else ID_RESERVE_CHUNK
            try:
                self._reserved.raise_to(upto + self._chunk)
            except OSError as e:
                raise self._disk_error(e, "ids.reserved") from e
            self._raised_at = now

    def _body(self, i: int) -> bytes:
        c, j = self._state.cols, i - self._state.base
        return self._segments.read(int(c["seg"][j]), int(c["off"][j]), int(c["size"][j]))

    def _sizes(self, ids: np.ndarray) -> np.ndarray:
        # a body holds the payload and headers behind a prefix of about the fields a reply adds per message
        return cast(np.ndarray, self._state.cols["size"][ids - self._state.base].astype(np.int64) + 16)

    def _load(self, ids: np.ndarray, lease_s: float) -> MessageBatch:
        st = self._state
        idx = ids - st.base
        c = st.cols
        seg = c["seg"][idx]
        back = None  # a log keeps few segments mapped: out of segment order (requeued messages among
        if len(seg) > 1 and (seg[1:] < seg[:-1]).any():  # newer ones), read segment by segment
            order = np.argsort(seg, kind="stable")
            idx, seg, back = idx[order], seg[order], np.argsort(order).tolist()
        at: list[float] = []
        nb: list[float] = []
        headers: list[dict[str, str]] = []
        payloads: list[bytes] = []
        mapped, unpack, unpackb = self._segments.mapped, _unpack_msg, msgpack.unpackb
        with self._lock:
            for s, o, n in zip(seg.tolist(), c["off"][idx].tolist(), c["size"][idx].tolist(), strict=True):
                mm = mapped(s, o + n)
                _, _, _, _, t_nb, t_at, hlen = unpack(mm, o)
                start = o + _MSG_PREFIX
                at.append(t_at)
                nb.append(t_nb)
                headers.append(unpackb(mm[start : start + hlen]) if hlen else {})
                payloads.append(mm[start + hlen : o + n])
        cols = [c["priority"][idx].tolist(), c["attempts"][idx].tolist(), at, nb, c["max_attempts"][idx].tolist(),
                headers, payloads]  # fmt: skip
        if back is not None:  # in the order taken
            cols = [[col[j] for j in back] for col in cols]
        return MessageBatch(self.queue, lease_s, ids.tolist(), *cols)

    def _keep_results(self, ids: np.ndarray, results: Sequence[bytes | None]) -> Any:
        has = np.fromiter((r is not None for r in results), bool, len(results))
        loc = tuple(np.zeros(len(ids), np.uint32) for _ in range(3))
        done = self._keep(ids[has], [r for r in results if r is not None], KIND_RESULT, "ack with results")
        for col, got in zip(loc, done, strict=True):
            col[has] = got
        return loc

    def _keep_dead(self, ids: np.ndarray, errors: Sequence[str], now: float) -> Any:
        attempts = self._state.cols["attempts"][ids - self._state.base].tolist()
        with self._lock:
            bodies = [_packb([e, now, a, self._body(i)]) for i, e, a in zip(ids.tolist(), errors, attempts, strict=True)]
        return self._keep(ids, bodies, KIND_DEAD, "dead letters")

    def _keep(self, ids: np.ndarray, data: list[bytes], kind: int, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Append result or dead-letter records and remember where they are."""
        bodies = [BODY_PREFIX.pack(kind, i) + d for i, d in zip(ids.tolist(), data, strict=True)]
        segs, offs = self._append(bodies, what)
        sizes = list(map(len, bodies))
        for i, s, o, n in zip(ids.tolist(), segs, offs, sizes, strict=True):
            self._kept[i] = (s, o, n)
            self._live[s] = self._live.get(s, 0) + 1
        return np.array(segs, np.uint32), np.array(offs, np.uint32), np.array(sizes, np.uint32)

    def _record(self, ids: np.ndarray, status: int, kept: Any, now: float) -> None:
        st = self._state
        idx = ids - st.base
        c = st.cols
        seg, off, size = (0, 0, 0) if kept is None else kept
        with self._lock:
            try:
                self._index.append(make_records(ids, status, c["attempts"][idx], seg, off, size, c["until"][idx]))
            except OSError as e:  # not for lack of space (_prepare made room): a failing disk
                raise self._disk_error(e, "index") from e
            if status in (ST_ACKED, ST_FAILED, ST_NONE):
                for s, k in Counter(c["seg"][idx].tolist()).items():
                    self._live[s] -= k

    def _commit(self) -> None:
        with self._lock:
            if self._sync_each:
                self._segments.sync()  # bodies before the index records that point at them
                self._index.sync()
            self._compact()

    def skip_ids(self, next_id: int) -> None:
        super().skip_ids(next_id)
        with self._lock:
            self._segments.id_floor = max(self._state.next_id, self._reserved.upto)
            try:
                self._rewrite_index()  # its header keeps the floor across restarts, messages or not
            except OSError as e:
                raise self._disk_error(e, "index") from e

    def suspend(self) -> bool:
        """Let go of every descriptor but the lock (a server holding many queues does so for the least
        used): the next read or write opens what it needs again. False (nothing done) while writes
        wait for a sync, which closing would run (on a server's event loop); under fsync="never"
        they are left to the OS."""
        with self._lock:
            if self._closed or (self.fsync != "never" and (self._segments.dirty or self._index.dirty)):
                return False
            self._segments.close(sync=False)
            self._index.close(sync=False)
            return True

    def sync(self) -> None:
        with self._sync_lock:
            with self._lock:  # only to take the descriptors: fsync runs without blocking operations
                if self._closed:
                    return
                fds = [self._segments.take_dirty(), self._index.take_dirty()]  # bodies before the index
                doomed, self._doomed = self._doomed, []
            for fd in fds:
                if fd >= 0:
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            if doomed:
                with self._lock:
                    if not self._closed:
                        for s in doomed:
                            self._segments.drop(s)

    def _sync_every(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.sync()

    # --- compaction -----------------------------------------------------------------------
    def _compact(self) -> None:
        segs = self._segments
        at_once = self.fsync == "never" or self._sync_each  # else: at the next sync (see _doomed)
        for s in [s for s, k in self._live.items() if k <= 0]:
            if s != segs.active or segs.sizes.get(s, 0) >= segs.segment_bytes // 4:
                if s == segs.active:
                    try:
                        segs.roll()  # no more records go to a segment about to be deleted
                    except OSError as e:  # a full disk: it stays the active one for now
                        log.warning("%s: no new segment could be started (%s)", self.path, e)
                        continue
                del self._live[s]
                if at_once:
                    segs.drop(s)
                else:
                    self._doomed.append(s)
        for s in [s for s in segs.sizes if s not in self._live and s != segs.active and s not in self._doomed]:
            segs.drop(s)  # segments holding only padding or superseded records (found so on opening)
        st = self._state
        # records a rewrite would keep, or more (an overestimate only delays a rewrite)
        live = st.next_id - st.advance_low() + len(self._kept) + len(self._failed_ids) + len(st.gaps)
        n = self._index.records
        if n >= max(INDEX_REWRITE_MIN_RECORDS, self._rewrite_from) and n > INDEX_REWRITE_RATIO * live:
            try:
                self._rewrite_index()
            except OSError as e:  # a full disk: the old index stays, whole; tried again once it has grown
                self._rewrite_from = n + INDEX_REWRITE_MIN_RECORDS
                log.warning("%s: the index could not be rewritten (%s); it stays as it is", self.path, e)

    def _rewrite_index(self) -> None:
        """Replace the index by one record per id that still matters."""
        st = self._state
        low = st.advance_low()
        c = st.cols
        a, b = low - st.base, st.next_id - st.base
        status = st.status[a:b]
        acked, failed = (st.finished_below_base[s] + int(np.count_nonzero(st.status[:a] == s)) for s in (ST_ACKED, ST_FAILED))
        header = Header(low, max(st.next_id, self._reserved.upto), acked, failed)
        # fresh READY messages need no record: their body says all; a purged one (ST_NONE with a
        # body) needs its record, or its body would make it READY again on reopening
        purged = (status == ST_NONE) & (c["size"][a:b] > 0)
        need = purged | ((status != ST_NONE) & ((status != ST_READY) | (c["attempts"][a:b] > 0)))
        ids = np.flatnonzero(need) + low
        kept_below = sorted({i for i in self._kept if i < low} | {i for i in self._failed_ids if i < low})
        ids = np.concatenate([np.array(kept_below, np.int64), ids])
        idx, inside = st.index(ids)
        stat = np.where(inside, st.status[idx], ST_ACKED).astype(np.uint8)
        for i, k in enumerate(kept_below):
            if k in self._failed_ids:
                stat[i] = ST_FAILED
        stat[stat == ST_DELAYED] = ST_READY
        loc = [self._kept.get(i, (0, 0, 0)) for i in ids.tolist()]
        seg, off, size = (np.fromiter((x[j] for x in loc), np.uint32, len(loc)) for j in range(3))
        attempts = np.where(inside, c["attempts"][idx], 0)
        until = np.where(inside, c["until"][idx], 0.0)
        gaps = make_gap_records(st.gaps_below(low))  # so that ids below the new base still read as absent
        self._index.rewrite(header, gaps + make_records(ids, stat, attempts, seg, off, size, until))

    # --- results and dead letters ---------------------------------------------------------
    def result(self, msg_id: int) -> bytes | None:
        self._check_open()
        loc = self._kept.get(msg_id)
        if loc is None or msg_id in self._failed_ids:
            return None
        s, o, n = loc
        with self._lock:
            return self._segments.read(s, o + BODY_PREFIX.size, n - BODY_PREFIX.size)

    def _kept_ids(self, dead: bool) -> Iterable[int]:
        failed = self._failed_ids
        return [i for i in self._kept if (i in failed) is dead]

    def _dead_letter(self, msg_id: int) -> DeadLetter:
        s, o, n = self._kept[msg_id]
        with self._lock:
            raw = self._segments.read(s, o + BODY_PREFIX.size, n - BODY_PREFIX.size)
        error, failed_at, attempts, body = msgpack.unpackb(raw, raw=False)
        return DeadLetter(_parse(body, 0, len(body), self.queue, attempts, 0.0), error, failed_at)

    def _forget(self, ids: list[int]) -> int:
        gone = [i for i in dict.fromkeys(ids) if i in self._kept]
        if not gone:
            return 0
        arr = np.array(gone, np.int64)
        stat = np.array([ST_FAILED if i in self._failed_ids else ST_ACKED for i in gone], np.uint8)
        with self._lock:
            try:
                self._index.append(make_records(arr, stat, np.zeros(len(arr), np.uint16), 0, 0, 0, 0.0))
            except OSError as e:
                raise self._disk_error(e, "index") from e
            for i in gone:
                s, _, _ = self._kept.pop(i)
                self._live[s] -= 1
        return len(gone)

    # --- the rest -------------------------------------------------------------------------
    def _bytes_on_disk(self) -> int:
        return self._segments.bytes_on_disk() + self._index.bytes_on_disk()

    def _close(self) -> None:
        self._stop.set()
        with self._lock:
            self._segments.close()
            self._index.close()
        if self._syncer is not None:
            self._syncer.join()
        os.close(self._lock_fd)
