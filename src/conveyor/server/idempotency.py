"""Idempotency keys of one queue: a put whose message carries a key already seen is not stored again.

The server answers such a put with the id of the message first put under the key. The most recent
DEDUPE_MAX_KEYS keys are remembered; a durable queue keeps them in `keys.log` beside its store
(records `crc32 | key length | id | key`, synced with the queue's group commit, compacted on
open when mostly superseded), so a retried publish after a crash or a lost reply is still dropped.
The server writes a put's keys before its messages (see `handlers._put_once`); id 0 means "none".
So the keys may name ids no segment shows: a server opening a queue keeps its store's ids past
`highest` (`Store.keep_ids_past`).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from pathlib import Path

from conveyor.constants import DEDUPE_MAX_KEYS, KEYS_LOG_NAME, MAX_KEY_BYTES
from conveyor.storage.files import keep_aside, store_error, write_all, write_atomically

log = logging.getLogger("conveyor.server.queue_server")

_REC = struct.Struct("<IHQ")  # crc32 of the rest, key length, message id; then the key bytes


class Dedupe:
    """key -> message id, the most recent `limit` kept (on disk when `path` is given)."""

    def __init__(self, path: Path | None, limit: int = DEDUPE_MAX_KEYS) -> None:
        self.path = path
        self.limit = limit
        self._ids: dict[str, int] = {}
        self._fd = -1
        self._size = 0  # of keys.log
        self.highest = 0  # the highest id keys.log named when loaded: the store must never give it again
        self._dirty = False
        self._lock = threading.Lock()  # `sync` runs in a group commit's thread
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        f = path / KEYS_LOG_NAME
        data = f.read_bytes() if f.exists() else b""
        pos = records = 0
        damaged: list[tuple[int, int]] = []  # (offset, bytes) skipped
        while pos < len(data):
            rec = _record_at(data, pos)
            if rec is None:  # damaged: resume at the next place a whole record checks out
                nxt = next((p for p in range(pos + 1, len(data)) if _record_at(data, p) is not None), len(data))
                damaged.append((pos, nxt - pos))
                pos = nxt
                continue
            key, msg_id, pos = rec
            self._remember(key, msg_id)
            self.highest = max(self.highest, msg_id)
            records += 1
        if damaged:
            aside = keep_aside(f)
            torn = damaged == [(damaged[0][0], len(data) - damaged[0][0])]
            log.warning(
                "%s: %s skipped (offset, bytes: %s); %d keys kept; original kept as %s. A retried put "
                "with a lost key is stored again",
                f,
                "a torn tail" if torn else "damaged records",
                damaged[:10],
                len(self._ids),
                aside.name,
            )
        if records > 2 * max(len(self._ids), 1024) or damaged:
            self._rewrite(f)  # mostly superseded or evicted keys, or damage: start clean
        with open(f, "ab") as fh:  # made if missing; opened for appends when a key comes (see `_out`)
            self._size = fh.tell()

    def _rewrite(self, f: Path) -> None:
        write_atomically(f, b"".join(_record(k, i) for k, i in self._ids.items()))

    def _remember(self, key: str, msg_id: int) -> None:
        self._ids.pop(key, None)
        self._ids[key] = msg_id
        if len(self._ids) > self.limit:
            del self._ids[next(iter(self._ids))]  # the oldest

    def get(self, key: str) -> int | None:
        return self._ids.get(key)

    def add(self, pairs: list[tuple[str, int]]) -> None:
        """Remember keys of messages about to be stored, all or none.

        Remember keys of messages about to be stored (written to the OS now, durable at the next
        `sync`); all or none (a full disk raises DiskFullError and remembers none).
        """
        if self.path is not None and pairs:
            data = b"".join(_record(k, i) for k, i in pairs)
            with self._lock:
                try:
                    write_all(self._out(), data, self._size)
                except OSError as e:
                    raise store_error(e, f"{self.path}: idempotency keys") from e
                self._size += len(data)
                self._dirty = True
        for k, i in pairs:
            self._remember(k, i)

    def _out(self) -> int:
        if self._fd < 0:
            assert self.path is not None
            self._fd = os.open(self.path / KEYS_LOG_NAME, os.O_WRONLY | os.O_APPEND)
        return self._fd

    @property
    def dirty(self) -> bool:
        """Keys written and not synced yet."""
        return self._dirty

    def sync(self) -> None:
        """Make the keys written so far durable (from a group commit's thread: `add` never waits for it)."""
        with self._lock:
            if self._fd < 0 or not self._dirty:
                return
            self._dirty = False
            fd = os.dup(self._fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self, sync: bool = True) -> None:
        """Sync (unless told not to) and let go of the descriptor; a later `add` opens it again."""
        with self._lock:
            if self._fd >= 0:
                if self._dirty and sync:
                    os.fsync(self._fd)
                self._dirty = False
                os.close(self._fd)
                self._fd = -1


def _record_at(data: bytes, pos: int) -> tuple[str, int, int] | None:
    """(key, id, end) of the record at `pos`, or None if there is no whole, valid one there."""
    if pos + _REC.size > len(data):
        return None
    crc, klen, msg_id = _REC.unpack_from(data, pos)
    end = pos + _REC.size + klen
    if not 0 < klen <= MAX_KEY_BYTES or end > len(data) or zlib.crc32(data[pos + 4 : end]) != crc:
        return None
    try:
        return data[pos + _REC.size : end].decode(), msg_id, end
    except UnicodeDecodeError:
        return None


def _record(key: str, msg_id: int) -> bytes:
    k = key.encode()
    body = struct.pack("<HQ", len(k), msg_id) + k
    return struct.pack("<I", zlib.crc32(body)) + body


def check_key(key: object) -> str:
    if type(key) is not str or not key or len(key.encode()) > MAX_KEY_BYTES:
        raise ValueError(f"an idempotency key must be a non-empty string of at most {MAX_KEY_BYTES} bytes, got {key!r:.60}")
    return key
