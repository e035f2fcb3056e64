"""QueueBackend: the queue operations the worker layer uses, as a protocol.

A `Consumer`, its `Settler` and a `ConsumerPool` need only these calls from the pool they work
for. `ShardedQueues` (queue servers over TCP, what a `QueuePool` holds as `pool.queues`) is the
production implementation; `conveyor.client.in_process.InProcessQueues` implements it over
in-memory stores in this process, so that worker logic (retries, dead letters, time limits, ack
batching) can be tested without starting a server. Signatures are those of `ShardedQueues`.

A worker also takes a copy on connections of its own (`with_own_connections()`: the settler, the
blob fetcher), so that their requests never wait behind the consumer's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from conveyor.message import DeadLetter, Message
from conveyor.protocol.framing import Limits
from conveyor.protocol.report import Counts
from conveyor.protocol.requests import QueueStats

if TYPE_CHECKING:
    from typing import Self


class ShardLimits(Protocol):
    """One shard as a consumer sees it: what its server accepts (the largest result it stores)."""

    @property
    def server_limits(self) -> Limits: ...


@runtime_checkable
class QueueBackend(Protocol):
    """The queue operations of a pool that `Consumer`, `Settler` and `ConsumerPool` call."""

    # --- shards: which a consumer serves first, and where a message lives
    def __len__(self) -> int:
        """How many shards (servers) the pool has."""
        ...

    @property
    def addresses(self) -> list[str]:
        """Where the shards are, in shard order (for error messages)."""
        ...

    @property
    def clients(self) -> Sequence[ShardLimits]:
        """The shards, in shard order (a consumer reads each one's `server_limits`)."""
        ...

    def assign(self, consumer: int, n_consumers: int) -> list[int]:
        """The shards consumer `consumer` of `n_consumers` serves first (it may steal from the others)."""
        ...

    def split_id(self, msg_id: int) -> tuple[int, int]:
        """(shard, id on that shard) of a pool-wide message id."""
        ...

    # --- consuming
    def get(
        self,
        queue: str,
        n: int = 1,
        *,
        lease_s: float | None = None,
        wait_s: float = 0.0,
        shards: Sequence[int] | None = None,
        tie: bool = False,
        consumer: str | None = None,
    ) -> list[Message]:
        """Lease up to n messages, waiting up to `wait_s` for some (a long poll).

        With `tie`, the leases also end when the connection that took them closes: a consumer's, so
        that a dead consumer's work runs again at once rather than after its leases (no connection:
        no effect), and a server's `wake` of the queue ends the wait. `consumer`: the name of the
        consumer fetching, which the servers' task records show (no server: no effect).
        """
        ...

    def get_blob(self, key: str, shard: int = 0) -> bytes | None:
        """The blob stored under its sha256 `key` on `shard` (an ad-hoc task's function), or None."""
        ...

    def ack(self, queue: str, ids: Sequence[int], results: Sequence[bytes | None] | None = None) -> list[bool]:
        """Finish messages with optional results; which acks took effect."""
        ...

    def nack(
        self,
        queue: str,
        ids: Sequence[int],
        errors: Sequence[str] | None = None,
        delay_s: float | Sequence[float] = 0.0,
        final: bool = False,
    ) -> list[bool]:
        """Give messages back (retried after `delay_s`) or, out of attempts or `final`, dead-letter them."""
        ...

    def release(self, queue: str, ids: Sequence[int]) -> list[bool]:
        """Give back delivered messages never started (the attempt not counted)."""
        ...

    def extend_lease(self, queue: str, ids: Sequence[int], lease_s: float) -> list[bool]:
        """Push the leases of delivered messages to now + `lease_s`."""
        ...

    def report(self, worker: str, counts: Counts) -> None:
        """A consumer's counts (shown by `stats`)."""
        ...

    # --- watching
    def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        """Counts per queue (of `queue` only, if given)."""
        ...

    def wait_drained(self, queues: Sequence[str] | None, wait_s: float) -> dict[str, QueueStats]:
        """Stats of `queues` (default: all) once nothing is pending in them, or after `wait_s`."""
        ...

    def check_reachable(self, limit_s: float, queues: Sequence[str] | None = None, what: str = "") -> None:
        """Raise `ServerUnreachableError` when a server has not answered for longer than `limit_s`."""
        ...

    def results(self, queue: str) -> Iterator[tuple[int, bytes]]:
        """Every stored result of `queue` as (message id, result)."""
        ...

    def dead_letters(self, queue: str) -> list[DeadLetter]:
        """Every dead letter of `queue`."""
        ...

    def with_own_connections(self) -> Self:
        """A copy on connections of its own, sharing no socket with this one (an in-process backend: itself)."""
        ...

    def close(self) -> None:
        """Let go of connections (a copy made for a thread closes its own)."""
        ...
