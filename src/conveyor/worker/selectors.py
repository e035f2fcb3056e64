"""Which queue a worker serves next: ndkale's six queue selection algorithms.

A selector picks one queue from the configured ones for the next round of fetches (a worker then
serves it for up to `num_iterations` batches, moving on early when a fetch comes back empty).
Queues are anything with `name` and `priority` (a `QueueConfig`); a higher priority is more
important. Which queues have work is told by `needs_work`, either

- a callable `needs_work(queue) -> bool`, probed lazily: only the queues an algorithm draws are
  probed, which is the point of ReducedLottery when a probe is a round trip to a server;
- a collection of the names of the queues that have work; or
- None: unknown, so every queue is assumed to have work (ndkale assumes so when it cannot tell).

The lottery (Lottery, and the lottery steps of the others) gives each queue as many tickets as its
priority, counting only queues with a priority in 1..100: a queue outside that range never wins
a lottery (a way to park a queue), and a lottery with no such queue returns None.

Randomness comes from the `random.Random` given to the selector, so a seeded one makes the
choices reproducible.
"""

from __future__ import annotations

import importlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from typing import Protocol, TypeVar, Union

from conveyor.constants import DEFAULT_SELECTOR, LOTTERY_LOTTERY_DRAWS, LOTTERY_PRIORITY_MAX, LOTTERY_PRIORITY_MIN
from conveyor.errors import ConfigError


class PrioritizedQueue(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def priority(self) -> int: ...


Q = TypeVar("Q", bound=PrioritizedQueue)
NeedsWork = Union[Callable[[Q], bool], Collection[str], None]  # noqa: UP007 (generic alias over a TypeVar)


def by_priority(queues: Sequence[Q]) -> list[Q]:
    """Queues highest priority first; ties keep their configured order (as ndkale sorts them)."""
    return sorted(queues, key=lambda q: q.priority, reverse=True)


class QueueSelector(ABC):
    """Base of the queue selection algorithms.

    `get_queue(queues, needs_work)` returns one queue, or None when it cannot pick one (no queues; a
    lottery with no valid priority).
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng if rng is not None else random.Random()

    @abstractmethod
    def get_queue(self, queues: Sequence[Q], needs_work: NeedsWork[Q] = None) -> Q | None: ...

    # --- shared steps ---------------------------------------------------------------------------
    @staticmethod
    def _probe(needs_work: NeedsWork[Q]) -> Callable[[Q], bool]:
        if needs_work is None:
            return lambda q: True
        if callable(needs_work):
            return needs_work
        names = frozenset(needs_work)
        return lambda q: q.name in names

    def lottery(self, queues: Sequence[Q]) -> Q | None:
        """Draw one queue with probability proportional to its priority (only priorities 1..100 count)."""
        valid = [q for q in by_priority(queues) if LOTTERY_PRIORITY_MIN <= q.priority <= LOTTERY_PRIORITY_MAX]
        total = sum(q.priority for q in valid)
        if not total:
            return None
        ticket = self.rng.randrange(total)
        for q in valid:
            ticket -= q.priority
            if ticket < 0:
                return q
        raise AssertionError("unreachable: the tickets add up to total")

    def highest_needing_work(self, queues: Sequence[Q], needs_work: NeedsWork[Q]) -> Q | None:
        """The highest-priority queue that has work, probing in priority order; None if none has."""
        probe = self._probe(needs_work)
        return next((q for q in by_priority(queues) if probe(q)), None)


class Random(QueueSelector):
    """Any queue, uniformly, whatever its priority or work."""

    def get_queue(self, queues: Sequence[Q], needs_work: NeedsWork[Q] = None) -> Q | None:
        return self.rng.choice(list(queues)) if queues else None


class Lottery(QueueSelector):
    """A lottery over all queues (priority = tickets), whatever their work."""

    def get_queue(self, queues: Sequence[Q], needs_work: NeedsWork[Q] = None) -> Q | None:
        return self.lottery(queues)


class HighestPriorityFirst(QueueSelector):
    """The highest-priority queue with work; if none has work, the highest-priority queue."""

    def get_queue(self, queues: Sequence[Q], needs_work: NeedsWork[Q] = None) -> Q | None:
        q = self.highest_needing_work(queues, needs_work)
        if q is not None:
            return q
        return by_priority(queues)[0] if queues else None


class HighestPriorityLottery(QueueSelector):
    """The highest-priority queue with work; if none has work, a lottery over all queues."""

    def get_queue(self, queues: Sequence[Q], needs_work: NeedsWork[Q] = None) -> Q | None:
        q = self.highest_needing_work(queues, needs_work)
        return q if q is not None else self.lottery(queues)


class LotteryLottery(QueueSelector):
    """Lotteries over all queues until one draws a queue with work, at most `draws` (10) times.

    Then one more lottery, whose queue is served (long-polled) even if empty.
    """

    def __init__(self, rng: random.Random | None = None, draws: int = LOTTERY_LOTTERY_DRAWS) -> None:
        super().__init__(rng)
        self.draws = draws

    def get_queue(self, queues: Sequence[Q], needs_work: NeedsWork[Q] = None) -> Q | None:
        probe = self._probe(needs_work)
        for _ in range(self.draws):
            q = self.lottery(queues)
            if q is not None and probe(q):
                return q
        return self.lottery(queues)


class ReducedLottery(QueueSelector):
    """The default.

    A lottery over the queues not yet found empty: a drawn queue with work is returned, an empty one
    leaves the pool and the lottery is drawn again. When every queue has been found empty (or no
    candidate has a valid priority), a lottery over all queues picks one to long-poll. So the only
    queue with work is always found, probing each queue at most once.
    """

    def get_queue(self, queues: Sequence[Q], needs_work: NeedsWork[Q] = None) -> Q | None:
        probe = self._probe(needs_work)
        candidates = list(queues)
        while candidates:
            q = self.lottery(candidates)
            if q is None:  # the rest cannot win a lottery (ndkale would fail here; we stop drawing)
                break
            if probe(q):
                return q
            candidates.remove(q)
        return self.lottery(queues)


SELECTORS: dict[str, type[QueueSelector]] = {
    c.__name__: c for c in (Random, Lottery, HighestPriorityFirst, HighestPriorityLottery, LotteryLottery, ReducedLottery)
}


def selector_class(name: str | type[QueueSelector] = DEFAULT_SELECTOR) -> type[QueueSelector]:
    """A selector class by name.

    One of SELECTORS ("ReducedLottery"; ndkale's dotted "kale.queue_selector.ReducedLottery" too), or
    "package.module.Class" of your own subclass.
    """
    if isinstance(name, type):
        if not issubclass(name, QueueSelector):
            raise ConfigError(f"QUEUE_SELECTOR {name!r} is not a QueueSelector subclass")
        return name
    if type(name) is not str:
        raise ConfigError(f"QUEUE_SELECTOR must be a str or a QueueSelector subclass, got {name!r}")
    if name in SELECTORS:
        return SELECTORS[name]
    module, _, attr = name.rpartition(".")
    if module == "kale.queue_selector" and attr in SELECTORS:
        return SELECTORS[attr]
    if not module:
        raise ConfigError(f"unknown queue selector {name!r}; choose one of {sorted(SELECTORS)} or give a dotted path")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"cannot load queue selector {name!r}: {e}") from None
    return selector_class(cls)
