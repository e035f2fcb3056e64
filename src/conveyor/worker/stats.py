"""`ConsumerStats`: what a consumer did, summed over a pool of them and printed when a worker stops.

Also its tally, kept in memory its pool shares, so that the counts of a consumer process that dies
are not lost.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields
from typing import Any

from conveyor.constants import H_ROWS
from conveyor.message import Message


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
    handed_back: int = 0  # still running when the consumer stopped: given back, the attempt not counted
    fetched_by_shard: dict[int, int] = field(default_factory=dict)
    # per queue of a map job (messages with H_ROWS): [messages settled, their rows], for its progress in rows
    rows: dict[str, list[int]] = field(default_factory=dict)

    def __add__(self, other: ConsumerStats) -> ConsumerStats:
        """The counts of two consumers together (a pool of them)."""
        shards = dict(self.fetched_by_shard)
        for s, n in other.fetched_by_shard.items():
            shards[s] = shards.get(s, 0) + n
        rows = {q: list(v) for q, v in self.rows.items()}
        for q, (m, r) in other.rows.items():
            mine = rows.setdefault(q, [0, 0])
            mine[0], mine[1] = mine[0] + m, mine[1] + r
        counts = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self) if f.type == "int"}
        return ConsumerStats(**counts, fetched_by_shard=shards, rows=rows)

    def settled(self, m: Message) -> None:
        """`m` was acked, or failed for good: its rows, if it says how many it carries, are done."""
        if (n := m.headers.get(H_ROWS)) is not None and n.isdecimal():
            mine = self.rows.setdefault(m.queue, [0, 0])
            mine[0], mine[1] = mine[0] + 1, mine[1] + int(n)

    def summary(self) -> str:
        """One line, as `conveyor worker` prints it when it stops."""
        unsettled = f", unsettled {self.unsettled:,} (back in their queues once their leases end)" if self.unsettled else ""
        back = f", handed back {self.handed_back:,} (running at the stop: back in their queues)" if self.handed_back else ""
        return (
            f"processed {self.processed:,}, failed {self.failed:,} (retried {self.retried:,}, dead {self.dead:,}), "
            f"timed out {self.timed_out:,}, stolen {self.stolen:,}{back}{unsettled}"
        )


TALLY_EVERY_S = 0.5  # how often a consumer process copies its counts to its tally
TALLIED = [f.name for f in fields(ConsumerStats) if f.type == "int"]  # the counts a tally holds (not those per shard)


def write_tally(stats: ConsumerStats, tally: Any) -> None:
    """Copy the counts of `stats` to `tally`, a shared array of len(TALLIED) integers."""
    tally[:] = [getattr(stats, name) for name in TALLIED]


def keep_tally(stats: ConsumerStats, tally: Any, done: threading.Event) -> None:
    """Copy the counts of `stats` (a running consumer's) to `tally` every TALLY_EVERY_S until `done`.

    Should the process die, its pool reads them there (`tallied`).
    """
    while not done.wait(TALLY_EVERY_S):
        write_tally(stats, tally)


def tallied(tally: Any) -> ConsumerStats:
    """The counts a consumer process copied to `tally` before it died."""
    return ConsumerStats(**dict(zip(TALLIED, tally[:], strict=True)))
