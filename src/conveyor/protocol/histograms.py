"""`Histogram`: counts of observed values per bucket, cheap enough for every request and every task.

A server keeps one per operation (request durations) and a consumer one of its task run times,
which its report carries to the servers as plain counts (`as_counts`; the key layout is in
`conveyor.constants`). Both end as Prometheus histograms (`conveyor.server.metrics`).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence

from conveyor.constants import COUNT_TASK_SECONDS_LE, COUNT_TASK_SECONDS_SUM


class Histogram:
    """Counts per bucket (a value goes to the first upper bound it does not exceed; the last bucket,
    +Inf, takes the rest) and the sum of the values."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)) or not all(math.isfinite(b) for b in bounds):
            raise ValueError(f"histogram bounds must be finite and ascending, got {bounds!r}")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

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
    def from_counts(cls, counts: Mapping[str, float | str]) -> Histogram | None:
        """The histogram a report carries (None: it has none, or its keys do not read as one)."""
        buckets: dict[float, int] = {}
        try:
            for k, v in counts.items():
                if k.startswith(COUNT_TASK_SECONDS_LE) and not isinstance(v, str):
                    buckets[float(k.removeprefix(COUNT_TASK_SECONDS_LE))] = int(v)
            total = counts.get(COUNT_TASK_SECONDS_SUM)
            if math.inf not in buckets or not isinstance(total, (int, float)) or min(buckets.values()) < 0:
                return None
            h = cls(sorted(b for b in buckets if b != math.inf))
        except (ValueError, OverflowError):  # a bound or a count that is no number, or NaN
            return None
        h.counts = [buckets[b] for b in h.bounds] + [buckets[math.inf]]
        h.sum = float(total)
        return h


def _le(bound: float) -> str:
    """A bound as text that reads back as the same float ("0.005", "1.0")."""
    return repr(float(bound))
