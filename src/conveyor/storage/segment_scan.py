"""Verifying a durable store's segments on opening: the recovery scan of every record, torn tails, repair.

A record is `crc32(body) | size | body | footer`; the body starts with its kind and message id.
Opening verifies every record, a chunk of records per vectorised step, and reports the message,
result and dead-letter records it found (`Scan`). A bad record with nothing valid after it in the
newest segment is a torn tail (a crash mid-write): it is cut off with a warning (`cut_torn`), once
opening knows that the index confirmed nothing in it (else the segment was cut short: see
`conveyor.storage.losses`). Such a tail of a sealed segment is never torn (it was synced whole when
the next one began): opening refuses it, as cut short where the index confirms records beyond it,
else as damage (`refuse_sealed`). Any other bad record raises CorruptStoreError naming the file and
offset. With `repair=True` each damaged span is overwritten in place by a padding record (no room
for a copy is needed), so every intact record keeps its offset; the damaged bytes are kept first,
at their offsets, in a sparse file beside it.
"""

from __future__ import annotations

import logging
import mmap
import os
import zlib
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
    SEGMENT_HEADER,
    SEGMENT_MAGIC,
    SEGMENT_VERSION,
)
from conveyor.errors import CorruptStoreError
from conveyor.storage.files import aside_name, fsync_dir, keep_aside

log = logging.getLogger("conveyor.storage")

_HEAD = RECORD_HEAD.size
_FOOT_BYTES = RECORD_FOOT.pack(RECORD_END)
_MIN_RECORD = RECORD_OVERHEAD + BODY_PREFIX.size


# what a recovery scan reports per message record
SCAN_DTYPE = np.dtype(
    [
        ("id", "<i8"),
        ("seg", "<u4"),
        ("off", "<u4"),
        ("size", "<u4"),
        ("priority", "<i4"),
        ("max_attempts", "<u2"),
        ("not_before", "<f8"),
    ]
)
# and per result or dead-letter record
KEPT_DTYPE = np.dtype([("kind", "u1"), ("id", "<i8"), ("seg", "<u4"), ("off", "<u4"), ("size", "<u4")])
_CHUNK = 65536  # records verified per vectorised step


@dataclass(frozen=True)
class Cut:
    """A bad tail a scan found: cut off by `cut_torn`, not before (a refused open changes nothing).

    One of a sealed segment is never a torn tail (it was synced whole when the next one began):
    opening refuses it (see `refuse_sealed`).
    """

    file: Path
    keep: int  # bytes kept (0: a torn header, the file is removed)
    size: int  # bytes the file has
    sealed: bool = False


@dataclass
class Scan:
    """What a recovery scan found: records, torn tails to cut, and what it repaired.

    What a recovery scan found: the message records (SCAN_DTYPE arrays), the result and dead-letter
    records (KEPT_DTYPE arrays), the torn tails to cut, and what it repaired.
    """

    messages: list[np.ndarray] = field(default_factory=list)
    kept: list[np.ndarray] = field(default_factory=list)
    id_floor: int = 0
    cuts: list[Cut] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)


def verify_segment(f: Path, seg: int, last: bool, repair: bool, scan: Scan) -> int | None:
    """Verify the segment file `f` (number `seg`), adding its records to `scan`.

    Verify the segment file `f` (number `seg`; `last`: the newest one), adding its records to
    `scan`; returns its size without a torn tail (added to `scan.cuts`) and once damage is repaired,
    or None when the file is no segment (a torn header, or a damaged header moved aside).
    """
    size = f.stat().st_size
    if size < SEGMENT_HEADER.size:
        if not last:
            _damaged(f, 0, "shorter than a segment header", repair, scan)
            return None
        scan.cuts.append(Cut(f, 0, size))
        return None
    with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        magic, version, number, id_floor = SEGMENT_HEADER.unpack_from(mm, 0)
        if magic != SEGMENT_MAGIC or version != SEGMENT_VERSION or number != seg:
            _damaged(f, 0, "bad segment header (magic, version or number)", repair, scan)
            return None
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
                    if nxt is None and (last or not repair):  # a torn tail, or a sealed segment cut short
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
            size = _repair(f, mm, size, bad, scan)
    on_disk = f.stat().st_size
    if size < on_disk:  # a bad tail (one the repair met is cut already)
        scan.cuts.append(Cut(f, size, on_disk, sealed=not last))
    return size


def refuse_sealed(scan: Scan) -> None:
    """Raise CorruptStoreError for the first bad tail of a sealed segment `scan` found, if any."""
    for c in scan.cuts:
        if c.sealed:
            raise CorruptStoreError(str(c.file), c.keep, "record fails its CRC or framing check (nothing valid after it)")


def cut_torn(scan: Scan, short: set[Path]) -> None:
    """Cut off the tails `scan` found, each with a warning.

    Cut off the tails `scan` found, each with a warning: torn tails, or, in the files in `short`
    (cut short below what the index confirms: a repair), the broken end of what is left.
    """
    for c in scan.cuts:
        if c.file in short:
            log.warning(
                "%s: cut short: what is left of a record at offset %d cut off (%d bytes)", c.file, c.keep, c.size - c.keep
            )
        elif c.keep == 0:
            log.warning("%s: torn segment header (%d bytes), removed", c.file, c.size)
        else:
            log.warning("%s: torn tail at offset %d: cut off %d bytes", c.file, c.keep, c.size - c.keep)
        if c.keep == 0:
            c.file.unlink()
        else:
            os.truncate(c.file, c.keep)


def _damaged(f: Path, offset: int, reason: str, repair: bool, scan: Scan) -> None:
    if not repair:
        raise CorruptStoreError(str(f), offset, reason)
    aside = keep_aside(f, move=True)
    log.warning("%s: %s; moved aside to %s", f, reason, aside.name)
    scan.repaired.append(str(aside))


def _repair(f: Path, mm: mmap.mmap, size: int, bad: list[tuple[int, int]], scan: Scan) -> int:
    """Turn each damaged span of `f` into one padding record, in place; returns the new size.

    Turn each damaged span of `f` into one padding record, in place (a damaged tail is cut instead),
    so intact records keep their offsets and no room for a copy is needed; returns the new size. The
    damaged bytes are kept first, at their offsets, in a sparse file beside it.
    """
    aside = aside_name(f)
    with open(aside, "wb") as out:
        for start, end in bad:
            out.seek(start)
            out.write(mm[start:end])
        out.truncate(size)
        out.flush()
        os.fsync(out.fileno())
    fsync_dir(f.parent)  # the damaged bytes are kept for good before they are overwritten
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
    fsync_dir(f.parent)
    spans = ", ".join(f"{a}..{b}" for a, b in bad)
    log.warning("%s: damaged bytes %s replaced by padding; the damaged bytes are kept in %s", f, spans, aside.name)
    scan.repaired.append(str(aside))
    return bad[-1][0] if bad[-1][1] >= size else size


def _valid_records(raw: np.ndarray, mv: memoryview, pos: int, size: int, seg: int, scan: Scan) -> int:
    """Verify the run of valid records starting at `pos`, adding its message records to `scan`.

    Verify the run of valid records starting at `pos` (up to _CHUNK of them), adding its message
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
