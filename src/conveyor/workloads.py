"""The reference workloads every benchmark and the demo use (see the architecture page).

- no-op: messages of ~100-byte payloads whose task does nothing;
- skewed: CPU busy-loop durations drawn from a lognormal, rescaled to a total (the shape of
  real work items: most short, a few very long);
- documents: documents of 1-200 pages (heavy-tailed) whose per-page cost varies.
"""

from __future__ import annotations

import math
import time

import numpy as np

NOOP_PAYLOAD = b"x" * 100


def noop(payload: bytes = NOOP_PAYLOAD) -> None:
    """The no-op task."""


def busy(seconds: float) -> float:
    """Spin the CPU for `seconds` of this thread's CPU time; returns them.

    CPU time, not wall time, so that work measured on an oversubscribed machine is still the work done.
    """
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return seconds


def skewed(n: int = 2000, total_s: float = 10.0, seed: int = 7, ordered: bool = False) -> list[float]:
    """Busy-loop durations: `default_rng(seed).lognormal(log(0.002), 1.5, n)` rescaled to sum to `total_s`.

    `skewed()` is the "skewed" workload, `skewed(12000, 60.0)` "skewed-60", and with `ordered=True`
    (ascending durations) "skewed-60-sorted".
    """
    d = np.random.default_rng(seed).lognormal(mean=math.log(0.002), sigma=1.5, size=n)
    d *= total_s / d.sum()
    return sorted(d.tolist()) if ordered else d.tolist()


def documents(n_pages: int, seed: int = 11) -> tuple[list[int], list[float]]:
    """A corpus of about `n_pages` pages: (pages per document, cost in seconds per page, page by page).

    Pages per document are heavy-tailed in 1..200 (a Zipf-like draw); each document has a base
    per-page cost (lognormal around 2 ms) and each page varies around it.
    """
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    while sum(sizes) < n_pages:
        sizes.append(int(min(200, rng.zipf(1.6))))
    sizes[-1] -= sum(sizes) - n_pages
    if sizes[-1] <= 0:
        sizes.pop()
    base = rng.lognormal(math.log(0.002), 0.8, len(sizes))
    costs = np.concatenate([b * rng.lognormal(0.0, 0.5, s) for b, s in zip(base, sizes, strict=True)])
    return sizes, costs.tolist()
