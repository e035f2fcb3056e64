"""`ConsumerStats`: what a consumer did, summed over a pool of them and printed when a worker stops."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class ConsumerStats:
    """What a consumer did: `processed` (acked), `failed` (nacked, retried or dead), and more."""

    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    timed_out: int = 0
    stolen: int = 0  # messages taken from shards not assigned to this consumer
    fetches: int = 0  # requests that brought messages (processed / fetches: messages per request)
    released: int = 0
    unsettled: int = 0  # acks and nacks the servers never took (their messages come back after their leases)
    fetched_by_shard: dict[int, int] = field(default_factory=dict)

    def __add__(self, other: ConsumerStats) -> ConsumerStats:
        """The counts of two consumers together (a pool of them)."""
        shards = dict(self.fetched_by_shard)
        for s, n in other.fetched_by_shard.items():
            shards[s] = shards.get(s, 0) + n
        counts = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self) if f.name != "fetched_by_shard"}
        return ConsumerStats(**counts, fetched_by_shard=shards)

    def summary(self) -> str:
        """One line, as `conveyor worker` prints it when it stops."""
        unsettled = f", unsettled {self.unsettled:,} (back in their queues once their leases end)" if self.unsettled else ""
        return (f"processed {self.processed:,}, failed {self.failed:,} (retried {self.retried:,}, dead {self.dead:,}), "
                f"timed out {self.timed_out:,}, stolen {self.stolen:,}{unsettled}")  # fmt: skip
