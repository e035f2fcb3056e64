"""Blobs: content-addressed bytes a server keeps beside its queues (pickled functions, keyed by sha256)."""

from __future__ import annotations

import contextlib
import hashlib
import re
from pathlib import Path

from conveyor.constants import ERR_BAD_ARGUMENT
from conveyor.errors import RequestError
from conveyor.storage.files import write_atomically


class Blobs:
    """Content-addressed bytes (key: sha256 hex), on disk under the data dir or in memory."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mem: dict[str, bytes] = {}

    def put(self, data: bytes) -> str:
        key = hashlib.sha256(data).hexdigest()
        if self.path is None:
            self._mem[key] = data
        elif not (self.path / key).exists():
            self.path.mkdir(exist_ok=True)
            write_atomically(self.path / key, data)
        return key

    def get(self, key: str) -> bytes | None:
        _check_key(key)
        if self.path is None:
            return self._mem.get(key)
        try:
            return (self.path / key).read_bytes()
        except FileNotFoundError:
            return None

    def forget(self, keys: list[str]) -> int:
        """Remove blobs nothing needs any more; returns how many there were."""
        for key in keys:
            _check_key(key)
        n = 0
        for key in keys:
            if self.path is None:
                n += self._mem.pop(key, None) is not None
                continue
            with contextlib.suppress(FileNotFoundError):
                (self.path / key).unlink()
                n += 1
        return n


def _check_key(key: str) -> None:
    if type(key) is not str or not re.fullmatch(r"[0-9a-f]{64}", key):
        raise RequestError(ERR_BAD_ARGUMENT, f"a blob key is 64 hex digits (sha256), got {key!r:.80}")
