"""The record log of a durable store: numbered append-only segment files, read through mmap.

A record is `crc32(body) | size | body | footer`; the body starts with its kind and message id.
Opening verifies every record (see `conveyor.storage.segment_scan`: torn tails, damage, repair).
An append is whole or absent: a failed write is cut back, across segment rolls too.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

from conveyor.constants import (
    BODY_PREFIX,
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
from conveyor.storage.files import fsync_dir, write_all
from conveyor.storage.segment_scan import Scan, cut_torn, verify_segment

_HEAD = RECORD_HEAD.size
_FOOT_BYTES = RECORD_FOOT.pack(RECORD_END)
MAX_MAPS = 4  # segments a log keeps mapped at once (reads go mostly to the oldest and the newest)


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
        """Verify every segment; returns the records found. Torn tails are cut by `settle`, not here."""
        scan = Scan()
        files = sorted(self.path.glob(SEGMENT_GLOB))
        for n, f in enumerate(files):
            seg = int(f.name[4:-4])
            size = verify_segment(f, seg, last=n == len(files) - 1, repair=repair, scan=scan)
            if size is not None:
                self.sizes[seg] = size
        return scan

    def settle(self, scan: Scan, short: set[Path]) -> None:
        """Cut off the torn tails `scan` found and make the newest segment the active one.

        Cut off the torn tails `scan` found (see `cut_torn`: `short`, the files cut short) and make
        the newest segment the active one (a new one if none).
        """
        cut_torn(scan, short)
        if self.sizes:
            self.active = max(self.sizes)
        else:
            self.roll()

    # --- writing --------------------------------------------------------------------------
    def roll(self) -> None:
        """Start a new active segment (if that fails, the active one stays as it was)."""
        if self._fd >= 0:  # the store's sync() will only see the new segment (and one it runs may not be done)
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

    def sync(self, always: bool = False) -> None:
        """fsync the active segment if it has unsynced writes.

        fsync the active segment if it has unsynced writes; `always`: whatever it has, so that a
        sync another thread runs on it (see `take_dirty`) has finished too.
        """
        if (self.dirty or always) and self._fd >= 0:
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
        """The map of a segment, covering at least its first `end` bytes.

        At most MAX_MAPS stay mapped (each holds a descriptor): use it before asking for another.
        """
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
