"""The record log of a durable store: numbered append-only segment files, read through mmap.

A record is `crc32(body) | size | body | footer`; the body starts with its kind and message id.
Opening verifies every record. A bad record with nothing valid after it in the newest segment is
a torn tail (a crash mid-write): it is cut off with a warning. Any other bad record raises
CorruptStoreError naming the file and offset, unless `repair=True`: then each damaged span is
overwritten in place by a padding record (no room for a copy is needed), so every intact record
keeps its offset; the damaged bytes are kept first, at their offsets, in a sparse file beside it.
An append is whole or absent: a failed write is cut back, across segment rolls too.
"""

from __future__ import annotations

import logging
import mmap
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from conveyor.constants import (
    BODY_PREFIX,
    KIND_DEAD,
    KIND_MESSAGE,
    KIND_PAD,
    KIND_RESULT,
    MESSAGE_PREFIX_DTYPE,
    RECORD_END,
    RECORD_FOOT,
    RECORD_HEAD,
    RECORD_OVERHEAD,
    SEGMENT_GLOB,
    SEGMENT_HEADER,
    SEGMENT_MAGIC,
    SEGMENT_NAME,
    SEGMENT_VERSION,
)
from conveyor.errors import CorruptStoreError
from conveyor.storage.files import aside_name, fsync_dir, keep_aside, write_all

log = logging.getLogger("conveyor.storage")

_HEAD = RECORD_HEAD.size
_FOOT_BYTES = RECORD_FOOT.pack(RECORD_END)
_MIN_RECORD = RECORD_OVERHEAD + BODY_PREFIX.size


# what a recovery scan reports per message record
SCAN_DTYPE = np.dtype([("id", "<i8"), ("seg", "<u4"), ("off", "<u4"), ("size", "<u4"), ("priority", "<i4"),
                       ("max_attempts", "<u2"), ("not_before", "<f8")])  # fmt: skip
# and per result or dead-letter record
KEPT_DTYPE = np.dtype([("kind", "u1"), ("id", "<i8"), ("seg", "<u4"), ("off", "<u4"), ("size", "<u4")])
_CHUNK = 65536  # records verified per vectorised step
MAX_MAPS = 4  # segments a log keeps mapped at once (reads go mostly to the oldest and the newest)


@dataclass
class Scan:
    """What a recovery scan found: the message records (SCAN_DTYPE arrays), the result and dead-letter
    records (KEPT_DTYPE arrays), and what it cut or repaired."""

    messages: list[np.ndarray] = field(default_factory=list)
    kept: list[np.ndarray] = field(default_factory=list)
    id_floor: int = 0
    torn_bytes: int = 0
    repaired: list[str] = field(default_factory=list)


