"""The index write-ahead log of a durable store: fixed-size status records behind a header.

Each state change of a message appends one `INDEX_RECORD`; on opening, the last record of each
id wins. Records are read and written a field at a time (`Records`, through
`conveyor.storage.columns`), so replaying millions takes a fraction of a second: the one step per
record is its CRC. When most records are superseded, the log is rewritten to hold one record per
id that still matters: new file, fsync, rename over the old one, fsync the directory.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, fields
from itertools import compress
from operator import eq
from pathlib import Path
from typing import Any

from conveyor.constants import (
    INDEX_FIELDS,
    INDEX_FLAG_GAP,
    INDEX_HEADER,
    INDEX_MAGIC,
    INDEX_NAME,
    INDEX_RECORD,
    INDEX_VERSION,
    ST_NONE,
)
from conveyor.errors import CorruptStoreError
from conveyor.storage.columns import column, column_bytes, layout, pack_column, table
from conveyor.storage.files import keep_aside, preallocate, unallocate, write_all, write_atomically

log = logging.getLogger("conveyor.storage")

_REC = INDEX_RECORD.size
_F = layout(INDEX_RECORD, INDEX_FIELDS)
assert _F["crc"].offset == 0  # a record's CRC comes first, and covers the rest of it
_SEALED = struct.Struct(f"<{_F['crc'].size}x{_REC - _F['crc'].size}s")  # what a record's CRC covers
_IS_GAP = table([f for f in range(256) if f & INDEX_FLAG_GAP])
_MOST = 2**32 - 1  # a gap record's length field holds at most this many ids
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


@dataclass
class Records:
    """Index records as columns, one entry per record (the fields that replaying them reads)."""

    id: array[int]
    status: bytes
    flags: bytes
    attempts: array[int]
    seg: array[int]
    off: array[int]
    len: array[int]
    until: array[float]

    @classmethod
    def read(cls, buf: bytes | bytearray, n: int, start: int = 0) -> Records:
        """The `n` records at `buf[start:]`."""
        return cls(
            column(buf, n, _REC, _F["id"], start),
            column_bytes(buf, n, _REC, _F["status"], start),
            column_bytes(buf, n, _REC, _F["flags"], start),
            column(buf, n, _REC, _F["attempts"], start),
            column(buf, n, _REC, _F["seg"], start),
            column(buf, n, _REC, _F["off"], start),
            column(buf, n, _REC, _F["len"], start),
            column(buf, n, _REC, _F["until"], start),
        )

    def __len__(self) -> int:
        return len(self.id)

    def _columns(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self)]

    def select(self, mask: bytes) -> Records:
        """The records where `mask` (a byte a record) is set, in order."""
        return Records(*(_like(c, compress(c, mask)) for c in self._columns()))


def _like(col: Any, values: Any) -> Any:
    """`values` as a column of the same type as `col` (an array, or bytes)."""
    return array(col.typecode, values) if isinstance(col, array) else bytes(values)


def make_records(
    ids: Sequence[int],
    status: int | Sequence[int],
    attempts: int | Sequence[int],
    seg: int | Sequence[int],
    off: int | Sequence[int],
    length: int | Sequence[int],
    until: float | Sequence[float],
) -> bytes:
    """Encode records (one per id; a value given once is every record's) with their CRCs."""
    n = len(ids)
    given = {"id": ids, "status": status, "attempts": attempts, "seg": seg, "off": off, "len": length, "until": until}
    once = {k: v for k, v in given.items() if not isinstance(v, Sequence)}
    many = {k: v for k, v in given.items() if isinstance(v, Sequence)}
    for k, v in list(many.items()):
        if len(v) and v.count(v[0]) == len(v):  # one value for all after all: in the template
            once[k] = many.pop(k)[0]
    return _sealed(n, once, many)


def make_gap_records(ranges: list[tuple[int, int]]) -> bytes:
    """Encode [start, end) ranges of absent ids as gap records (see INDEX_FLAG_GAP)."""
    pieces = [(a, min(end - a, _MOST)) for start, end in ranges for a in range(start, end, _MOST)]
    ids = [a for a, _ in pieces]
    return _sealed(len(pieces), {"status": ST_NONE, "flags": INDEX_FLAG_GAP}, {"id": ids, "len": [k for _, k in pieces]})


def gap_ranges(rec: Records) -> list[tuple[int, int]]:
    """The ranges that the gap records among `rec` describe."""
    gap = rec.flags.translate(_IS_GAP)
    if 1 not in gap:
        return []
    return [(a, a + k) for a, k in zip(compress(rec.id, gap), compress(rec.len, gap), strict=True)]


def _sealed(n: int, once: dict[str, Any], many: dict[str, Sequence[Any]]) -> bytes:
    """`n` records: the fields in `once` the same in each, those in `many` one value a record; then their CRCs."""
    values: dict[str, Any] = dict.fromkeys(INDEX_FIELDS, 0)
    values.update(ts=time.time(), **once)
    out = bytearray(INDEX_RECORD.pack(*values.values())) * n
    for name, col in many.items():
        pack_column(out, _REC, _F[name], col)
    crc32 = zlib.crc32
    pack_column(out, _REC, _F["crc"], [crc32(rest) for (rest,) in _SEALED.iter_unpack(out)])
    return bytes(out)


class IndexLog:
    """Append-only status records, replayed as columns on open."""

    def __init__(self, path: Path) -> None:
        self.file = path / INDEX_NAME
        self.header = Header()
        self.records = 0
        self.dirty = False
        self._fd = -1
        self._allocated = 0  # the file's blocks are allocated up to here (beyond its end: see make_room)
        self._can_allocate = True

    def open(self, repair: bool) -> Records:
        """Read the log; returns its valid records, oldest first. Creates the file if missing."""
        if not self.file.exists():
            self._create(Header(), b"")
            return Records.read(b"", 0)
        data = self.file.read_bytes()
        hs = INDEX_HEADER.size
        if len(data) < hs:
            if not repair:
                raise CorruptStoreError(str(self.file), 0, "shorter than the index header")
            self._move_aside(len(data) // _REC, [])
            self._create(Header(), b"")
            return Records.read(b"", 0)
        magic, version, base, next_id, acked, failed, crc = INDEX_HEADER.unpack_from(data, 0)
        header_ok = magic == INDEX_MAGIC and version == INDEX_VERSION and crc == zlib.crc32(data[: hs - 4])
        if not header_ok and not repair:
            raise CorruptStoreError(str(self.file), 0, "bad index header (magic, version or CRC)")
        # a lost header forgets which ids were finished: finished messages whose segments still
        # exist may be delivered again (at-least-once), but nothing is lost
        self.header = Header(base, next_id, acked, failed) if header_ok else Header()
        body = len(data) - hs
        whole = body // _REC
        crc32 = zlib.crc32
        computed = array("I", [crc32(rest) for (rest,) in _SEALED.iter_unpack(memoryview(data)[hs : hs + whole * _REC])])
        stored = column(data, whole, _REC, _F["crc"], hs)
        good = None if computed == stored else bytes(map(eq, computed, stored))  # None: all of them
        keep = whole * _REC + hs  # bytes to keep: up to the last valid record
        if good is not None:
            first_bad = good.index(0)
            if not header_ok or (1 in good[first_bad:] and repair):
                bad = [k for k in range(whole) if not good[k]]
                self._move_aside(len(bad), [hs + k * _REC for k in bad[:10]] if header_ok else [])
                return self._rewritten(b"".join(compress(_split(data[hs:keep]), good)))
            if 1 in good[first_bad:]:
                raise CorruptStoreError(str(self.file), hs + first_bad * _REC, "index record fails its CRC check")
            # nothing valid after the first bad record: a torn tail
            keep = hs + first_bad * _REC
            log.warning("%s: torn tail at offset %d: cut off %d bytes", self.file, keep, len(data) - keep)
        elif not header_ok:
            self._move_aside(0, [])
            return self._rewritten(data[hs:keep])
        elif body % _REC:
            log.warning("%s: torn tail at offset %d: cut off %d bytes", self.file, keep, len(data) - keep)
        if keep != len(data):
            os.truncate(self.file, keep)
        self.records = (keep - hs) // _REC
        return Records.read(data, self.records, hs)

    def _rewritten(self, records: bytes) -> Records:
        """Write the log anew with these records (the header kept), and return them."""
        self._create(self.header, records)
        self.records = len(records) // _REC
        return Records.read(records, self.records)

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


def _split(raw: bytes) -> list[bytes]:
    """Whole records, each its bytes."""
    return [raw[k : k + _REC] for k in range(0, len(raw), _REC)]
