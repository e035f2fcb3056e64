"""`Histogram`: counts of observed values per bucket, cheap enough for every request and every task.

A server keeps one per operation (request durations) and a consumer one of its task run times,
which its report carries to the servers as plain counts (`as_counts`; the key layout is in
`conveyor.constants`). Both end as Prometheus histograms (`conveyor.server.metrics`).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import cast

from conveyor.constants import COUNT_TASK_SECONDS_LE, COUNT_TASK_SECONDS_SUM, TASK_SECONDS_BUCKETS


class Histogram:
    """Counts per bucket and the sum of the values.

    Counts per bucket (a value goes to the first upper bound it does not exceed; the last bucket,
    +Inf, takes the rest) and the sum of the values.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)) or not all(math.isfinite(b) for b in bounds):
            raise ValueError(f"histogram bounds must be finite and ascending, got {bounds!r}")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """Count `value`, `n` times (tasks of one delivery, settled together, ran as long)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound as Prometheus writes it, values at most that) per bucket, ending with +Inf."""
        out, total = [], 0
        for bound, n in zip([*map(_le, self.bounds), "+Inf"], self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def as_counts(self) -> dict[str, float]:
        """The report's keys for it (see COUNT_TASK_SECONDS_LE)."""
        out: dict[str, float] = {f"{COUNT_TASK_SECONDS_LE}{_le(b)}": n for b, n in zip(self.bounds, self.counts, strict=False)}
        out[f"{COUNT_TASK_SECONDS_LE}inf"] = self.counts[-1]
        out[COUNT_TASK_SECONDS_SUM] = self.sum
        return out

    @classmethod
    def from_counts(cls, counts: Mapping[str, float | str], bounds: Sequence[float] = TASK_SECONDS_BUCKETS) -> Histogram | None:
        """The histogram a report carries, with these bounds (None: it has none, or not these).

        The histogram a report carries, with these bounds (None: it has none, or not these: a report
        cannot make label values of its own).
        """
        keys = [f"{COUNT_TASK_SECONDS_LE}{_le(b)}" for b in bounds] + [f"{COUNT_TASK_SECONDS_LE}inf"]
        values = [counts.get(k) for k in keys]
        total = counts.get(COUNT_TASK_SECONDS_SUM)
        if not all(type(v) is int and v >= 0 for v in values) or type(total) not in (int, float):
            return None
        h = cls(bounds)
        h.counts = cast(list[int], values)
        h.sum = float(cast(float, total))
        return h


def _le(bound: float) -> str:
    """A bound as text that reads back as the same float ("0.005", "1.0")."""
    return repr(float(bound))