class SegmentLog:
    """Append records to the newest segment, rolling at `segment_bytes`; read any record by location."""

    def __init__(self, path: Path, segment_bytes: int) -> None:
        self.path = path
        self.segment_bytes = segment_bytes
        self.sizes: dict[int, int] = {}  # segment number -> bytes
        self._maps: dict[int, mmap.mmap] = {}
        self._fd = -1
        self.active = 0
        self.dirty = False
        self.id_floor = 0  # kept current by the store: written into each new segment's header

    def _file(self, seg: int) -> Path:
        return self.path / SEGMENT_NAME.format(seg)

    # --- opening --------------------------------------------------------------------------
    def open(self, repair: bool) -> Scan:
        """Verify every segment; returns the message records found."""
        scan = Scan()
        files = sorted(self.path.glob(SEGMENT_GLOB))
        for n, f in enumerate(files):
            self._verify(f, int(f.name[4:-4]), last=n == len(files) - 1, repair=repair, scan=scan)
        if self.sizes:
            self.active = max(self.sizes)
        else:
            self.roll()
        return scan

    def _verify(self, f: Path, seg: int, last: bool, repair: bool, scan: Scan) -> None:
        size = f.stat().st_size
        if size < SEGMENT_HEADER.size:
            if not last:
                self._damaged(f, 0, "shorter than a segment header", repair, scan)
                return
            log.warning("%s: torn segment header (%d bytes), removed", f, size)
            scan.torn_bytes += size
            f.unlink()
            return
        with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            magic, version, number, id_floor = SEGMENT_HEADER.unpack_from(mm, 0)
            if magic != SEGMENT_MAGIC or version != SEGMENT_VERSION or number != seg:
                self._damaged(f, 0, "bad segment header (magic, version or number)", repair, scan)
                return
            scan.id_floor = max(scan.id_floor, id_floor)
            bad: list[tuple[int, int]] = []  # damaged spans [start, end)
            pos = SEGMENT_HEADER.size
            raw = np.frombuffer(mm, np.uint8)
            try:
                with memoryview(mm) as mv:
                    while pos < size:
                        end = _valid_records(raw, mv, pos, size, seg, scan)
                        if end > pos:
                            pos = end
                            continue
                        nxt = _resync(mv, pos, size)
                        if nxt is None and last:
                            log.warning("%s: torn tail at offset %d: cut off %d bytes", f, pos, size - pos)
                            scan.torn_bytes += size - pos
                            size = pos
                            break
                        if not repair:
                            raise CorruptStoreError(str(f), pos, "record fails its CRC or framing check")
                        end = size if nxt is None else nxt
                        if end < size and end - pos < _MIN_RECORD:
                            end = _valid_record(mv, end, size)  # too short to pad: swallow the next record too
                        bad.append((pos, end))
                        pos = end
            finally:
                del raw  # a live view would stop the mmap from closing (and mask any error)
            if bad:
                size = self._repair(f, mm, size, bad, scan)
        if size != f.stat().st_size:
            os.truncate(f, size)
        self.sizes[seg] = size

    def _damaged(self, f: Path, offset: int, reason: str, repair: bool, scan: Scan) -> None:
        if not repair:
            raise CorruptStoreError(str(f), offset, reason)
        aside = keep_aside(f, move=True)
        log.warning("%s: %s; moved aside to %s", f, reason, aside.name)
        scan.repaired.append(str(aside))

    def _repair(self, f: Path, mm: mmap.mmap, size: int, bad: list[tuple[int, int]], scan: Scan) -> int:
        """Turn each damaged span of `f` into one padding record, in place (a damaged tail is cut
        instead), so intact records keep their offsets and no room for a copy is needed; returns the
        new size. The damaged bytes are kept first, at their offsets, in a sparse file beside it."""
        aside = aside_name(f)
        with open(aside, "wb") as out:
            for start, end in bad:
                out.seek(start)
                out.write(mm[start:end])
            out.truncate(size)
            out.flush()
            os.fsync(out.fileno())
        fsync_dir(self.path)  # the damaged bytes are kept for good before they are overwritten
        fd = os.open(f, os.O_WRONLY)
        try:
            for start, end in bad:
                if end < size:
                    os.pwrite(fd, _pad(end - start), start)
                else:
                    os.ftruncate(fd, start)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.path)
        spans = ", ".join(f"{a}..{b}" for a, b in bad)
        log.warning("%s: damaged bytes %s replaced by padding; the damaged bytes are kept in %s", f, spans, aside.name)
        scan.repaired.append(str(aside))
        return bad[-1][0] if bad[-1][1] >= size else size

    # --- writing --------------------------------------------------------------------------
    def roll(self) -> None:
        """Start a new active segment (if that fails, the active one stays as it was)."""
        if self._fd >= 0 and self.dirty:  # the store's sync() will only see the new segment
            os.fsync(self._fd)
        seg = max(self.sizes, default=0) + 1
        f = self._file(seg)
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            write_all(fd, SEGMENT_HEADER.pack(SEGMENT_MAGIC, SEGMENT_VERSION, seg, self.id_floor), 0)
            fsync_dir(self.path)
        except BaseException:
            os.close(fd)
            f.unlink(missing_ok=True)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self.active = fd, seg
        self.sizes[seg] = SEGMENT_HEADER.size
        self.dirty = True

    def append(self, bodies: Sequence[bytes]) -> tuple[list[int], list[int]]:
        """Append one record per body; returns (segments, body offsets).

        All or nothing: when a write fails (a full disk), what this call wrote is removed again
        (segments it started are deleted) before the error is raised.
        """
        sizes = list(map(len, bodies))
        start = self.sizes[self.active]
        if start + sum(sizes) + RECORD_OVERHEAD * len(sizes) <= self.segment_bytes:
            return [self.active] * len(sizes), self._append(bodies, sizes)
        first = self.active
        segs: list[int] = []
        offs: list[int] = []
        try:
            for b, n in zip(bodies, sizes, strict=True):  # record by record across rolls
                pos = self.sizes[self.active]
                if pos + n + RECORD_OVERHEAD > self.segment_bytes and pos > SEGMENT_HEADER.size:
                    self.roll()
                segs.append(self.active)
                offs += self._append([b], [n])
        except BaseException:
            self._undo(first, start)
            raise
        return segs, offs

    def _undo(self, seg: int, size: int) -> None:
        """Make segment `seg` the active one again, `size` bytes long, deleting the segments after it."""
        for s in [s for s in self.sizes if s > seg]:
            if s == self.active and self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            mm = self._maps.pop(s, None)
            if mm is not None:
                mm.close()
            del self.sizes[s]
            self._file(s).unlink(missing_ok=True)
        self.active = seg
        os.ftruncate(self._out(), size)
        self.sizes[seg] = size
        os.fsync(self._fd)  # the records of a refused put must not come back after a machine crash
        fsync_dir(self.path)

    def _append(self, bodies: Sequence[bytes], sizes: list[int]) -> list[int]:
        """Write records to the active segment in one write; returns their body offsets."""
        pack_head = RECORD_HEAD.pack
        crc32 = zlib.crc32
        foot = _FOOT_BYTES
        parts: list[bytes] = []
        for b, n in zip(bodies, sizes, strict=True):
            parts += (pack_head(crc32(b), n), b, foot)
        pos = self.sizes[self.active] + _HEAD
        offs = []
        for n in sizes:
            offs.append(pos)
            pos += n + RECORD_OVERHEAD
        self._write(parts, pos - _HEAD)
        return offs

    def _write(self, parts: list[bytes], end: int) -> None:
        if parts:
            write_all(self._out(), b"".join(parts), self.sizes[self.active])
            self.sizes[self.active] = end
            self.dirty = True

    def _out(self) -> int:
        """The active segment's descriptor, opened again if `suspend` closed it."""
        if self._fd < 0:
            self._fd = os.open(self._file(self.active), os.O_WRONLY | os.O_APPEND)
        return self._fd

    def sync(self) -> None:
        if self.dirty and self._fd >= 0:
            self.dirty = False
            os.fsync(self._fd)

    def take_dirty(self) -> int:
        """A duplicate of the active file's descriptor if it has unsynced writes, else -1.

        Lets a background thread fsync without holding the store's lock.
        """
        if not self.dirty or self._fd < 0:
            return -1
        self.dirty = False
        return os.dup(self._fd)

    # --- reading and dropping -------------------------------------------------------------
    def read(self, seg: int, off: int, size: int) -> bytes:
        """The body at a location (a copy, so segments can be dropped while it is in use)."""
        return self.mapped(seg, off + size)[off : off + size]

    def mapped(self, seg: int, end: int) -> mmap.mmap:
        """The map of a segment, covering at least its first `end` bytes. At most MAX_MAPS stay
        mapped (each holds a descriptor): use it before asking for another."""
        mm = self._maps.pop(seg, None)
        if mm is None or end > len(mm):
            if mm is not None:
                mm.close()
            with open(self._file(seg), "rb") as fh:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            while len(self._maps) >= MAX_MAPS:
                self._maps.pop(next(iter(self._maps))).close()  # the least recently used
        self._maps[seg] = mm
        return mm

    def drop(self, seg: int) -> None:
        """Delete a segment whose records are all dead."""
        if seg == self.active:
            self.roll()
        mm = self._maps.pop(seg, None)
        if mm is not None:
            mm.close()
        self.sizes.pop(seg, None)
        self._file(seg).unlink(missing_ok=True)

    def holds(self, seg: int, off: int, size: int, kind: int, msg_id: int) -> bool:
        """Whether a verified record of this kind and id has its body at this location."""
        end = self.sizes.get(seg, 0)
        if off - _HEAD < SEGMENT_HEADER.size or off + size + RECORD_FOOT.size > end or size < BODY_PREFIX.size:
            return False
        mm = self.mapped(seg, end)
        return RECORD_HEAD.unpack_from(mm, off - _HEAD)[1] == size and BODY_PREFIX.unpack_from(mm, off) == (kind, msg_id)

    def bytes_on_disk(self) -> int:
        return sum(self.sizes.values())

    def close(self, sync: bool = True) -> None:
        """Sync (unless told not to) and let go of every descriptor; a later write or read opens what it needs again."""
        for mm in self._maps.values():
            mm.close()
        self._maps.clear()
        if self._fd >= 0:
            if sync:
                self.sync()
            os.close(self._fd)
            self._fd = -1


