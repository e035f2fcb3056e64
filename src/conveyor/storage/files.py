"""File operations shared by the stores and the server.

File operations shared by the stores and the server: durable directory entries, a file replaced
whole, a damaged file kept aside, space made sure of before it is needed, a directory locked for one
process, and OS errors said plainly.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.constants import LOCK_NAME
from conveyor.errors import DiskFullError, StoreError

if TYPE_CHECKING:
    from _ctypes import CFuncPtr

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # the errnos of a full disk (or quota)
_FALLOC_FL_KEEP_SIZE = 1
_FALLOC_FL_PUNCH_HOLE = 2


def _libc_fallocate() -> CFuncPtr | None:
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).fallocate
    except (OSError, AttributeError):  # not Linux (or no glibc): no preallocation
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_fallocate = _libc_fallocate()


def preallocate(fd: int, offset: int, length: int) -> bool:
    """Allocate disk blocks for `fd`'s bytes [offset, offset + length) without changing its size.

    Allocate disk blocks for `fd`'s bytes [offset, offset + length) without changing its size, so
    that appends into them cannot fail for lack of space. False where the OS or file system cannot
    (then appends take their chances). Raises OSError (ENOSPC) when the space is not there.
    """
    if _fallocate is None or length <= 0:
        return False
    if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


def unallocate(fd: int, offset: int, length: int) -> None:
    """Give back blocks that `preallocate` took beyond the end of the file (best effort)."""
    if _fallocate is not None and length > 0:
        _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length)


def store_error(e: OSError, what: str) -> StoreError:
    """A store error for an OS error, saying plainly when the disk is full or descriptors ran out."""
    if e.errno in DISK_FULL:
        return DiskFullError(f"{what}: the disk is full ({e.strerror}); nothing was changed: retry once space is freed")
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return StoreError(
            f"{what}: too many open files ({e.strerror}): raise the descriptor limit (ulimit -n) "
            "or use fewer queues or connections"
        )
    return StoreError(f"{what}: {type(e).__name__}: {e}")


def write_all(fd: int, data: bytes, size: int, *, sync_cut: bool = True) -> None:
    """Append `data` to `fd` (opened O_APPEND, now `size` bytes long) whole, or not at all.

    Append `data` to `fd` (opened O_APPEND, now `size` bytes long) whole, or not at all: after a
    failed or short write the file is cut back to `size` and the error raised.

    sync_cut: sync the cut, so that a machine crash cannot bring back what the caller was told is
    not there (off for a file that must not be synced before others: the index, before its segments).
    """
    try:
        written = os.write(fd, data)
        while written < len(data):  # short writes only happen on full disks or signals
            written += os.write(fd, data[written:])
    except OSError:
        os.ftruncate(fd, size)
        if sync_cut:
            os.fsync(fd)
        raise


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def aside_name(path: Path) -> Path:
    """Where a damaged file is kept: `<name>.damaged-<unix time>` beside it."""
    return path.with_name(f"{path.name}.damaged-{int(time.time())}")


def keep_aside(path: Path, *, move: bool = False) -> Path:
    """Keep a damaged file as `aside_name(path)`: a hard link (the caller then replaces `path`), or with `move`, a rename.

    Returns the new name.
    """
    aside = aside_name(path)
    if move:
        path.rename(aside)
    else:
        os.link(path, aside)
    return aside


def write_atomically(path: Path, *parts: bytes) -> None:
    """Replace `path` with `parts` (written in order, not joined): a crash leaves the old file or the new one.

    Temp file, fsync, rename over `path`, fsync the directory. A failure (a full disk) leaves the
    old file and no temp file.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            for part in parts:
                fh.write(part)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def lock_dir(path: Path) -> int:
    """Lock the store directory for this process; the OS drops the lock when the process dies."""
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreError(f"{path}: the store is open elsewhere (in this or another process)") from None
    return fd
