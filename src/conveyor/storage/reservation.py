"""The ids a durable store has reserved: no id below the reservation is ever assigned again.

A put uses ids only once they are reserved, and the reservation is synced first (once per
ID_RESERVE_CHUNK ids), so that whatever crashed when, an id handed out before (to a put under way,
or to the idempotency keys a server writes before their messages) is never given to another
message. The file `ids.reserved` holds two slots written in turn (layout in `constants`); a write
torn by a crash leaves the other slot, the previous reservation, above every id used.

A file that cannot be read (gone or empty while the store has handed out ids, of another size than
one slot or two, no slot that passes its checksum) is never a reason to reuse an id: opening then
starts past `past_lost` (see there) with a warning, and writes the file whole again.

One slot that fails its checksum beside one that passes is what a crash during a raise leaves: the
raise had not returned, so no id above the other slot's reservation was handed out. Opening keeps
that reservation (with a warning, as for a torn tail) and writes the file whole again: no skip. The
other cause, damage to the newer slot alone, cannot be told apart; it could give an id twice only
if, besides, ids handed out past the older reservation left no trace in any file opening reads
(segments, index, a server's keys log). Under fsync "batch" those ids were never confirmed to
anyone; under "interval" or "never" it takes a machine crash on top. Skipping 2 x ID_RESERVE_MOST
on every torn raise instead would cost an ordinary crash a false alarm and, while older messages
are still pending, some 70 MB of window.

It is a file of its own, not a record in the index, because syncing it must not sync anything else:
the index must reach the disk only after the segments its records point into.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from pathlib import Path

from conveyor.constants import ID_RESERVE_CHUNK, ID_RESERVE_MOST, RESERVED_NAME, RESERVED_SLOT, RESERVED_SLOT_BYTES
from conveyor.storage.files import fsync_dir, write_atomically

log = logging.getLogger("conveyor.storage")

_SIZES = (RESERVED_SLOT.size, RESERVED_SLOT_BYTES + RESERVED_SLOT.size)  # one slot written, or both


def past_lost(next_id: int) -> int:
    """Where ids start when the reservation cannot be read and the files show ids below `next_id`.

    Every id handed out lies below the lost reservation R. A reservation is raised, by a put that
    needs ids up to u, to u plus a chunk of at most ID_RESERVE_MOST ids, and the put then takes its
    ids: so R is at most ID_RESERVE_MOST above the ids handed out. Those ids are all below `next_id`
    unless the records of the last of them were lost with the reservation (a torn tail of the newest
    segment, a put cut short by the crash, or, under fsync "interval" or "never", the last interval
    of puts after a machine crash). Starting 2 x ID_RESERVE_MOST past `next_id` therefore covers
    the largest chunk plus up to ID_RESERVE_MOST ids lost beyond what the files show: more than any
    put through a server takes (at most its max_frames, 65,536 by default). Ids are 64-bit: the
    skipped ones cost nothing but, while older messages are still pending, the window's memory over
    them (about 33 bytes an id).
    """
    return next_id + 2 * ID_RESERVE_MOST


class IdReservation:
    """The reservation of the store in `path`: `upto`, `raise_to`, and what was wrong with the file."""

    def __init__(self, path: Path) -> None:
        self.file = path / RESERVED_NAME
        self.upto = 0  # no id below it is ever assigned again
        self.missing = False  # no file, or an empty one: none was ever written (no id handed out), or it was lost
        self.unreadable: str | None = None  # why the file cannot be trusted, if it cannot
        self.torn = False  # one slot fails its checksum, the other holds the reservation
        self._slot = 0  # the one to write next
        self._chunk, self._raised_at = ID_RESERVE_CHUNK, -1.0  # see `cover`
        try:
            data = self.file.read_bytes()
        except FileNotFoundError:
            data = b""
        if not data:  # the first raise never reached the disk, or the file was lost
            self.missing = True
            return
        good, bad = [], []
        for k in range(2):
            raw = data[k * RESERVED_SLOT_BYTES : k * RESERVED_SLOT_BYTES + RESERVED_SLOT.size]
            if not raw:
                continue  # never written
            upto, crc = RESERVED_SLOT.unpack(raw) if len(raw) == RESERVED_SLOT.size else (0, -1)
            if crc != zlib.crc32(raw[:8]):
                bad.append(k)
                continue
            good.append(k)
            if upto > self.upto:
                self.upto, self._slot = upto, 1 - k  # the older slot is written next
        if len(data) not in _SIZES:
            self.unreadable = f"{len(data)} bytes, not one slot ({_SIZES[0]}) or two ({_SIZES[1]})"
        elif not good:
            self.unreadable = "no slot passes its checksum"
        elif bad:
            self.torn = True
            log.warning(
                "%s: slot %d fails its checksum (a raise torn by a crash leaves this): the reservation in "
                "the other slot (%d) stands",
                self.file,
                bad[0],
                self.upto,
            )

    def cover(self, upto: int, ahead: bool) -> None:
        """Make sure the ids below `upto` are reserved.

        When they are not, reserve them and, with `ahead`, a chunk more: ID_RESERVE_CHUNK ids,
        doubled (up to ID_RESERVE_MOST) while raises come less than a second apart, so that a fast
        stream of puts syncs rarely.
        """
        if upto <= self.upto:
            return
        now = time.monotonic()
        chunk = min(2 * self._chunk, ID_RESERVE_MOST) if now - self._raised_at < 1.0 else ID_RESERVE_CHUNK
        self.raise_to(upto + chunk if ahead else upto)
        if ahead:
            self._chunk, self._raised_at = chunk, now

    def raise_to(self, upto: int) -> None:
        """Reserve the ids below `upto`, durably (synced) before this returns."""
        new = not self.file.exists()
        fd = os.open(self.file, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, _slot(upto), self._slot * RESERVED_SLOT_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            fsync_dir(self.file.parent)
        self.upto, self._slot = upto, 1 - self._slot

    def rewrite(self, upto: int) -> None:
        """Replace the file whole by one reserving the ids below `upto` in both slots (after damage)."""
        slot = _slot(upto)
        write_atomically(self.file, slot, bytes(RESERVED_SLOT_BYTES - len(slot)), slot)
        self.upto, self._slot, self.missing, self.unreadable, self.torn = upto, 0, False, None, False


def _slot(upto: int) -> bytes:
    return RESERVED_SLOT.pack(upto, zlib.crc32(upto.to_bytes(8, "little")))
