"""The demo's synthetic corpus and the CPU busy-loop that stands for a page's work.

The corpus: documents of 1-200 pages (heavy-tailed) whose per-page cost varies. The benchmarks in
bench/ use both too.
"""

from __future__ import annotations

import math
import time

import numpy as np


def busy(seconds: float) -> float:
    """Spin the CPU for `seconds` of this thread's CPU time; returns them.

    CPU time, not wall time, so that work measured on an oversubscribed machine is still the work done.
    """
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return seconds


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
