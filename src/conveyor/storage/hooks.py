"""The hooks of a store: what an implementation fills in.

The hooks of a store: what an implementation fills in (where bytes are kept, and how changes are
persisted), under the state that the shared operations (`Store`, `StoreInspection`) decide on.

The shared logic calls them in a fixed order: `_prepare` before anything changes, `_keep_*` before
the state marks messages finished, `_record` after, `_commit` at the end of an operation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from conveyor.errors import StoreClosedError
from conveyor.message import DeadLetter, MessageBatch
from conveyor.storage.state import QueueState


class StoreHooks(ABC):
    """The state a store's operations share, and the hooks that persist what they decide."""

    queue: str
    clock: Callable[[], float]  # leases and delays follow it (see `steady_clock`)
    _state: QueueState
    _failed_ids: set[int]  # every failed id, forgotten or not
    _closed: bool

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.queue!r} is closed")

    @abstractmethod
    def _store_messages(
        self, ids: Sequence[int], payloads: Sequence[bytes], headers: Sequence[dict[str, str]] | None, now: float
    ) -> None:
        """Keep new messages' payloads and headers (state already holds their scheduling fields)."""

    @abstractmethod
    def _reserve_ids(self, upto: int) -> None:
        """Make sure ids below `upto` are never assigned again, even after a crash.

        Make sure ids below `upto` are never assigned again, even after a crash (a durable store
        records that before the ids are used). A put starts here: it may be refused (disk full).
        """

    @abstractmethod
    def _load(self, ids: Sequence[int], lease_s: float) -> MessageBatch:
        """The delivered messages `ids`, with attempts and lease from the state."""

    @abstractmethod
    def _prepare(self, n: int) -> None:
        """Make sure the records of a transition of `n` messages can be written.

        Make sure the records of a transition of `n` messages can be written whatever happens to the
        free space meanwhile (raises DiskFullError when they cannot be). Called before anything
        changes, so that a full disk refuses an operation whole rather than failing it halfway.
        """

    @abstractmethod
    def _sizes(self, ids: Sequence[int]) -> Sequence[int]:
        """Bytes each message takes in a reply (payload, headers and per-message fields, or a little more)."""

    @abstractmethod
    def _keep_results(self, ids: Sequence[int], results: Sequence[bytes | None]) -> Any:
        """Write the results of messages about to be ACKED, before they are (None: no result).

        Returns what `_record` needs to find them.
        """

    @abstractmethod
    def _keep_dead(self, ids: Sequence[int], errors: Sequence[str], now: float) -> Any:
        """Write the dead letters of DELIVERED messages about to be FAILED, before they are."""

    @abstractmethod
    def _record(self, ids: Sequence[int], status: int, kept: Any, now: float) -> None:
        """Persist a transition of `ids` to `status` (`kept`: what `_keep_results` or `_keep_dead` returned).

        Must not fail for lack of space: `_prepare` made room for it.
        """

    @abstractmethod
    def _commit(self) -> None:
        """Make what the last operation wrote durable under the store's policy."""

    @abstractmethod
    def result(self, msg_id: int) -> bytes | None:
        """The stored result of an acked message, or None (no result, or not acked)."""

    @abstractmethod
    def _kept_ids(self, dead: bool) -> Iterable[int]:
        """Ids holding a stored result (dead=False) or a dead letter (dead=True), in any order."""

    @abstractmethod
    def _dead_letter(self, msg_id: int) -> DeadLetter:
        """The dead letter of a FAILED id that `_kept_ids(True)` lists."""

    @abstractmethod
    def _forget(self, ids: list[int]) -> int:
        """Drop stored results and dead letters of these ids; returns how many were dropped."""

    @abstractmethod
    def _bytes_on_disk(self) -> int: ...

    @abstractmethod
    def _close(self) -> None: ...
