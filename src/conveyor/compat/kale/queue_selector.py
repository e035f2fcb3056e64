"""ndkale's queue selectors (`kale.queue_selector`): its six algorithms and `SelectQueueBase`, over Conveyor's.

A selector is made, as in ndkale, with a queue information object (`queue_info.QueueInfo`, or a
`QueueInfoBase` of your own) and asked `get_queue()`: one of `self.queue_info.get_queues()`. The
six (`Random`, `Lottery`, `HighestPriorityFirst`, `HighestPriorityLottery`, `LotteryLottery`,
`ReducedLottery`) ask the queue information as ndkale's do (`does_queue_need_work`,
`get_highest_priority_queue_that_needs_work`), and draw their lotteries with Conveyor's (`_run_lottery`:
priorities 1..100 are tickets; None when no queue has a valid one).

A selector of your own is written as for ndkale: subclass `SelectQueueBase` (or one of the six),
implement `get_queue(self)`. The worker runs it through `KaleSelector`, Conveyor's selector
interface: its `queue_info.QueueInfo` then asks the servers whether a queue has work (a probe is a
fetch: what it finds is run, not fetched twice). QUEUE_SELECTOR naming one of the six, not
subclassed, runs Conveyor's own (docs/tasks.md), which does the same.
"""

from __future__ import annotations

import importlib
import logging
import random
from collections.abc import Sequence
from typing import Any, ClassVar

from conveyor.compat.kale import queue_info
from conveyor.compat.kale.exceptions import ImproperlyConfiguredException
from conveyor.errors import ConfigError
from conveyor.worker import selectors
from conveyor.worker.selectors import NeedsWork, Q, QueueSelector, selector_class

log = logging.getLogger(__name__)

_lottery = selectors.Lottery()  # the draw every `_run_lottery` makes (its own random.Random)


class SelectQueueBase:
    """ndkale's base class of a queue selector.

    `__init__(queue_info)`; `get_queue()` returns a `TaskQueue` of `self.queue_info.get_queues()`
    (or None: nothing to serve this round).
    """

    # Conveyor's selector that does what this class does, for the worker to run instead (None: none)
    conveyor_selector: ClassVar[type[QueueSelector] | None] = None

    def __init__(self, queue_info: queue_info.QueueInfoBase) -> None:
        self.queue_info = queue_info

    def get_queue(self, *args: Any, **kwargs: Any) -> queue_info.TaskQueue | None:
        raise NotImplementedError("Base class cannot be used directly.")


class Random(SelectQueueBase):
    """Any queue, uniformly, whatever its priority or work."""

    conveyor_selector: ClassVar[type[QueueSelector] | None] = selectors.Random

    def get_queue(self, *args: Any, **kwargs: Any) -> queue_info.TaskQueue | None:
        queues = self.queue_info.get_queues()
        return random.choice(queues) if queues else None


class Lottery(SelectQueueBase):
    """A lottery over all queues (priority = tickets), whatever their work."""

    conveyor_selector: ClassVar[type[QueueSelector] | None] = selectors.Lottery

    @staticmethod
    def _run_lottery(queues: Sequence[queue_info.TaskQueue]) -> queue_info.TaskQueue | None:
        """One queue drawn with probability proportional to its priority; None if none has one in 1..100."""
        return _lottery.lottery(queues)

    def get_queue(self, *args: Any, **kwargs: Any) -> queue_info.TaskQueue | None:
        return self._run_lottery(self.queue_info.get_queues())


class HighestPriorityFirst(SelectQueueBase):
    """The highest-priority queue that needs work; if none does, the highest-priority queue."""

    conveyor_selector: ClassVar[type[QueueSelector] | None] = selectors.HighestPriorityFirst

    def get_queue(self, *args: Any, **kwargs: Any) -> queue_info.TaskQueue | None:
        queue = self.queue_info.get_highest_priority_queue_that_needs_work()
        if queue is not None:
            return queue
        queues = selectors.by_priority(self.queue_info.get_queues())
        return queues[0] if queues else None


class HighestPriorityLottery(Lottery):
    """The highest-priority queue that needs work; if none does, a lottery over all queues."""

    conveyor_selector: ClassVar[type[QueueSelector] | None] = selectors.HighestPriorityLottery

    def get_queue(self, *args: Any, **kwargs: Any) -> queue_info.TaskQueue | None:
        queue = self.queue_info.get_highest_priority_queue_that_needs_work()
        return queue if queue is not None else self._run_lottery(self.queue_info.get_queues())


