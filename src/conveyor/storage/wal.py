"""The index write-ahead log of a durable store: fixed-size status records behind a header.

Each state change of a message appends one `INDEX_RECORD`; on opening, the last record of each
id wins. Records are parsed as one numpy array, so replaying millions takes a fraction of a
second. When most records are superseded, the log is rewritten to hold one record per id that
still matters: new file, fsync, rename over the old one, fsync the directory.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from conveyor.constants import (
    INDEX_DTYPE,
    INDEX_FLAG_GAP,
    INDEX_HEADER,
    INDEX_MAGIC,
    INDEX_NAME,
    INDEX_RECORD,
    INDEX_VERSION,
    ST_NONE,
)
from conveyor.errors import CorruptStoreError
from conveyor.storage.files import keep_aside, preallocate, unallocate, write_all, write_atomically

log = logging.getLogger("conveyor.storage")

_REC = INDEX_RECORD.size
ROOM_BYTES = 64 * 1024  # blocks allocated ahead of the records written (see IndexLog.make_room)


@dataclass
class Header:
    """Base id (ids below are finished), next id, and how many of the ids below base were acked/failed."""

    base: int = 1
    next_id: int = 1
    acked_below: int = 0
    failed_below: int = 0

    def pack(self) -> bytes:
        fields = (INDEX_MAGIC, INDEX_VERSION, self.base, self.next_id, self.acked_below, self.failed_below)
        head = INDEX_HEADER.pack(*fields, 0)
        return INDEX_HEADER.pack(*fields, zlib.crc32(head[: INDEX_HEADER.size - 4]))


def make_records(
    ids: np.ndarray,
    status: int | np.ndarray,
    attempts: np.ndarray,
    seg: np.ndarray | int,
    off: np.ndarray | int,
    length: np.ndarray | int,
    until: np.ndarray | float,
) -> bytes:
    """Encode records (one per id) with their CRCs."""
    rec = np.zeros(len(ids), INDEX_DTYPE)
    rec["ts"] = time.time()
    rec["id"] = ids
    rec["status"] = status
    rec["attempts"] = attempts
    rec["seg"] = seg
    rec["off"] = off
    rec["len"] = length
    rec["until"] = until
    return _sealed(rec)


def make_gap_records(ranges: list[tuple[int, int]]) -> bytes:
    """Encode [start, end) ranges of absent ids as gap records (see INDEX_FLAG_GAP)."""
    most = np.iinfo(np.uint32).max
    pieces = [(a, min(end - a, most)) for start, end in ranges for a in range(start, end, most)]
    rec = np.zeros(len(pieces), INDEX_DTYPE)
    rec["ts"] = time.time()
    rec["id"] = [a for a, _ in pieces]
    rec["len"] = [n for _, n in pieces]
    rec["status"] = ST_NONE
    rec["flags"] = INDEX_FLAG_GAP
    return _sealed(rec)


def gap_ranges(last: np.ndarray) -> list[tuple[int, int]]:
    """The ranges that gap records among `last` (one record per id, in id order) describe."""
    gaps = last[(last["flags"] & INDEX_FLAG_GAP) != 0]
    return [(a, a + n) for a, n in zip(gaps["id"].tolist(), gaps["len"].tolist(), strict=True)]


def _sealed(rec: np.ndarray) -> bytes:
    raw = rec.view(np.uint8).reshape(len(rec), _REC)
    crc32 = zlib.crc32
    rec["crc"] = [crc32(row) for row in raw[:, 4:]]
    return rec.tobytes()


class IndexLog:
    """Append-only status records, replayed into numpy arrays on open."""

    def __init__(self, path: Path) -> None:
        self.file = path / INDEX_NAME
        self.header = Header()
        self.records = 0
        self.dirty = False
        self._fd = -1
        self._allocated = 0  # the file's blocks are allocated up to here (beyond its end: see make_room)
        self._can_allocate = True

    def open(self, repair: bool) -> np.ndarray:
        """Read the log; returns its valid records, oldest first. Creates the file if missing."""
        if not self.file.exists():
            self._create(Header(), b"")
            return np.zeros(0, INDEX_DTYPE)
        data = self.file.read_bytes()
        hs = INDEX_HEADER.size
        if len(data) < hs:
            if not repair:
                raise CorruptStoreError(str(self.file), 0, "shorter than the index header")
            self._move_aside(len(data) // _REC, [])
            self._create(Header(), b"")
            return np.zeros(0, INDEX_DTYPE)
        magic, version, base, next_id, acked, failed, crc = INDEX_HEADER.unpack_from(data, 0)
        header_ok = magic == INDEX_MAGIC and version == INDEX_VERSION and crc == zlib.crc32(data[: hs - 4])
        if not header_ok and not repair:
            raise CorruptStoreError(str(self.file), 0, "bad index header (magic, version or CRC)")
        # a lost header forgets which ids were finished: finished messages whose segments still
        # exist may be delivered again (at-least-once), but nothing is lost
        self.header = Header(base, next_id, acked, failed) if header_ok else Header()
        body = len(data) - hs
        whole = body // _REC
        rec: np.ndarray = np.frombuffer(data, INDEX_DTYPE, whole, hs)
        raw = np.frombuffer(data, np.uint8, whole * _REC, hs).reshape(whole, _REC)
        crc32 = zlib.crc32
        computed = np.fromiter((crc32(row) for row in raw[:, 4:]), np.uint32, whole)
        good = computed == rec["crc"]
        keep = whole * _REC + hs  # bytes to keep: up to the last valid record
        if not header_ok:
            self._move_aside(len(good) - int(good.sum()), [])
            rec = rec[good]
            self._create(self.header, rec.tobytes())
            self.records = len(rec)
            return rec.copy()
        if not good.all():
            bad = np.flatnonzero(~good)
            valid_after = np.flatnonzero(good[bad[0] :])
            if len(valid_after) == 0:  # nothing valid after the first bad record: a torn tail
                keep = hs + int(bad[0]) * _REC
                log.warning("%s: torn tail at offset %d: cut off %d bytes", self.file, keep, len(data) - keep)
                rec = rec[: int(bad[0])]
            elif not repair:
                raise CorruptStoreError(str(self.file), hs + int(bad[0]) * _REC, "index record fails its CRC check")
            else:
                self._move_aside(len(bad), [hs + int(i) * _REC for i in bad[:10]])
                rec = rec[good]
                self._create(self.header, rec.tobytes())
                self.records = len(rec)
                return rec.copy()
        elif body % _REC:
            log.warning("%s: torn tail at offset %d: cut off %d bytes", self.file, keep, len(data) - keep)
        if keep != len(data):
            os.truncate(self.file, keep)
        self.records = len(rec)
        return rec.copy()

    def _move_aside(self, n_bad: int, offsets: list[int]) -> None:
        aside = keep_aside(self.file)
        log.warning(
            "%s: damaged index header or records (%d records dropped, at offsets %s); original kept as %s",
            self.file,
            n_bad,
            offsets,
            aside.name,
        )

    def _create(self, header: Header, records: bytes) -> None:
        """Write a complete new log atomically."""
        write_atomically(self.file, header.pack(), records)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._allocated = 0
        self.header = header
        self.dirty = False

    def make_room(self, n: int) -> None:
        """Make sure the next `n` records can be appended even when the disk fills meanwhile: their blocks are allocated now.

        Raises OSError (ENOSPC) when they cannot be. A store calls it before it changes anything, so
        that a full disk refuses an operation whole instead of failing it halfway. While there is
        space, it keeps ROOM_BYTES allocated ahead (topped up when half is used: rarely a system
        call), so that records still go in for a while once the disk is full, whoever took the last
        of it.
        """
        fd = self._out()  # opened now if need be: a failure to open, too, comes before any change
        size = self.bytes_on_disk()
        end = size + n * _REC
        if end + ROOM_BYTES // 2 <= self._allocated or not self._can_allocate:
            return
        start = max(size, self._allocated)
        try:
            done = preallocate(fd, start, end + ROOM_BYTES - start)
            ahead = ROOM_BYTES
        except OSError:
            if end <= self._allocated:  # what is allocated serves this one: no more for now
                return
            done = preallocate(fd, start, end - start)  # no room to spare: just what is needed
            ahead = 0
        if not done:  # the file system cannot: appends take their chances
            self._can_allocate = False
            return
        self._allocated = end + ahead

    def append(self, data: bytes) -> None:
        """Append whole records, or nothing (the file is cut back if a write fails)."""
        # the cut is not synced: the index must not reach the disk before its segments (and after
        # make_room an append fails only on a failing disk)
        write_all(self._out(), data, self.bytes_on_disk(), sync_cut=False)
        self.records += len(data) // _REC
        self.dirty = True

    def _out(self) -> int:
        """The log's descriptor, opened again if `close` let go of it."""
        if self._fd < 0:
            self._fd = os.open(self.file, os.O_WRONLY | os.O_APPEND)
        return self._fd

    def rewrite(self, header: Header, records: bytes) -> None:
        self._create(header, records)
        self.records = len(records) // _REC

    def sync(self) -> None:
        if self.dirty and self._fd >= 0:
            self.dirty = False
            os.fsync(self._fd)

    def take_dirty(self) -> int:
        """A duplicate of the log's descriptor if it has unsynced writes, else -1 (see SegmentLog)."""
        if not self.dirty or self._fd < 0:
            return -1
        self.dirty = False
        return os.dup(self._fd)

    def bytes_on_disk(self) -> int:
        return INDEX_HEADER.size + self.records * _REC

    def close(self, sync: bool = True) -> None:
        """Sync (unless told not to) and let go of the descriptor; a later append opens it again.

        Sync (unless told not to) and let go of the descriptor (and the room allocated ahead); a later
        append opens it again.
        """
        if self._fd >= 0:
            if sync:
                self.sync()
            size = self.bytes_on_disk()
            unallocate(self._fd, size, self._allocated - size)
            os.close(self._fd)
            self._fd = -1
            self._allocated = 0


def last_per_id(rec: np.ndarray) -> np.ndarray:
    """The last record of each id, in id order."""
    if not len(rec):
        return rec
    rev = rec[::-1]
    _, first = np.unique(rev["id"], return_index=True)
    return rev[first]
