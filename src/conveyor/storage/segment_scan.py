"""Verifying a durable store's segments on opening: the recovery scan of every record, torn tails, repair.

A record is `crc32(body) | size | body | footer`; the body starts with its kind and message id.
Opening verifies every record, walking from one to the next and checking each CRC, and reports the
message, result and dead-letter records it found (`Scan`): their fixed fields are copied out as it
goes, and read a field at a time afterwards (`conveyor.storage.columns`). A bad record with nothing valid after it in the
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
from array import array
from dataclasses import dataclass, field
from itertools import accumulate, compress, repeat
from operator import add
from pathlib import Path
from typing import cast

from conveyor.constants import (
    BODY_PREFIX,
    KIND_DEAD,
    KIND_MESSAGE,
    KIND_PAD,
    KIND_RESULT,
    MESSAGE_PREFIX,
    MESSAGE_PREFIX_FIELDS,
    RECORD_END,
    RECORD_FOOT,
    RECORD_HEAD,
    RECORD_OVERHEAD,
    SEGMENT_HEADER,
    SEGMENT_MAGIC,
    SEGMENT_VERSION,
)
from conveyor.errors import CorruptStoreError
from conveyor.storage.columns import Field, column, column_bytes, layout, table
from conveyor.storage.files import aside_name, fsync_dir, keep_aside

log = logging.getLogger("conveyor.storage")

_HEAD = RECORD_HEAD.size
_FOOT = RECORD_FOOT.size
_FOOT_BYTES = RECORD_FOOT.pack(RECORD_END)
_MIN_RECORD = RECORD_OVERHEAD + BODY_PREFIX.size
_CHUNK = 65536  # records verified per step
# what the scan copies of each record as it walks: the footer of the record before it, its head, and
# the fixed fields of a message body up to not_before (where a result's or dead letter's are its kind and id)
_MSG = layout(MESSAGE_PREFIX, MESSAGE_PREFIX_FIELDS)
_COPIED = _FOOT + _HEAD + _MSG["enqueued_at"].offset


def _copied(f: Field, offset: int, code: str | None = None) -> Field:
    """Where field `f`, at `offset` in a record, is in the bytes the scan copies of it."""
    return Field(_FOOT + offset + f.offset, f.size, code or f.code)


_PREV_FOOT = Field(0, _FOOT, "I")
_SIZE = _copied(layout(RECORD_HEAD, ("crc", "size"))["size"], 0)
_KIND = _copied(_MSG["kind"], _HEAD)
_ID = _copied(_MSG["id"], _HEAD, "q")  # ids are below 2**63: signed, as every id column
_PRIORITY = _copied(_MSG["priority"], _HEAD)
_MAX_ATTEMPTS = _copied(_MSG["max_attempts"], _HEAD)
_NOT_BEFORE = _copied(_MSG["not_before"], _HEAD)
_IS_MESSAGE = table((KIND_MESSAGE,))
_IS_KEPT = table((KIND_RESULT, KIND_DEAD))
_IS_BAD_KIND = table([k for k in range(256) if k not in (KIND_MESSAGE, KIND_RESULT, KIND_DEAD, KIND_PAD)])


@dataclass
class Found:
    """The message records a recovery scan found, as columns (one entry a record, in file order)."""

    id: array[int] = field(default_factory=lambda: array("q"))
    seg: array[int] = field(default_factory=lambda: array("I"))
    off: array[int] = field(default_factory=lambda: array("I"))  # of the body
    size: array[int] = field(default_factory=lambda: array("I"))  # of the body
    priority: array[int] = field(default_factory=lambda: array("i"))
    max_attempts: array[int] = field(default_factory=lambda: array("H"))
    not_before: array[float] = field(default_factory=lambda: array("d"))


@dataclass
class FoundKept:
    """The result and dead-letter records a recovery scan found, as columns."""

    kind: bytearray = field(default_factory=bytearray)
    id: array[int] = field(default_factory=lambda: array("q"))
    seg: array[int] = field(default_factory=lambda: array("I"))
    off: array[int] = field(default_factory=lambda: array("I"))
    size: array[int] = field(default_factory=lambda: array("I"))


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

    What a recovery scan found: the message records, the result and dead-letter records, the torn
    tails to cut, and what it repaired.
    """

    messages: Found = field(default_factory=Found)
    kept: FoundKept = field(default_factory=FoundKept)
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
        with memoryview(mm) as mv:
            while pos < size:
                end = _valid_records(mm, mv, pos, size, seg, scan)
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