class LotteryLottery(Lottery):
    """Lotteries over all queues until one draws a queue that needs work, at most 10; then one more, served even if empty."""

    conveyor_selector: ClassVar[type[QueueSelector] | None] = selectors.LotteryLottery
    draws: ClassVar[int] = 10

    def get_queue(self, *args: Any, **kwargs: Any) -> queue_info.TaskQueue | None:
        for _ in range(self.draws):
            queue = self._run_lottery(self.queue_info.get_queues())
            if queue is not None and self.queue_info.does_queue_need_work(queue):
                return queue
        return self._run_lottery(self.queue_info.get_queues())


class ReducedLottery(Lottery):
    """The default: a lottery over the queues not yet found empty, each probed at most once.

    A drawn queue that needs work is returned, an empty one leaves the pool and the lottery is
    drawn again; when all were found empty (or the rest have no valid priority), a lottery over all
    queues picks one to long-poll.
    """

    conveyor_selector: ClassVar[type[QueueSelector] | None] = selectors.ReducedLottery

    def get_queue(self, *args: Any, **kwargs: Any) -> queue_info.TaskQueue | None:
        candidates = self.queue_info.get_queues()[:]  # a copy: the queue info's list is left as it is
        while candidates:
            queue = self._run_lottery(candidates)
            if queue is None:
                break  # the rest cannot win a lottery (ndkale would raise here)
            if self.queue_info.does_queue_need_work(queue):
                return queue
            candidates.remove(queue)
        return self._run_lottery(self.queue_info.get_queues())


class KaleSelector(QueueSelector):
    """An ndkale selector (a `SelectQueueBase`) as a Conveyor selector.

    Each round, `info` (the `queue_info.QueueInfo` the selector was made with; by default its
    `queue_info`, if one) probes with the worker's `needs_work`, also when the selector reaches it
    through a `QueueInfoBase` of your own; the TaskQueue the selector returns is mapped back by name.
    """

    def __init__(self, selector: SelectQueueBase, info: queue_info.QueueInfo | None = None) -> None:
        super().__init__()
        self.selector = selector
        self.info = info if info is not None or not isinstance(selector.queue_info, queue_info.QueueInfo) else selector.queue_info

    def get_queue(self, queues: Sequence[Q], needs_work: NeedsWork[Q] = None) -> Q | None:
        by_name = {q.name: q for q in queues}
        probe = self._probe(needs_work)
        probed = self.info
        if probed is not None:
            probed.needs_work = lambda tq: tq.name not in by_name or probe(by_name[tq.name])
        try:
            chosen = self.selector.get_queue()
        finally:
            if probed is not None:
                probed.needs_work = None
        if chosen is None:
            return None
        name = getattr(chosen, "name", None)
        q = by_name.get(name) if isinstance(name, str) else None
        if q is None:
            log.warning(
                "queue selector %s returned %r, not one of the worker's queues %s",
                type(self.selector).__name__,
                chosen,
                sorted(by_name),
            )
        return q


def make_selector(spec: str | type) -> QueueSelector:
    """The QUEUE_SELECTOR setting's selector, from a dotted name or a class.

    The class is ndkale's (`SelectQueueBase`, given the configured queues' QueueInfo) or Conveyor's
    (`QueueSelector`). One of the six of this module, not subclassed, is Conveyor's own
    (`conveyor_selector`), which does the same.
    """
    cls: object = spec
    if isinstance(spec, str) and "." in spec and not spec.startswith("kale.queue_selector."):
        module, _, attr = spec.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ImproperlyConfiguredException(f"QUEUE_SELECTOR: cannot load queue selector {spec!r}: {e}") from None
    if isinstance(cls, type) and issubclass(cls, SelectQueueBase):
        own: type[QueueSelector] | None = cls.__dict__.get(
            "conveyor_selector"
        )  # set by the class itself, not inherited by a subclass of yours
        if own is not None:
            return own()
        info = queue_info.QueueInfo()
        return KaleSelector(cls(info), info)
    if isinstance(cls, type) and issubclass(cls, QueueSelector):
        return cls()
    try:
        return selector_class(cls)() if isinstance(cls, str) else selector_class(repr(cls))()
    except ConfigError as e:
        raise ImproperlyConfiguredException(
            f"QUEUE_SELECTOR: {e} (a selector of your own subclasses queue_selector.SelectQueueBase)"
        ) from None


__all__ = [
    "HighestPriorityFirst",
    "HighestPriorityLottery",
    "KaleSelector",
    "Lottery",
    "LotteryLottery",
    "QueueSelector",
    "Random",
    "ReducedLottery",
    "SelectQueueBase",
    "make_selector",
]
