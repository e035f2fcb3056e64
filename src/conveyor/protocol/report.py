"""A consumer's report, declared once: what it tells every server, and how each reader shows it.

A consumer sends its report (`report` operation) every few seconds to every server; `stats` hands
the reports back, each with `seen`, the seconds since the server heard it. `ConsumerReport` is the
report as a typed value: the consumer builds one, and the readers (server metrics, `conveyor stats`,
the dashboard, Spark's consumer stats) read the reports through it, each figure as `Figure` and its
`Shown` say. A figure added here is a metric, a `conveyor stats` column, a dashboard figure and
(counted since the start) a column of Spark's consumer stats, with no change to any of them.

On the wire a report is a flat map (the `report` operation's `counts`): each scalar field under its
name, the served queues, rows and task times under the prefixed keys `conveyor.constants` names.

A consumer that stops cleanly (stopped, or done with its queues) says so in its last report
(`ended`), so that a reader tells a consumer that finished from one lost (killed, or cut off),
which just stops reporting. A report without it (from a consumer of an earlier version) reads as
not ended.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum

from conveyor.constants import COUNT_ROW_MESSAGES, COUNT_ROWS, COUNT_SERVES
from conveyor.protocol.histograms import Histogram

Counts = dict[str, float | str]  # a report on the wire: numbers, and the consumer's host as a string


class Shown(Enum):
    """What a figure of the report is, which says how a reader shows it."""

    TOTAL = "counted since the consumer started: a counter in the metrics, a column of Spark's consumer stats"
    NOW = "as it stands at the report: a gauge in the metrics"
    WHO = "which process the consumer is: shown beside it, no metric"


@dataclass(frozen=True, slots=True)
class Figure:
    """How a number of the report is shown: its help text (metrics, docs) and what it is."""

    help: str
    shown: Shown


def _figure(help: str, shown: Shown) -> int:
    """A number of the report, 0 unless given, with its `Figure` (read back by `figures`)."""
    return field(default=0, metadata={Figure: Figure(help, shown)})


@dataclass(frozen=True, slots=True)
class Rows:
    """Of one map job queue (messages with H_ROWS): the messages a consumer settled, and their rows."""

    messages: int
    rows: int


@dataclass(frozen=True, slots=True)
class ConsumerReport:
    """A consumer's report: who it is, its figures, what it serves, its rows and task times.

    `consumer` is its name, the key the servers keep its report under (not in `counts`). `seen` is
    set by the server that hands the report back: seconds since it heard it (0 as the consumer sends it).
    """

    consumer: str
    host: str = ""  # where the consumer runs (a string of at most MAX_HOST_CHARS on the wire)
    pid: int = _figure("The consumer's process id.", Shown.WHO)
    processed: int = _figure("Tasks that succeeded (acked).", Shown.TOTAL)
    failed: int = _figure("Tasks that failed (nacked).", Shown.TOTAL)
    retried: int = _figure("Failed tasks put back in their queue to run again.", Shown.TOTAL)
    dead: int = _figure("Failed tasks that became dead letters.", Shown.TOTAL)
    timed_out: int = _figure("Tasks stopped at their time limit.", Shown.TOTAL)
    running: int = _figure("Tasks the consumer is running or holds.", Shown.NOW)
    stolen: int = _figure("Messages taken from shards not assigned to the consumer.", Shown.TOTAL)
    serves: tuple[str, ...] = ()  # the queues it serves: a wait on a queue none serves says so
    rows: dict[str, Rows] = field(default_factory=dict)  # per map job queue
    task_seconds: Histogram | None = None  # how long its tasks ran (TASK_SECONDS_BUCKETS)
    ended: bool = False  # its last report: the consumer stopped cleanly (on the wire as 1, absent while it runs)
    seen: float = 0.0

    def figures(self, *shown: Shown) -> dict[str, int]:
        """The figures declared as `shown` (all, if none is given), by name, in declaration order."""
        return {name: getattr(self, name) for name, f in FIGURES.items() if not shown or f.shown in shown}

    def to_counts(self) -> Counts:
        """The report as the `report` operation carries it."""
        out: Counts = {HOST: self.host, **self.figures()}
        if self.ended:
            out[ENDED] = 1
        out.update({COUNT_SERVES + q: 1 for q in self.serves})
        for q, r in self.rows.items():
            out[COUNT_ROW_MESSAGES + q], out[COUNT_ROWS + q] = r.messages, r.rows
        if self.task_seconds is not None:
            out.update(self.task_seconds.as_counts())
        return out

    @classmethod
    def from_counts(cls, consumer: str, counts: Mapping[str, float | str]) -> ConsumerReport:
        """The report a server handed back for `consumer`; a figure missing or not a number reads as 0.

        A server checks only that every count is a number (the host a string): a consumer of another
        version may leave a figure out, or send one it does not know; neither is an error here.
        """
        host = counts.get(HOST)
        rows = {
            k[len(COUNT_ROWS) :]: Rows(_int(counts.get(COUNT_ROW_MESSAGES + k[len(COUNT_ROWS) :])), _int(v))
            for k, v in counts.items()
            if k.startswith(COUNT_ROWS)
        }
        return cls(
            consumer,
            host if isinstance(host, str) else "",
            **{name: _int(counts.get(name)) for name in FIGURES},
            serves=tuple(queues_served(counts)),
            rows=rows,
            task_seconds=Histogram.from_counts(counts),
            ended=has_ended(counts),
            seen=_float(counts.get(SEEN)),
        )


FIGURES: dict[str, Figure] = {f.name: f.metadata[Figure] for f in fields(ConsumerReport) if Figure in f.metadata}
# the wire keys of the host (the one string a report carries), of `ended` (1 in a consumer's last
# report) and of `seen` (set by the server)
HOST, ENDED, SEEN = "host", "ended", "seen"
assert {HOST, ENDED, SEEN} <= {f.name for f in fields(ConsumerReport)}


def has_ended(counts: Mapping[str, float | str]) -> bool:
    """Whether a report on the wire is its consumer's last: it stops."""
    return counts.get(ENDED) == 1


def serves(counts: Mapping[str, float | str], queue: str) -> bool:
    """Whether a report on the wire says its consumer serves `queue`."""
    return COUNT_SERVES + queue in counts


def queues_served(counts: Mapping[str, float | str]) -> list[str]:
    """The queues a report on the wire says its consumer serves (COUNT_SERVES)."""
    return [k[len(COUNT_SERVES) :] for k in counts if k.startswith(COUNT_SERVES)]


def _int(v: object) -> int:
    return int(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0


def _float(v: object) -> float:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0
