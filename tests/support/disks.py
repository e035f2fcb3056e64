"""Small real file systems for full-disk tests: a tmpfs, or an ext4 image on a loop device.

Mounted by the test itself (root needed) and unmounted whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

KINDS = ("tmpfs", "ext4")


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


@contextlib.contextmanager
def small_disk(kind: str, where: Path, mib: int) -> Iterator[Path]:
    """A file system of `mib` MiB mounted at `where` (made here); skipped where it cannot be mounted."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small file system needs root and mount(8)")
    where.mkdir(parents=True, exist_ok=True)
    image = where.with_suffix(".img")
    if kind == "tmpfs":
        done = _run("mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(where))
    else:
        if shutil.which("mkfs.ext4") is None:
            pytest.skip("mkfs.ext4 is not installed")
        with open(image, "wb") as fh:
            fh.truncate(mib * 1024 * 1024)
        made = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
        assert made.returncode == 0, made.stderr
        done = _run("mount", "-o", "loop", str(image), str(where))
    if done.returncode != 0:
        image.unlink(missing_ok=True)
        pytest.skip(f"cannot mount a {kind} here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        gone = _run("umount", str(where))
        if gone.returncode != 0:  # a process still holds a file there: detach it now, it goes when they do
            _run("umount", "-l", str(where))
        image.unlink(missing_ok=True)


def fill(path: Path, chunk: int = 64 * 1024) -> int:
    """Write a file at `path` until the disk is full; returns its size."""
    size = 0
    with open(path, "wb", buffering=0) as fh:
        while True:
            try:
                size += fh.write(b"\xff" * chunk)
            except OSError:
                if chunk <= 512:
                    return size
                chunk = max(chunk // 8, 512)
