"""The reference workloads the benchmarks use (see the architecture page).

- no-op: messages of ~100-byte payloads whose task does nothing;
- skewed: CPU busy-loop durations drawn from a lognormal, rescaled to a total (the shape of
  real work items: most short, a few very long);
- documents: the demo's corpus (`conveyor.cli.corpus`), and its busy loop.
"""

from __future__ import annotations

import math

import numpy as np

from compat import busy, documents

__all__ = ["NOOP_PAYLOAD", "busy", "documents", "noop", "skewed"]

NOOP_PAYLOAD = b"x" * 100


def noop(payload: bytes = NOOP_PAYLOAD) -> None:
    """The no-op task."""


def skewed(n: int = 2000, total_s: float = 10.0, seed: int = 7, ordered: bool = False) -> list[float]:
    """Busy-loop durations: `default_rng(seed).lognormal(log(0.002), 1.5, n)` rescaled to sum to `total_s`.

    `skewed()` is the "skewed" workload, `skewed(12000, 60.0)` "skewed-60", and with `ordered=True`
    (ascending durations) "skewed-60-sorted".
    """
    d = np.random.default_rng(seed).lognormal(mean=math.log(0.002), sigma=1.5, size=n)
    d *= total_s / d.sum()
    return sorted(d.tolist()) if ordered else d.tolist()
