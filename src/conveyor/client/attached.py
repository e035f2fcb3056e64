"""What works on a pool's servers from this process: the consumer pools a `QueuePool`'s waits look after."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Protocol


class Attached(Protocol):
    """What works on a pool's servers from this process (a `ConsumerPool`): see `Attachments`."""

    queue_names: list[str]  # the queues it serves: the waits on them look after it

    def check(self) -> None:
        """Look after its processes; raise its own error (consumers that cannot start, say)."""
        ...

    def cancel(self, graceful: bool = True) -> None:
        """Stop, gracefully: running tasks finish and are settled."""
        ...


class Attachments:
    """The consumer pools started on a `QueuePool` (`pool.attached`), until they stop.

    The pool's waits (`gather`, a handle's `result()`, `join`) on a queue one serves call its
    `check()` as they go, so consumers that cannot start fail the wait at once with their own error
    (not its timeout), and consumers that died are restarted meanwhile; and the pool's `close()`
    stops them before the servers it started (their running tasks are settled while those still
    answer).
    """

    def __init__(self) -> None:
        self._users: list[Attached] = []
        self._lock = threading.Lock()  # consumer pools start and stop from any thread

    def add(self, user: Attached) -> None:
        """Tie `user` (a started `ConsumerPool`) to the pool until it is removed."""
        with self._lock:
            if all(u is not user for u in self._users):
                self._users.append(user)

    def remove(self, user: Attached) -> None:
        """Untie `user` (a stopped `ConsumerPool`)."""
        with self._lock:
            self._users = [u for u in self._users if u is not user]

    def check(self, queues: Iterable[str] | None = None) -> None:
        """Call `check()` of what is attached on any of `queues` (None: all): its error is the wait's.

        One on other queues is left alone: its error would point a wait on work it does not do the
        wrong way.
        """
        wanted = None if queues is None else set(queues)
        for user in list(self._users):
            if wanted is None or not wanted.isdisjoint(user.queue_names):
                user.check()

    def cancel_all(self) -> None:
        """Stop everything attached, gracefully (before the servers it works on stop)."""
        for user in list(self._users):
            user.cancel()

    def __bool__(self) -> bool:
        return bool(self._users)
