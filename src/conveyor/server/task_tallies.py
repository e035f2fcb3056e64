"""Per task name, the deliveries a server settled and how long they ran: the metrics' `task` label.

Every queue's task records (`conveyor.server.task_records`) count here what each settled delivery
of a task ended as, and its run time. The metrics give the TASK_LABELS names run most since the
server started a `task` label of their own and count the rest as TASK_LABEL_OTHER, so that clients
cannot make label values without end: a scrape shows at most TASK_LABELS + 1 task names.

A name is labelled from its first run while fewer than TASK_LABELS are; the names labelled are
chosen again at each scrape, and no counter goes down for it: a name keeps its own counts since
the server started, and `other` counts the runs of names while they were not labelled (a name that
gains its label takes its counts out of `other`'s sum, and one that loses it brings in only what
comes after). Past TASK_NAMES_TRACKED names, new ones count as `other` for good.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.constants import TASK_LABEL_OTHER, TASK_LABELS, TASK_NAMES_TRACKED, TASK_SECONDS_BUCKETS
from conveyor.protocol.histograms import Histogram
from conveyor.protocol.task_pages import TaskState

# what a settled delivery may end as (a release is no run: not counted), in the order of `Tally.runs`
COUNTED = (TaskState.ACKED, TaskState.RETRIED, TaskState.FAILED, TaskState.EXPIRED, TaskState.DEAD)
_SLOT = {s: k for k, s in enumerate(COUNTED)}
# the deliveries whose run time counts: they ran to an end (a lease that ran out says nothing of the task)
TIMED = frozenset({TaskState.ACKED, TaskState.RETRIED, TaskState.FAILED})


@dataclass
class Tally:
    """One task name's settled deliveries, per state they ended in, and the run times of those timed."""

    runs: list[int] = field(default_factory=lambda: [0] * len(COUNTED))
    seconds: Histogram = field(default_factory=lambda: Histogram(TASK_SECONDS_BUCKETS))

    @property
    def volume(self) -> int:
        return sum(self.runs)

    def add(self, other: Tally, sign: int = 1) -> None:
        """Add `other`'s counts to these (sign -1: take them away)."""
        self.runs = [a + sign * b for a, b in zip(self.runs, other.runs, strict=True)]
        self.seconds.counts = [a + sign * b for a, b in zip(self.seconds.counts, other.seconds.counts, strict=True)]
        self.seconds.sum += sign * other.seconds.sum

    def copy(self) -> Tally:
        out = Tally()
        out.add(self)
        return out


class TaskTallies:
    """The tallies of a server's task names, and which of them the metrics label."""

    def __init__(self, labels: int = TASK_LABELS, tracked: int = TASK_NAMES_TRACKED) -> None:
        if labels < 0 or tracked < labels:
            raise ValueError(f"task labels must be in [0, {tracked}], got {labels}")
        self.labels, self.tracked = labels, tracked
        self._by_name: dict[str, Tally] = {}
        self._untracked = Tally()  # names past `tracked`: always `other`
        self._labelled: set[str] = set()
        self._other_base = Tally()  # what keeps `other` from going down as names gain or lose their label

    def count(self, task: str, state: TaskState, seconds: float, n: int = 1) -> None:
        """`n` deliveries of `task`, settled as `state` after `seconds` each."""
        slot = _SLOT.get(state)
        if slot is None:
            return
        t = self._by_name.get(task)
        if t is None:
            if len(self._by_name) >= self.tracked:
                t = self._untracked
            else:
                t = self._by_name[task] = Tally()
                if len(self._labelled) < self.labels and task != TASK_LABEL_OTHER:  # labelled from its first run
                    self._labelled.add(task)
        t.runs[slot] += n
        if state in TIMED:
            t.seconds.observe(seconds, n)

    def labelled(self) -> dict[str, Tally]:
        """What a scrape shows: the most run names, by name, and TASK_LABEL_OTHER for the rest (copies)."""
        held = self._labelled  # on a tie, a name keeps its label: fewer series come and go
        ranked = sorted(
            (n for n in self._by_name if n != TASK_LABEL_OTHER), key=lambda n: (-self._by_name[n].volume, n not in held, n)
        )
        now = set(ranked[: self.labels])
        for name in now - self._labelled:  # out of `other`'s sum from here: out of its base too
            self._other_base.add(self._by_name[name])
        for name in self._labelled - now:
            self._other_base.add(self._by_name[name], -1)
        self._labelled = now
        out = {name: self._by_name[name].copy() for name in ranked[: self.labels]}
        other = self._other_base.copy()
        other.add(self._untracked)
        for name, t in self._by_name.items():
            if name not in now:
                other.add(t)
        other.seconds.sum = max(0.0, other.seconds.sum)  # sums added and taken away: never below 0 by a rounding
        out[TASK_LABEL_OTHER] = other
        return out
