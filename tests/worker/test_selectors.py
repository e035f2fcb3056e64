"""Queue selection algorithms (conveyor.worker.selectors), with ndkale's semantics."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from conveyor.errors import ConfigError
from conveyor.worker import QueueConfig
from conveyor.worker.selectors import (
    SELECTORS,
    HighestPriorityFirst,
    HighestPriorityLottery,
    Lottery,
    LotteryLottery,
    QueueSelector,
    Random,
    ReducedLottery,
    selector_class,
)

# ndkale's fixture: three queues, only the middle one has work
Q1, Q2, Q3 = QueueConfig("queue1", 100), QueueConfig("queue2", 50), QueueConfig("queue3", 1)
QUEUES = [Q3, Q1, Q2]  # any order: selectors rank by priority themselves
ONLY_Q2 = {"queue2"}


class Probe:
    """A lazy `needs_work` that records which queues were probed."""

    def __init__(self, with_work: set[str]) -> None:
        self.with_work = with_work
        self.probed: list[str] = []

    def __call__(self, q: QueueConfig) -> bool:
        self.probed.append(q.name)
        return q.name in self.with_work


def draws(selector: QueueSelector, queues: Sequence[QueueConfig], needs_work: object = None, n: int = 3000) -> Counter[str]:
    c: Counter[str] = Counter()
    for _ in range(n):
        q = selector.get_queue(queues, needs_work)  # type: ignore[arg-type]
        c[q.name if q is not None else None] += 1  # type: ignore[index]
    return c


# --- ReducedLottery -----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(50))
def test_reduced_lottery_returns_the_only_non_empty_queue(seed: int) -> None:
    probe = Probe(ONLY_Q2)
    assert ReducedLottery(random.Random(seed)).get_queue(QUEUES, probe) is Q2
    assert len(probe.probed) == len(set(probe.probed)) <= 3  # each queue probed at most once


def test_reduced_lottery_with_every_queue_empty_long_polls_a_lottery_winner() -> None:
    probe = Probe(set())
    c = draws(ReducedLottery(random.Random(1)), QUEUES, probe)
    assert set(c) == {"queue1", "queue2", "queue3"} and c["queue1"] > c["queue2"] > c["queue3"]
    assert Counter(probe.probed) == {"queue1": 3000, "queue2": 3000, "queue3": 3000}  # each once per call


def test_reduced_lottery_skips_queues_that_cannot_win_a_lottery() -> None:
    parked = QueueConfig("parked", 0)  # outside 1..100: never drawn, even with work
    assert ReducedLottery(random.Random(0)).get_queue([parked, Q3], {"parked"}) is Q3
    assert ReducedLottery(random.Random(0)).get_queue([parked], {"parked"}) is None


def test_reduced_lottery_follows_priorities_among_queues_with_work() -> None:
    c = draws(ReducedLottery(random.Random(2)), QUEUES, {"queue1", "queue2"}, n=6000)
    assert set(c) == {"queue1", "queue2"}
    assert c["queue1"] / 6000 == pytest.approx(100 / 150, abs=0.03)


# --- Lottery ------------------------------------------------------------------------------------
def test_lottery_tickets_are_priorities() -> None:
    c = draws(Lottery(random.Random(3)), QUEUES, n=30000)
    for q in (Q1, Q2, Q3):
        assert c[q.name] / 30000 == pytest.approx(q.priority / 151, abs=0.01)


def test_lottery_ignores_work() -> None:
    assert draws(Lottery(random.Random(4)), QUEUES, ONLY_Q2)["queue1"] > 0


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        ([QueueConfig("queue1", 99)], "queue1"),
        ([], None),
        ([QueueConfig("queue1", 101), QueueConfig("queue2", 0)], None),  # ndkale's "bad" queues
        ([QueueConfig("a", -5), QueueConfig("b", 0)], None),
        ([QueueConfig("a", 0), QueueConfig("b", 40), QueueConfig("c", 101)], "b"),
    ],
)
def test_lottery_over_invalid_priorities_returns_none(queues: list[QueueConfig], expected: str | None) -> None:
    for seed in range(20):
        q = Lottery(random.Random(seed)).get_queue(queues)
        assert (q.name if q else None) == expected


# --- HighestPriorityFirst / HighestPriorityLottery ----------------------------------------------
def test_highest_priority_first() -> None:
    hpf = HighestPriorityFirst(random.Random(0))
    assert hpf.get_queue(QUEUES, ONLY_Q2) is Q2
    assert hpf.get_queue(QUEUES, {"queue2", "queue3"}) is Q2
    assert hpf.get_queue(QUEUES, set()) is Q1  # all empty: the highest-priority queue
    assert hpf.get_queue(QUEUES) is Q1  # unknown work: assume all have some
    assert hpf.get_queue([], set()) is None
    probe = Probe({"queue2"})
    hpf.get_queue(QUEUES, probe)
    assert probe.probed == ["queue1", "queue2"]  # in priority order, stopping at the first with work


def test_highest_priority_first_serves_parked_queues_too() -> None:
    parked = QueueConfig("parked", 500)
    assert HighestPriorityFirst().get_queue([Q1, parked], {"parked", "queue1"}) is parked


def test_ties_keep_configured_order() -> None:
    a, b = QueueConfig("a", 10), QueueConfig("b", 10)
    assert HighestPriorityFirst().get_queue([a, b], set()) is a
    assert HighestPriorityFirst().get_queue([b, a], set()) is b


def test_highest_priority_lottery() -> None:
    hpl = HighestPriorityLottery(random.Random(5))
    assert hpl.get_queue(QUEUES, ONLY_Q2) is Q2
    c = draws(hpl, QUEUES, set())  # all empty: a lottery over all queues
    assert set(c) == {"queue1", "queue2", "queue3"} and c["queue1"] > c["queue2"] > c["queue3"]
    assert hpl.get_queue([QueueConfig("bad", 0)], set()) is None


# --- LotteryLottery -----------------------------------------------------------------------------
def test_lottery_lottery_returns_the_first_drawn_queue_with_work() -> None:
    probe = Probe({"queue1"})
    assert LotteryLottery(random.Random(6)).get_queue(QUEUES, probe) is Q1
    assert probe.probed[-1] == "queue1" and len(probe.probed) <= 10


def test_lottery_lottery_gives_up_after_ten_draws() -> None:
    # queue3 (1 ticket of 151) rarely wins: most calls draw 10 empty queues, then settle for a lottery
    probe = Probe({"queue3"})
    sel = LotteryLottery(random.Random(7))
    c = draws(sel, QUEUES, probe, n=1000)
    assert c["queue3"] < 200 and c["queue1"] > 400
    assert len(probe.probed) <= 10 * 1000
    assert LotteryLottery(random.Random(7), draws=3).draws == 3


def test_lottery_lottery_with_no_valid_priorities_returns_none() -> None:
    assert LotteryLottery(random.Random(0)).get_queue([QueueConfig("x", 0)], {"x"}) is None


# --- Random -------------------------------------------------------------------------------------
def test_random_ignores_priority_and_work() -> None:
    parked = QueueConfig("parked", 0)
    c = draws(Random(random.Random(8)), [Q1, parked], set(), n=4000)
    assert c["parked"] / 4000 == pytest.approx(0.5, abs=0.04)
    assert Random().get_queue([]) is None


# --- common behaviour ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_seeded_selectors_are_reproducible(name: str) -> None:
    def run(seed: int) -> list[str | None]:
        sel = SELECTORS[name](random.Random(seed))
        out = []
        for i in range(200):
            q = sel.get_queue(QUEUES, {"queue1", "queue2", "queue3"} if i % 3 else ONLY_Q2)
            out.append(q.name if q else None)
        return out

    assert run(11) == run(11)


@pytest.mark.parametrize("name", sorted(SELECTORS))
@pytest.mark.parametrize(
    "needs_work",
    [lambda q: q.name == "queue2", {"queue2"}, ["queue2"], frozenset({"queue2"})],
    ids=["callable", "set", "list", "frozenset"],
)
def test_needs_work_forms_agree(name: str, needs_work: Callable[[QueueConfig], bool] | set[str]) -> None:
    a = SELECTORS[name](random.Random(9))
    b = SELECTORS[name](random.Random(9))
    for _ in range(100):
        assert a.get_queue(QUEUES, needs_work) is b.get_queue(QUEUES, Probe({"queue2"}))


def test_all_six_selectors_are_known() -> None:
    assert sorted(SELECTORS) == sorted(
        ["Random", "Lottery", "HighestPriorityFirst", "HighestPriorityLottery", "LotteryLottery", "ReducedLottery"]
    )


class Always(QueueSelector):
    """A custom selector for the dotted-path lookup."""

    def get_queue(self, queues, needs_work=None):  # type: ignore[no-untyped-def]
        return queues[0] if queues else None


def test_selector_class_lookup() -> None:
    assert selector_class() is ReducedLottery
    assert selector_class("Lottery") is Lottery
    assert selector_class("kale.queue_selector.HighestPriorityFirst") is HighestPriorityFirst
    assert selector_class(f"{__name__}.Always") is Always
    assert selector_class(Always) is Always
    with pytest.raises(ConfigError, match="unknown queue selector 'Fastest'"):
        selector_class("Fastest")
    with pytest.raises(ConfigError, match="cannot load queue selector"):
        selector_class("no.such.module.Selector")
    with pytest.raises(ConfigError, match="not a QueueSelector subclass"):
        selector_class("collections.Counter")
