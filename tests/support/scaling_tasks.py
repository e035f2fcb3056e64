"""Tasks the thread-scaling tests run: one that waits, one that computes (queue "scaling")."""

from __future__ import annotations

import time

import conveyor

from .async_tasks import InFlight

IN_FLIGHT = InFlight()


@conveyor.task(queue="scaling", max_retries=0)
def waits(seconds: float) -> float:
    """Sleeps `seconds` (a call to a slow service), counted in IN_FLIGHT."""
    with IN_FLIGHT:
        time.sleep(seconds)
    return seconds


@conveyor.task(queue="scaling", max_retries=0)
def computes(seconds: float) -> float:
    """Keeps a core busy in Python for `seconds` of CPU, counted in IN_FLIGHT."""
    with IN_FLIGHT:
        end = time.thread_time() + seconds
        n = 0
        while time.thread_time() < end:
            n += 1
    return seconds
