"""Completions (`conveyor.worker.completions`): the queue between a consumer's slots and its loop.

Its reader sleeps until enough runs have finished.
"""

from __future__ import annotations

import threading
import time

from conveyor.worker.completions import Completions


def test_take_returns_everything_in_order_and_empties_it() -> None:
    c: Completions[int] = Completions()
    assert c.take() == []
    for i in range(5):
        c.put(i)
    assert c.take() == [0, 1, 2, 3, 4]
    assert c.take() == []


def test_wait_returns_at_once_when_enough_are_in_and_after_the_timeout_when_not() -> None:
    c: Completions[int] = Completions()
    c.put(1)
    t0 = time.monotonic()
    c.wait(5.0, n=1)
    assert time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    c.wait(0.2, n=2)  # one is in, two wanted: the timeout ends it
    assert 0.15 <= time.monotonic() - t0 < 2.0
    assert c.take() == [1]


def test_wait_sleeps_through_fewer_puts_than_it_waits_for_and_wakes_at_the_last() -> None:
    c: Completions[int] = Completions()
    woke: list[float] = []
    started = threading.Event()

    def reader() -> None:
        started.set()
        c.wait(10.0, n=3)
        woke.append(time.monotonic())

    t = threading.Thread(target=reader)
    t.start()
    assert started.wait(5.0)
    deadline = time.monotonic() + 5.0
    while c._wake_at != 3 and time.monotonic() < deadline:  # the reader is asleep, waiting for three
        time.sleep(0.001)
    c.put(1)
    c.put(2)
    t.join(0.2)
    assert t.is_alive() and not woke  # two of three: still asleep
    put_at = time.monotonic()
    c.put(3)
    t.join(5.0)
    assert not t.is_alive() and woke[0] >= put_at
    assert c.take() == [1, 2, 3]
    c.put(4)  # the next wait wants one again
    c.wait(5.0)
    assert c.take() == [4]