def _valid_records(raw: np.ndarray, mv: memoryview, pos: int, size: int, seg: int, scan: Scan) -> int:
    """Verify the run of valid records starting at `pos` (up to _CHUNK of them), adding its message
    records to `scan`; returns where the run ends (`pos` itself if the record there is bad).

    Only the walk over sizes is sequential; footers, CRCs and prefixes are checked per chunk.
    """
    starts: list[int] = []
    lens: list[int] = []
    crcs: list[int] = []
    unpack = RECORD_HEAD.unpack_from
    while pos + _MIN_RECORD <= size and len(starts) < _CHUNK:
        crc, n = unpack(mv, pos)
        end = pos + n + RECORD_OVERHEAD
        if n < BODY_PREFIX.size or end > size:
            break
        starts.append(pos)
        lens.append(n)
        crcs.append(crc)
        pos = end
    if not starts:
        return pos
    s = np.array(starts, np.int64) + _HEAD  # body offsets
    n = np.array(lens, np.int64)
    crc32 = zlib.crc32
    kinds = raw[s]
    is_msg = kinds == KIND_MESSAGE
    ok = (
        (raw[(s + n)[:, None] + np.arange(RECORD_FOOT.size)].copy().view("<u4").ravel() == RECORD_END)
        & (np.fromiter((crc32(mv[a : a + b]) for a, b in zip(s.tolist(), lens, strict=True)), np.uint32, len(lens)) == crcs)
        & np.isin(kinds, (KIND_MESSAGE, KIND_RESULT, KIND_DEAD, KIND_PAD))
        & (~is_msg | (n >= MESSAGE_PREFIX_DTYPE.itemsize))
    )
    k = len(ok) if ok.all() else int(np.argmin(ok))
    if not k:
        return starts[0]
    s, n, is_msg = s[:k], n[:k], is_msg[:k]
    ms, mn = s[is_msg], n[is_msg]
    prefix = raw[ms[:, None] + np.arange(MESSAGE_PREFIX_DTYPE.itemsize)].copy().view(MESSAGE_PREFIX_DTYPE).ravel()
    out = np.empty(len(ms), SCAN_DTYPE)
    out["id"], out["seg"], out["off"], out["size"] = prefix["id"], seg, ms, mn
    for name in ("priority", "max_attempts", "not_before"):
        out[name] = prefix[name]
    scan.messages.append(out)
    is_kept = (kinds[:k] == KIND_RESULT) | (kinds[:k] == KIND_DEAD)
    if is_kept.any():
        ks, kn = s[is_kept], n[is_kept]
        kept = np.empty(len(ks), KEPT_DTYPE)
        kept["kind"], kept["seg"], kept["off"], kept["size"] = raw[ks], seg, ks, kn
        kept["id"] = raw[(ks + 1)[:, None] + np.arange(8)].copy().view("<u8").ravel()
        scan.kept.append(kept)
    return int(s[-1] + n[-1]) + RECORD_FOOT.size


