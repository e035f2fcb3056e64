"""The consumers' fetch policy (`conveyor.worker.pacing`): back-pressure, batching, and pinned
consumers holding fewer tasks as the queues drain. The consumers running it are in test_worker.py
and test_affinity.py."""

from __future__ import annotations

from conveyor.worker.pacing import Pacing


def test_never_more_held_than_max_concurrency() -> None:
    p = Pacing(max_concurrency=8, batch_size=4)
    assert p.want(running=0, left=None, busy=False) == 8  # the fetch asks for at most a batch of it
    assert p.want(running=8, left=None, busy=False) == 0
    assert p.want(running=7, left=10_000, busy=False) == 1  # the queue looks drained: take what is free


def test_with_the_queues_busy_a_consumer_waits_for_half_a_batch() -> None:
    p = Pacing(max_concurrency=16, batch_size=8)
    assert p.want(running=13, left=None, busy=True) == 0  # 3 free
    assert p.want(running=12, left=None, busy=True) == 4
    assert p.want(running=0, left=None, busy=True) == 16  # nothing running: no reason to wait


def test_pinned_it_waits_for_a_whole_batch_when_one_still_runs() -> None:
    p = Pacing(max_concurrency=32, batch_size=16, pinned=True)
    assert p.want(running=17, left=None, busy=True) == 0  # 15 free
    assert p.want(running=16, left=None, busy=True) == 16
    # no room for two batches: half a batch, as unpinned (else the core would idle during a fetch)
    assert Pacing(max_concurrency=8, batch_size=8, pinned=True).refill(8) == 4


def test_pinned_it_holds_half_an_even_share_of_what_is_left() -> None:
    p = Pacing(max_concurrency=32, batch_size=16, pinned=True, n_consumers=2, n_shards=2)
    assert p.hold(None) == 32  # not told: all it may
    assert p.hold(10_000) == 32
    assert p.hold(40) == 20  # 80 left on 2 shards, 2 consumers: half of 40 each
    assert p.hold(3) == 2  # never fewer than 2: one runs while the next is fetched
    assert p.hold(0) == 2
    assert Pacing(max_concurrency=1, batch_size=1, pinned=True).hold(0) == 1  # nor more than max_concurrency
    assert p.want(running=20, left=40, busy=True) == 0
    assert p.want(running=13, left=40, busy=True) == 0
    assert p.want(running=12, left=40, busy=True) == 8  # no room for two batches in 20: half a batch


def test_unpinned_it_holds_max_concurrency_whatever_is_left() -> None:
    # each slot may be a core of its own (processes) or wait on I/O: fewer held would idle them
    p = Pacing(max_concurrency=8, batch_size=4, n_consumers=4, n_shards=1)
    assert p.hold(1) == 8
    assert p.want(running=0, left=1, busy=False) == 8
