"""Tasks the worker benchmarks publish (a module of its own, so consumer processes can import it)."""

from __future__ import annotations

import conveyor
from workloads import busy


@conveyor.task(queue="bench", max_retries=0)
def noop(payload: bytes) -> None:
    """The no-op reference task."""


@conveyor.task(queue="bench", max_retries=0)
def spin(seconds: float) -> float:
    """The skewed reference task: busy CPU for `seconds`."""
    return busy(seconds)


def dq_noop() -> None:
    """daskqueue's no-op task (bench_peers.py; it calls `func(*args)`): importable, so pickled by reference."""