def _valid_record(mv: memoryview, pos: int, size: int) -> int:
    """End offset of a valid record at `pos`, or 0."""
    if pos + _MIN_RECORD > size:
        return 0
    crc, n = RECORD_HEAD.unpack_from(mv, pos)
    end: int = pos + _HEAD + n + RECORD_FOOT.size
    if n < BODY_PREFIX.size or end > size:
        return 0
    if mv[end - RECORD_FOOT.size : end] != _FOOT_BYTES or zlib.crc32(mv[pos + _HEAD : end - RECORD_FOOT.size]) != crc:
        return 0
    return end


def _resync(mv: memoryview, pos: int, size: int) -> int | None:
    """The start of the next valid record after a bad one at `pos`, or None if there is none."""
    _, n = RECORD_HEAD.unpack_from(mv, pos) if pos + _HEAD <= size else (0, 0)
    guess: int = pos + n + RECORD_OVERHEAD  # the size field may be intact even if the body is not
    if pos < guess < size and _valid_record(mv, guess, size):
        return guess
    data = cast(mmap.mmap, mv.obj)  # the mmap: find() is fast
    q = data.find(_FOOT_BYTES, pos + 1, size)
    while q != -1:
        start = q + RECORD_FOOT.size
        if _valid_record(mv, start, size):
            return start
        q = data.find(_FOOT_BYTES, q + 1, size)
    return None


def _pad(span: int) -> bytes:
    n = span - RECORD_OVERHEAD
    body = BODY_PREFIX.pack(KIND_PAD, 0) + bytes(n - BODY_PREFIX.size)
    return RECORD_HEAD.pack(zlib.crc32(body), n) + body + _FOOT_BYTES
