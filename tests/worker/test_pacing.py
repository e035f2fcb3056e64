"""The consumers' fetch policy (`conveyor.worker.pacing`).

Back-pressure, batching, and pinned consumers holding fewer tasks as the queues drain. The consumers
running it are in test_worker.py and test_affinity.py.
"""

from __future__ import annotations

import pytest

from conveyor.constants import READ_AHEAD_MAX, READ_AHEAD_WINDOW_S, REFILL_MAX
from conveyor.message import Message
from conveyor.worker.held import Held, due_extensions, over_limit
from conveyor.worker.pacing import Pacing, Throughput, read_ahead


def test_never_more_held_than_the_slots() -> None:
    p = Pacing(slots=8, batch_size=4)
    assert p.want(running=0, left=None, busy=False) == 8  # the fetch asks for at most a batch of it
    assert p.want(running=8, left=None, busy=False) == 0
    assert p.want(running=7, left=10_000, busy=False) == 1  # the queue looks drained: take what is free


def test_with_the_queues_busy_a_consumer_waits_for_half_a_batch() -> None:
    p = Pacing(slots=16, batch_size=8)
    assert p.want(running=13, left=None, busy=True) == 0  # 3 free
    assert p.want(running=12, left=None, busy=True) == 4
    assert p.want(running=0, left=None, busy=True) == 16  # nothing running: no reason to wait


def test_the_loop_sleeps_until_enough_tasks_finish_for_a_fetch() -> None:
    p = Pacing(slots=16, batch_size=8)
    assert p.short_of(running=16, left=None, busy=True) == 4  # a fetch waits for 4 free (half a batch)
    assert p.short_of(running=13, left=None, busy=True) == 1
    assert p.short_of(running=16, left=None, busy=False) == 1  # the queues are not busy: any free slot is fetched for
    for running in range(17):  # `want` asks for more once that many of the running have finished
        k = p.short_of(running=running, left=None, busy=True)
        if p.want(running=running, left=None, busy=True) == 0:
            assert p.want(running=running - k, left=None, busy=True) > 0
            assert k == 1 or p.want(running=running - k + 1, left=None, busy=True) == 0


def test_with_hundreds_of_async_slots_no_more_than_refill_max_wait_idle_for_a_batch() -> None:
    """Async calls in flight: half of 256 slots idle for a batch would halve them; the fetch comes at REFILL_MAX free.

    Threads keep the half batch: one fetch of hundreds for hundreds of quick tasks.
    """
    assert Pacing(slots=512, batch_size=1000).want(running=512 - 255, left=None, busy=True) == 0
    p = Pacing(slots=256, batch_size=None, idle_max=REFILL_MAX)
    assert p.want(running=256 - REFILL_MAX + 1, left=None, busy=True) == 0
    assert p.want(running=256 - REFILL_MAX, left=None, busy=True) == REFILL_MAX
    assert p.short_of(running=256, left=None, busy=True) == REFILL_MAX
    # what is held beyond the slots (read ahead) may go first: the slots stay full
    assert p.want(running=256 + 500 - 250, left=None, busy=True, read_ahead=500) == 0
    assert p.want(running=256 + 500 - 378, left=None, busy=True, read_ahead=500) == 378  # half of 756


def test_pinned_it_waits_for_a_whole_batch_when_one_still_runs() -> None:
    p = Pacing(slots=32, batch_size=16, pinned=True)
    assert p.want(running=17, left=None, busy=True) == 0  # 15 free
    assert p.want(running=16, left=None, busy=True) == 16
    # no room for two batches: half a batch, as unpinned (else the core would idle during a fetch)
    assert Pacing(slots=8, batch_size=8, pinned=True).refill(8) == 4


def test_pinned_it_holds_half_an_even_share_of_what_is_left() -> None:
    p = Pacing(slots=32, batch_size=16, pinned=True, n_consumers=2, n_shards=2)
    assert p.hold(None) == 32  # not told: all it may
    assert p.hold(10_000) == 32
    assert p.hold(40) == 20  # 80 left on 2 shards, 2 consumers: half of 40 each
    assert p.hold(3) == 2  # never fewer than 2: one runs while the next is fetched
    assert p.hold(0) == 2
    assert Pacing(slots=1, batch_size=1, pinned=True).hold(0) == 1  # nor more than its slots
    assert p.want(running=20, left=40, busy=True) == 0
    assert p.want(running=13, left=40, busy=True) == 0
    assert p.want(running=12, left=40, busy=True) == 8  # no room for two batches in 20: half a batch


def test_unpinned_it_holds_its_slots_whatever_is_left() -> None:
    # each slot may be a core of its own (processes) or wait on I/O: fewer held would idle them
    p = Pacing(slots=8, batch_size=4, n_consumers=4, n_shards=1)
    assert p.hold(1) == 8
    assert p.want(running=0, left=1, busy=False) == 8


def test_quick_tasks_are_read_ahead_and_the_read_ahead_goes_as_the_queues_drain() -> None:
    assert read_ahead(0.0) == 0 and read_ahead(4.0) == 0  # long tasks: none wait in line for a slot
    assert read_ahead(10_000.0) == int(10_000 * READ_AHEAD_WINDOW_S)
    assert read_ahead(1e9) == READ_AHEAD_MAX
    p = Pacing(slots=8, batch_size=None, n_consumers=2, n_shards=2)
    assert p.want(running=0, left=None, busy=False, read_ahead=500) == 508  # no batch size: all it may hold
    assert p.want(running=300, left=None, busy=True, read_ahead=500) == 0  # waits for half of it to be free
    assert p.want(running=200, left=None, busy=True, read_ahead=500) == 308
    assert p.hold(100_000, read_ahead=500) == 508
    assert p.hold(100, read_ahead=500) == 50  # a half share of what is left
    assert p.hold(4, read_ahead=500) == 8  # never fewer than the slots


def test_throughput_is_smoothed() -> None:
    t = Throughput()
    t.update(0.0)
    t.add(100)
    assert t.update(1.0) == pytest.approx(100 * Throughput.SMOOTHING)
    t.add(100)
    assert 0 < t.update(2.0) < 100


def test_a_time_limit_counts_from_the_start_not_from_the_wait_in_line() -> None:
    m = Message(id=1, queue="q", lease_s=10.0)
    held = [Held.fetched(m, 1.0, now=0.0)]
    assert over_limit(held, lambda _id: None, now=100.0) == []  # still in line: not started
    assert over_limit(held, lambda _id: 99.5, now=100.0) == []
    assert over_limit(held, lambda _id: 98.0, now=100.0) == [(held[0], 1.0)]
    assert due_extensions(held, now=100.0) == {("q", 10.0): [1]}
    assert due_extensions(held, now=100.1) == {}  # its next is a third of the lease on
