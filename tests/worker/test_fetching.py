"""A consumer's fetch policy (`conveyor.worker.fetching`): which queue, how many, and the read-ahead.

Against InProcessQueues: real stores, no sockets. The rules of `Pacing` alone are in test_pacing.py;
the consumers running the policy in test_worker.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from conveyor.client.in_process import InProcessQueues
from conveyor.message import Message
from conveyor.worker.fetching import Fetcher
from conveyor.worker.held import ServedQueue
from conveyor.worker.pacing import Pacing, read_ahead
from conveyor.worker.selectors import Random
from conveyor.worker.stats import ConsumerStats

SLOTS = 4


@pytest.fixture
def queues() -> Iterator[InProcessQueues]:
    with InProcessQueues() as q:
        yield q


def fetcher(queues: InProcessQueues, reads_ahead: bool = False, batch_size: int | None = None) -> Fetcher:
    served = [ServedQueue.of("jobs", batch_size)]
    pacing = Pacing(SLOTS, batch_size)
    return Fetcher(queues, served, Random(), [0], 1, ConsumerStats(), threading.Event(), pacing, reads_ahead)


def test_it_fetches_what_its_pacing_wants_and_a_short_fetch_says_the_queues_look_drained(queues: InProcessQueues) -> None:
    queues.put("jobs", [Message(b"x") for _ in range(6)])
    f = fetcher(queues)
    assert f.want(0) == SLOTS and f.looks_drained  # nothing fetched yet: nothing said of the queues
    got, extra = f.fetch(f.want(0), lambda q: 0.0)
    assert len(got) == SLOTS and extra == [] and f.left == 2 and not f.looks_drained
    assert f.want(SLOTS) == 0 and f.short_of(SLOTS) >= 1  # every slot is busy: wait for one to finish
    got, _ = f.fetch(f.want(0), lambda q: 0.0)  # 4 asked for, 2 there
    assert len(got) == 2 and f.looks_drained
    assert f.stats.fetches == 2 and f.stats.fetched_by_shard == {0: 6} and f.stats.stolen == 0


def test_a_stopping_consumer_fetches_nothing(queues: InProcessQueues) -> None:
    queues.put("jobs", [Message(b"x")])
    f = fetcher(queues)
    assert f.fetch(SLOTS, lambda q: None) == ([], [])  # None: a stop since the loop looked
    assert queues.stats("jobs")["jobs"].ready == 1


@pytest.mark.parametrize("reads_ahead", [True, False])
def test_the_read_ahead_follows_the_pace_tasks_finish_at_only_when_it_reads_ahead(
    queues: InProcessQueues, reads_ahead: bool
) -> None:
    f = fetcher(queues, reads_ahead)
    f.look(100.0)
    f.finished(1000)
    f.look(101.0)  # 1000 finished in a second: smoothed, a pace of 300 a second
    ahead = read_ahead(300.0)
    assert ahead > 0
    assert f.want(0) == SLOTS + (ahead if reads_ahead else 0)
