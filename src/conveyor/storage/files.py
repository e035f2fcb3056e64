"""Durable file operations shared by the stores and the server: a directory's entries, a file replaced whole."""

from __future__ import annotations

import os
import time
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def keep_aside(path: Path, *, move: bool = False) -> Path:
    """Keep a damaged file as `<name>.damaged-<unix time>` beside it: a hard link (the caller then
    replaces `path`), or with `move`, a rename. Returns the new name."""
    aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
    if move:
        path.rename(aside)
    else:
        os.link(path, aside)
    return aside


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
