"""The ids a durable store has reserved: no id below the reservation is ever assigned again.

A put uses ids only once they are reserved, and the reservation is synced first (once per
ID_RESERVE_CHUNK ids), so that whatever crashed when, an id handed out before (to a put under way,
or to the idempotency keys a server writes before their messages) is never given to another
message. The file `ids.reserved` holds two slots written in turn (layout in `constants`); a write
torn by a crash leaves the other slot, the previous reservation, above every id used.

It is a file of its own, not a record in the index, because syncing it must not sync anything else:
the index must reach the disk only after the segments its records point into.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from conveyor.constants import RESERVED_NAME, RESERVED_SLOT, RESERVED_SLOT_BYTES
from conveyor.storage.files import fsync_dir


class IdReservation:
    """The reservation of the store in `path`: `upto` and `raise_to`."""

    def __init__(self, path: Path) -> None:
        self.file = path / RESERVED_NAME
        self.upto = 0  # no id below it is ever assigned again
        self._slot = 0  # the one to write next
        try:
            data = self.file.read_bytes()
        except FileNotFoundError:
            return
        for k in range(2):
            raw = data[k * RESERVED_SLOT_BYTES : k * RESERVED_SLOT_BYTES + RESERVED_SLOT.size]
            if len(raw) == RESERVED_SLOT.size:
                upto, crc = RESERVED_SLOT.unpack(raw)
                if crc == zlib.crc32(raw[:8]) and upto > self.upto:
                    self.upto, self._slot = upto, 1 - k  # the older slot is written next

    def raise_to(self, upto: int) -> None:
        """Reserve the ids below `upto`, durably (synced) before this returns."""
        new = not self.file.exists()
        fd = os.open(self.file, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            slot = RESERVED_SLOT.pack(upto, zlib.crc32(upto.to_bytes(8, "little")))
            os.pwrite(fd, slot, self._slot * RESERVED_SLOT_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            fsync_dir(self.file.parent)
        self.upto, self._slot = upto, 1 - self._slot
