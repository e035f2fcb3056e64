"""DurableStore: a queue store on disk that survives crashes of its process and of the machine.

Layout (see constants): message bodies, results and dead letters are records in append-only
segment files; every state change after a put is a fixed-size record in the index WAL. Opening
replays both into a `QueueState`. A segment is deleted once nothing in it is needed, and not
before the index records that say so are synced; the index is rewritten once it is mostly
superseded records. Opening is in `recovery`, what compaction deletes and rewrites in
`compaction`, the encoding of record bodies in `bodies` (all in `conveyor.storage`).

fsync policies, and what a crash can lose (a crash of the *process* alone loses nothing that
an operation returned: every write reaches the OS before the call returns):
- "batch": every operation is on disk before it returns. A machine crash loses nothing returned.
- "interval": a background thread syncs every `fsync_interval_s` (default 0.2 s). A machine crash
  loses at most the operations of the last interval (puts vanish, acks are redone).
- "never": the OS writes back when it likes (typically within ~30 s on Linux).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import compress
from pathlib import Path
from typing import Any, Literal

from conveyor.constants import (
    BODY_PREFIX,
    DEFAULT_FSYNC_INTERVAL_S,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_SEGMENT_BYTES,
    INDEX_REWRITE_MIN_RECORDS,
    INDEX_REWRITE_RATIO,
    KIND_DEAD,
    KIND_RESULT,
    MAX_SEGMENT_BYTES,
    ST_ACKED,
    ST_FAILED,
    ST_NONE,
)
from conveyor.errors import StoreError
from conveyor.message import DeadLetter, MessageBatch
from conveyor.storage.base import Store
from conveyor.storage.bodies import dead_letter_bodies, message_bodies, parse_dead_letter, read_messages
from conveyor.storage.columns import gather, where
from conveyor.storage.compaction import drop_dead_segments, index_snapshot
from conveyor.storage.files import DISK_FULL, lock_dir, store_error
from conveyor.storage.losses import Loss, lost_dead_letters, mark_failed
from conveyor.storage.recovery import recover
from conveyor.storage.reservation import IdReservation, past_lost
from conveyor.storage.segments import SegmentLog
from conveyor.storage.space import SpaceReserve
from conveyor.storage.wal import IndexLog, make_records

log = logging.getLogger("conveyor.storage")

FsyncPolicy = Literal["batch", "interval", "never"]


class DurableStore(Store):
    """A queue store in a directory: crash-safe, compacting, and compact in memory."""

    def __init__(
        self,
        path: str | Path,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync: FsyncPolicy = "batch",
        fsync_interval_s: float = DEFAULT_FSYNC_INTERVAL_S,
        repair: bool = False,
        queue: str = "",
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        lease_s: float = DEFAULT_LEASE_S,
        group_commit: bool = False,
        space: SpaceReserve | None = None,
    ) -> None:
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
        super().__init__(queue, max_attempts, lease_s, {"seg": "I", "off": "I", "size": "I"})
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_dir(self.path)
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
        self._reservation_lost = False  # it could not be read on opening (see keep_ids_past)
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
            self._syncer = threading.Thread(
                target=self._sync_every, args=(fsync_interval_s,), name=f"conveyor-fsync-{self.path.name}", daemon=True
            )
            self._syncer.start()

    # --- recovery -------------------------------------------------------------------------
    def _recover(self, repair: bool) -> None:
        found = recover(self.path, self._segments, self._index, self._state, self._reserved, repair)
        self._kept, self._live = found.kept, found.live
        self._failed_ids.update(found.failed)
        self._reservation_lost = found.reservation_lost
        if found.reservation_lost or self._reserved.torn:  # whole again: the next opening is quiet
            self._reserved.rewrite(self._state.next_id)
        if found.losses:
            self._fail_lost(found.losses)
        with contextlib.suppress(OSError):  # room for index records, made while there is space (see make_room)
            self._index.make_room(0)
        self._compact()

    def _fail_lost(self, losses: list[Loss]) -> None:
        """Make each id a repair could not keep FAILED, with a dead letter saying why.

        Make each id a repair could not keep FAILED, with a dead letter saying why, on disk before
        the store serves (whatever the fsync policy): the next opening finds nothing missing.
        """
        ids, attempts, bodies = lost_dead_letters(self._state, losses, self._segments.read, self.clock())
        self._prepare(len(ids))
        segs, offs, sizes = self._keep(ids, bodies, KIND_DEAD, "repair")
        self._index.append(make_records(ids, ST_FAILED, attempts, segs, offs, sizes, 0.0))
        mark_failed(self._state, ids, self._failed_ids)
        self._failed_ids.update(ids)
        self._segments.sync()  # bodies before the index records that point at them
        self._index.sync()

    def keep_ids_past(self, highest: int) -> None:
        """Never assign ids up to `highest`, which the owner's own files name.

        Never assign ids up to `highest`, which the owner's own files name (a server's idempotency
        keys, written before their messages); when the reservation could not be read, start past
        them as `conveyor.storage.reservation.past_lost` says.
        """
        start = past_lost(highest + 1) if self._reservation_lost else highest + 1
        if start > self.next_id:
            self.skip_ids(start)

    # --- writes, and what a full disk does to them -------------------------------------------
    def _disk_error(self, e: OSError, what: str) -> StoreError:
        """The store error for a failed write (which left the files as they were).

        The store error for a failed write (which left the files as they were); a full disk gives up
        the space reserve, so that the writes that take little keep working.
        """
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
    def _store_messages(
        self, ids: Sequence[int], payloads: Sequence[bytes], headers: Sequence[dict[str, str]] | None, now: float
    ) -> None:
        st = self._state
        c = st.cols
        a = ids[0] - st.base
        b = a + len(ids)
        bodies = message_bodies(ids, st.priority[a:b], st.max_attempts[a:b], st.until[a:b], payloads, headers, now)
        segs, offs = self._append(bodies, "put")
        c["seg"][a:b] = array("I", segs)
        c["off"][a:b] = array("I", offs)
        c["size"][a:b] = array("I", map(len, bodies))
        self._count_live(segs, 1)

    def _count_live(self, segs: Sequence[int], by: int) -> None:
        """Count records in these segments (one per entry) as needed (`by` 1) or no longer (-1)."""
        live = self._live
        if segs and segs.count(segs[0]) == len(segs):  # a batch's records mostly share one segment
            live[segs[0]] = live.get(segs[0], 0) + by * len(segs)
        else:
            for s, k in Counter(segs).items():
                live[s] = live.get(s, 0) + by * k

    def _reserve_ids(self, upto: int) -> None:
        """Make sure no id below `upto` can be assigned again after a crash.

        Make sure no id below `upto` can be assigned again after a crash (see `IdReservation.cover`:
        synced whatever the fsync policy, once per ID_RESERVE_CHUNK ids). A put starts here: while
        the disk is full it is refused before anything is written.
        """
        if self._space is not None:
            self._space.check(self.path, "put")
        self._cover(upto, ahead=True)

    def _cover(self, upto: int, ahead: bool) -> None:
        try:
            self._reserved.cover(upto, ahead)
        except OSError as e:
            raise self._disk_error(e, "ids.reserved") from e

    def _body(self, i: int) -> bytes:
        c, j = self._state.cols, i - self._state.base
        return self._segments.read(c["seg"][j], c["off"][j], c["size"][j])

    def _sizes(self, ids: Sequence[int]) -> Sequence[int]:
        # a body holds the payload and headers behind a prefix of about the fields a reply adds per message
        return list(map((16).__add__, gather(self._state.cols["size"], where(ids, self._state.base))))

    def _load(self, ids: Sequence[int], lease_s: float) -> MessageBatch:
        st = self._state
        at = where(ids, st.base)
        c = st.cols
        seg = gather(c["seg"], at)
        back = None  # a log keeps few segments mapped: out of segment order (requeued messages among
        if seg != sorted(seg):  # newer ones), read segment by segment
            order = sorted(range(len(seg)), key=seg.__getitem__)
            at, seg = [at[k] for k in order], [seg[k] for k in order]
            back = sorted(range(len(order)), key=order.__getitem__)
        with self._lock:
            enqueued, nb, headers, payloads = read_messages(
                self._segments.mapped, seg, gather(c["off"], at), gather(c["size"], at)
            )
        cols: list[list[Any]] = [
            gather(st.priority, at),
            gather(st.attempts, at),
            enqueued,
            nb,
            gather(st.max_attempts, at),
            headers,
            payloads,
        ]
        if back is not None:  # in the order taken
            cols = [[col[j] for j in back] for col in cols]
        return MessageBatch(self.queue, lease_s, list(ids), *cols)

    def _keep_results(self, ids: Sequence[int], results: Sequence[bytes | None]) -> Any:
        has = [r is not None for r in results]
        got = self._keep(list(compress(ids, has)), [r for r in results if r is not None], KIND_RESULT, "ack with results")
        if all(has):
            return got
        loc: tuple[list[int], list[int], list[int]] = ([0] * len(ids), [0] * len(ids), [0] * len(ids))
        for col, values in zip(loc, got, strict=True):
            for k, v in zip(compress(range(len(ids)), has), values, strict=True):
                col[k] = v
        return loc

    def _keep_dead(self, ids: Sequence[int], errors: Sequence[str], now: float) -> Any:
        attempts = gather(self._state.attempts, where(ids, self._state.base))
        with self._lock:
            bodies = dead_letter_bodies(errors, now, attempts, [self._body(i) for i in ids])
        return self._keep(ids, bodies, KIND_DEAD, "dead letters")

    def _keep(self, ids: Sequence[int], data: list[bytes], kind: int, what: str) -> tuple[list[int], list[int], list[int]]:
        """Append result or dead-letter records and remember where they are."""
        bodies = [BODY_PREFIX.pack(kind, i) + d for i, d in zip(ids, data, strict=True)]
        segs, offs = self._append(bodies, what)
        sizes = list(map(len, bodies))
        self._kept.update(zip(ids, zip(segs, offs, sizes, strict=True), strict=True))
        self._count_live(segs, 1)
        return segs, offs, sizes

    def _record(self, ids: Sequence[int], status: int, kept: Any, now: float) -> None:
        st = self._state
        at = where(ids, st.base)
        seg, off, size = (0, 0, 0) if kept is None else kept
        with self._lock:
            try:
                self._index.append(make_records(ids, status, gather(st.attempts, at), seg, off, size, gather(st.until, at)))
            except OSError as e:  # not for lack of space (_prepare made room): a failing disk
                raise self._disk_error(e, "index") from e
            if status in (ST_ACKED, ST_FAILED, ST_NONE):
                self._count_live(gather(st.cols["seg"], at), -1)

    def _commit(self) -> None:
        with self._lock:
            if self._sync_each:
                self._segments.sync()  # bodies before the index records that point at them
                self._index.sync()
            self._compact()

    def skip_ids(self, next_id: int) -> None:
        super().skip_ids(next_id)
        self._cover(self._state.next_id, ahead=False)  # the file says so too: a store with ids has one
        with self._lock:
            self._segments.id_floor = max(self._state.next_id, self._reserved.upto)
            try:
                self._rewrite_index()  # its header keeps the floor across restarts, messages or not
            except OSError as e:
                raise self._disk_error(e, "index") from e

    def suspend(self) -> bool:
        """Let go of every descriptor but the lock, until the next read or write.

        Let go of every descriptor but the lock: the next read or write opens what it needs again.
        False (nothing done) while writes wait for a sync, which closing would run (on a server's
        event loop); under fsync="never" they are left to the OS.
        """
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
        """Delete dead segments; rewrite the index once it is mostly superseded records.

        Delete dead segments; rewrite the index once it is mostly superseded records (the thresholds
        are read from this module's globals, so that a test can lower them).
        """
        at_once = self.fsync == "never" or self._sync_each  # else: at the next sync (see _doomed)
        drop_dead_segments(self.path, self._segments, self._live, self._doomed, at_once)
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
        """Replace the index by one record per id that still matters.

        The new index is synced at once, so the segments its records point into are synced first
        (bodies before the records that point at them, as in a sync; but for fsync="never"): else a
        machine crash could leave it confirming messages whose bodies never reached the disk, and
        opening would refuse it as cut short.
        """
        if self.fsync != "never":
            self._segments.sync(always=True)
        self._index.rewrite(*index_snapshot(self._state, self._kept, self._failed_ids, self._reserved.upto))

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
        return parse_dead_letter(raw, self.queue)

    def _forget(self, ids: list[int]) -> int:
        gone = [i for i in dict.fromkeys(ids) if i in self._kept]
        if not gone:
            return 0
        stat = [ST_FAILED if i in self._failed_ids else ST_ACKED for i in gone]
        with self._lock:
            try:
                self._index.append(make_records(gone, stat, 0, 0, 0, 0, 0.0))
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
