"""SpaceReserve: disk space held back in a data directory, given up when the disk fills.

A full disk must not stop a queue from doing what takes next to no space: delivering messages,
acking without results, extending leases (each a fixed-size index record). A server keeps a file of
reserved space (a ballast) beside its queues. When any write of its stores finds the disk full, the
reserve is given up (the file removed): the index writes then have room, while writes of message
bodies, results and dead letters (puts, acks with results, nacks that end in the dead letters) are
refused with a `DiskFullError` up front, so the freed space stays theirs. Once the file system has
room for the reserve and as much again, the reserve is taken back and every write is served again,
with no restart.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from conveyor.constants import SPACE_RESERVE_BYTES, SPACE_RESERVE_DIVISOR
from conveyor.errors import DiskFullError
from conveyor.storage.files import DISK_FULL

log = logging.getLogger("conveyor.storage")

CHECK_EVERY_S = 1.0  # while given up, how often a refused write looks whether there is room again


class SpaceReserve:
    """The reserve of one data directory, shared by every store in it (one thread uses them at a time)."""

    def __init__(self, path: Path, size: int | None = None) -> None:
        self.path = path
        if size is None:
            st = os.statvfs(path.parent)
            size = min(SPACE_RESERVE_BYTES, st.f_blocks * st.f_frsize // SPACE_RESERVE_DIVISOR)
        self.size = size
        self.given_up = False
        self._next_check = 0.0
        if not self._take():
            log.warning(
                "%s: no room for a reserve of %d bytes: the disk is full already; puts and results are "
                "refused until there is room",
                path.parent,
                size,
            )

    def _take(self) -> bool:
        """Make the reserve file; False (and given up) when the disk has no room for it."""
        if self.size:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    os.posix_fallocate(fd, 0, self.size)
                finally:
                    os.close(fd)
            except OSError as e:
                self.path.unlink(missing_ok=True)
                if e.errno in DISK_FULL:
                    self.given_up = True
                    return False
                log.warning(
                    "%s: no space reserve can be kept here (%s): on a full disk, deliveries and acks fail too",
                    self.path.parent,
                    e,
                )
                self.size = 0  # none: a full disk is still refused whole, only sooner
        self.given_up = False
        return True

    def give_up(self) -> None:
        """The disk is full: free the reserve for index writes, and refuse bulk writes until there is room."""
        if not self.given_up:
            log.warning(
                "%s: the disk is full: its reserve of %d bytes is given up so that deliveries and acks "
                "keep working; puts, results and dead letters are refused until there is room again",
                self.path.parent,
                self.size,
            )
            self.given_up = True
            self._next_check = time.monotonic() + CHECK_EVERY_S
        self.path.unlink(missing_ok=True)

    def check(self, where: object, what: str) -> None:
        """Raise DiskFullError for a bulk write (`what`, to `where`) while the reserve is given up and the disk still full."""
        if not self.given_up:
            return
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + CHECK_EVERY_S
            st = os.statvfs(self.path.parent)
            if st.f_bavail * st.f_frsize >= 2 * self.size and self._take():
                log.warning("%s: there is room again: the reserve is back and every write is served", self.path.parent)
                return
        raise DiskFullError(
            f"{where}: {what}: the disk is full: refused (nothing was changed) until space is freed; "
            "deliveries and acks without results still work"
        )