def _valid_records(mm: mmap.mmap, mv: memoryview, pos: int, size: int, seg: int, scan: Scan) -> int:
    """Verify the run of valid records starting at `pos`, adding its message records to `scan`.

    Verify the run of valid records starting at `pos` (up to _CHUNK of them), adding its message,
    result and dead-letter records to `scan`; returns where the run ends (`pos` itself if the record
    there is bad).

    The walk over sizes checks each CRC and copies each record's fixed fields; footers, kinds and
    fields are checked and read a field at a time afterwards.
    """
    start = pos
    copied = bytearray()
    keep = copied.extend
    unpack = RECORD_HEAD.unpack_from
    crc32 = zlib.crc32
    whole = size - _COPIED + _FOOT  # up to here a record's copied bytes are all in the file
    k = 0
    while pos + _MIN_RECORD <= size and k < _CHUNK:
        crc, n = unpack(mm, pos)
        end = pos + n + RECORD_OVERHEAD
        if n < BODY_PREFIX.size or end > size or crc32(mv[pos + _HEAD : end - _FOOT]) != crc:
            break
        keep(mm[pos - _FOOT : pos - _FOOT + _COPIED] if pos <= whole else mm[pos - _FOOT : size].ljust(_COPIED, b"\0"))
        k += 1
        pos = end
    if not k:
        return start
    sizes = column(copied, k, _COPIED, _SIZE)
    kinds = column_bytes(copied, k, _COPIED, _KIND)
    # the first record that fails a check: its footer (copied with the record after it, the last
    # one's read here), its kind, or a message body shorter than a message's fixed fields
    bad = [k]
    feet = column_bytes(copied, k, _COPIED, _PREV_FOOT)[_FOOT:] + mm[pos - _FOOT : pos]
    if feet != _FOOT_BYTES * k:
        bad.append(next(j for j in range(k) if feet[j * _FOOT : (j + 1) * _FOOT] != _FOOT_BYTES))
    if (j := kinds.translate(_IS_BAD_KIND).find(1)) >= 0:
        bad.append(j)
    is_msg = kinds.translate(_IS_MESSAGE)
    if 1 in is_msg and min(compress(sizes, is_msg)) < MESSAGE_PREFIX.size:
        bad.append(next(j for j in range(k) if is_msg[j] and sizes[j] < MESSAGE_PREFIX.size))
    if min(bad) < k:
        k = min(bad)
        if not k:
            return start
        sizes, kinds, is_msg = sizes[:k], kinds[:k], is_msg[:k]
    offs = array("I", accumulate(map(add, sizes[:-1], repeat(RECORD_OVERHEAD)), initial=start + _HEAD))
    ids = column(copied, k, _COPIED, _ID)
    found = scan.messages
    if 0 not in is_msg:  # the usual case: message records only
        found.id += ids
        found.off += offs
        found.size += sizes
        found.priority += column(copied, k, _COPIED, _PRIORITY)
        found.max_attempts += column(copied, k, _COPIED, _MAX_ATTEMPTS)
        found.not_before += column(copied, k, _COPIED, _NOT_BEFORE)
    elif 1 in is_msg:
        found.id.extend(compress(ids, is_msg))
        found.off.extend(compress(offs, is_msg))
        found.size.extend(compress(sizes, is_msg))
        found.priority.extend(compress(column(copied, k, _COPIED, _PRIORITY), is_msg))
        found.max_attempts.extend(compress(column(copied, k, _COPIED, _MAX_ATTEMPTS), is_msg))
        found.not_before.extend(compress(column(copied, k, _COPIED, _NOT_BEFORE), is_msg))
    found.seg += array("I", (seg,)) * is_msg.count(1)
    is_kept = kinds.translate(_IS_KEPT)
    if 1 in is_kept:
        kept = scan.kept
        kept.kind += bytes(compress(kinds, is_kept))
        kept.id.extend(compress(ids, is_kept))
        kept.seg += array("I", (seg,)) * is_kept.count(1)
        kept.off.extend(compress(offs, is_kept))
        kept.size.extend(compress(sizes, is_kept))
    return int(offs[-1] + sizes[-1]) + _FOOT


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
