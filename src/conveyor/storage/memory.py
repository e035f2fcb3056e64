"""MemoryStore: a transient queue store; everything lives in this process and dies with it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np

from conveyor.constants import DEFAULT_LEASE_S, DEFAULT_MAX_ATTEMPTS, ST_ACKED, ST_FAILED, ST_NONE
from conveyor.message import DeadLetter, Message, MessageBatch, headers_bytes, make_message
from conveyor.storage.base import Store

_FINISHED = (ST_ACKED, ST_FAILED, ST_NONE)


class MemoryStore(Store):
    """A queue store in memory. Fast, and lost when the process ends."""

    def __init__(self, queue: str = "", *, max_attempts: int = DEFAULT_MAX_ATTEMPTS, lease_s: float = DEFAULT_LEASE_S) -> None:
        super().__init__(
            queue,
            max_attempts,
            lease_s,
            {"payload": object, "headers": object, "nb": np.float64, "at": np.float64, "size": np.int64},
        )
        self._results: dict[int, bytes] = {}
        self._dead: dict[int, DeadLetter] = {}

    def _store_messages(
        self, ids: np.ndarray, payloads: Sequence[bytes], headers: Sequence[dict[str, str]] | None, now: float
    ) -> None:
        a = int(ids[0]) - self._state.base
        b = a + len(ids)
        cols = self._state.cols
        cols["payload"][a:b] = payloads
        cols["headers"][a:b] = None if headers is None else [dict(h) if h else None for h in headers]
        cols["nb"][a:b] = cols["until"][a:b]
        cols["at"][a:b] = now
        # what a message takes in a reply: its payload, its headers, and about 64 bytes of fields
        cols["size"][a:b] = np.fromiter(map(len, payloads), np.int64, len(ids)) + 64
        if headers is not None and any(headers):
            cols["size"][a:b] += np.fromiter(map(headers_bytes, headers), np.int64, len(ids))

    def _load(self, ids: np.ndarray, lease_s: float) -> MessageBatch:
        idx = ids - self._state.base
        c = self._state.cols
        return MessageBatch(
            self.queue,
            lease_s,
            ids.tolist(),
            c["priority"][idx].tolist(),
            c["attempts"][idx].tolist(),
            c["at"][idx].tolist(),
            c["nb"][idx].tolist(),
            c["max_attempts"][idx].tolist(),
            [{} if h is None else dict(h) for h in c["headers"][idx].tolist()],
            c["payload"][idx].tolist(),
        )

    def _message(self, msg_id: int, lease_s: float) -> Message:
        i = msg_id - self._state.base
        c = self._state.cols
        h = c["headers"][i]
        return make_message(
            msg_id,
            self.queue,
            c["payload"][i],
            int(c["priority"][i]),
            int(c["attempts"][i]),
            float(c["at"][i]),
            float(c["nb"][i]),
            lease_s,
            int(c["max_attempts"][i]),
            {} if h is None else dict(h),
        )

    def _reserve_ids(self, upto: int) -> None:
        pass  # ids live and die with this process: none can be reused after a crash

    def _prepare(self, n: int) -> None:
        pass  # nothing to write

    def _sizes(self, ids: np.ndarray) -> np.ndarray:
        return cast(np.ndarray, self._state.cols["size"][ids - self._state.base])

    def _keep_results(self, ids: np.ndarray, results: Sequence[bytes | None]) -> Any:
        return results

    def _keep_dead(self, ids: np.ndarray, errors: Sequence[str], now: float) -> Any:
        return [DeadLetter(self._message(i, 0.0), e, now) for i, e in zip(ids.tolist(), errors, strict=True)]

    def _record(self, ids: np.ndarray, status: int, kept: Any, now: float) -> None:
        if status == ST_ACKED and kept is not None:
            for i, r in zip(ids.tolist(), kept, strict=True):
                if r is not None:
                    self._results[i] = r
        elif status == ST_FAILED:
            self._dead.update(zip(ids.tolist(), kept, strict=True))
        if status in _FINISHED:
            # drop the body so finished messages hold no memory while the window slides
            idx = ids - self._state.base
            self._state.cols["payload"][idx] = None
            self._state.cols["headers"][idx] = None

    def _commit(self) -> None:
        pass

    def result(self, msg_id: int) -> bytes | None:
        self._check_open()
        return self._results.get(msg_id)

    def _kept_ids(self, dead: bool) -> Iterable[int]:
        return (self._dead if dead else self._results).keys()

    def _dead_letter(self, msg_id: int) -> DeadLetter:
        return self._dead[msg_id]

    def _forget(self, ids: list[int]) -> int:
        n = 0
        for i in ids:
            n += (self._results.pop(i, None) is not None) + (self._dead.pop(i, None) is not None)
        return n

    def _bytes_on_disk(self) -> int:
        return 0

    def _close(self) -> None:
        self._results.clear()
        self._dead.clear()
