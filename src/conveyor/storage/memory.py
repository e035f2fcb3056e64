"""MemoryStore: a transient queue store; everything lives in this process and dies with it."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from operator import add
from typing import Any

from conveyor.constants import DEFAULT_LEASE_S, DEFAULT_MAX_ATTEMPTS, ST_ACKED, ST_FAILED, ST_NONE
from conveyor.message import DeadLetter, Message, MessageBatch, headers_bytes, make_message
from conveyor.storage.base import Store
from conveyor.storage.columns import fill, gather, where

_FINISHED = (ST_ACKED, ST_FAILED, ST_NONE)


class MemoryStore(Store):
    """A queue store in memory. Fast, and lost when the process ends."""

    def __init__(self, queue: str = "", *, max_attempts: int = DEFAULT_MAX_ATTEMPTS, lease_s: float = DEFAULT_LEASE_S) -> None:
        super().__init__(queue, max_attempts, lease_s, {"nb": "d", "at": "d", "size": "q"}, ("payload", "headers"))
        self._results: dict[int, bytes] = {}
        self._dead: dict[int, DeadLetter] = {}

    def _store_messages(
        self, ids: Sequence[int], payloads: Sequence[bytes], headers: Sequence[dict[str, str]] | None, now: float
    ) -> None:
        st = self._state
        n = len(ids)
        a = ids[0] - st.base
        b = a + n
        st.objects["payload"][a:b] = payloads
        if headers is not None:
            st.objects["headers"][a:b] = [dict(h) if h else None for h in headers]
        cols = st.cols
        cols["nb"][a:b] = st.until[a:b]
        cols["at"][a:b] = array("d", (now,)) * n
        # what a message takes in a reply: its payload, its headers, and about 64 bytes of fields
        size = array("q", map((64).__add__, map(len, payloads)))
        if headers is not None and any(headers):
            size = array("q", map(add, size, map(headers_bytes, headers)))
        cols["size"][a:b] = size

    def _load(self, ids: Sequence[int], lease_s: float) -> MessageBatch:
        st = self._state
        at = where(ids, st.base)
        c = st.cols
        return MessageBatch(
            self.queue,
            lease_s,
            list(ids),
            gather(st.priority, at),
            gather(st.attempts, at),
            gather(c["at"], at),
            gather(c["nb"], at),
            gather(st.max_attempts, at),
            [{} if h is None else dict(h) for h in gather(st.objects["headers"], at)],
            gather(st.objects["payload"], at),
        )

    def _message(self, msg_id: int, lease_s: float) -> Message:
        st = self._state
        i = msg_id - st.base
        c = st.cols
        h = st.objects["headers"][i]
        return make_message(
            msg_id,
            self.queue,
            st.objects["payload"][i],
            st.priority[i],
            st.attempts[i],
            c["at"][i],
            c["nb"][i],
            lease_s,
            st.max_attempts[i],
            {} if h is None else dict(h),
        )

    def _reserve_ids(self, upto: int) -> None:
        pass  # ids live and die with this process: none can be reused after a crash

    def _prepare(self, n: int) -> None:
        pass  # nothing to write

    def _sizes(self, ids: Sequence[int]) -> Sequence[int]:
        return gather(self._state.cols["size"], where(ids, self._state.base))

    def _keep_results(self, ids: Sequence[int], results: Sequence[bytes | None]) -> Any:
        return results

    def _keep_dead(self, ids: Sequence[int], errors: Sequence[str], now: float) -> Any:
        return [DeadLetter(self._message(i, 0.0), e, now) for i, e in zip(ids, errors, strict=True)]

    def _record(self, ids: Sequence[int], status: int, kept: Any, now: float) -> None:
        if status == ST_ACKED and kept is not None:
            for i, r in zip(ids, kept, strict=True):
                if r is not None:
                    self._results[i] = r
        elif status == ST_FAILED:
            self._dead.update(zip(ids, kept, strict=True))
        if status in _FINISHED:
            # drop the body so finished messages hold no memory while the window slides
            at = where(ids, self._state.base)
            fill(self._state.objects["payload"], at, None)
            fill(self._state.objects["headers"], at, None)

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
