"""Durable file operations shared by the stores and the server: a directory's entries, a file replaced whole."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, *parts: bytes) -> None:
    """Replace `path` with `parts` (written in order, not joined): a crash leaves the old file or the new one.

    Temp file, fsync, rename over `path`, fsync the directory.
    """
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        for part in parts:
            fh.write(part)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
