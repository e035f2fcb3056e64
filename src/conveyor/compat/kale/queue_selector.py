"""ndkale's queue selectors (`kale.queue_selector`): Conveyor's six, under the same names.

Conveyor's six are in docs/tasks.md; ndkale's `SelectQueueBase` is here for selectors of your own.

A selector of your own is written as for ndkale: subclass `SelectQueueBase`, implement
`get_queue(self)` and return one of `self.queue_info.get_queues()`. `self.queue_info` is a
`queue_info.QueueInfo` whose `does_queue_need_work(queue)`, `is_queue_empty(queue)` and
`get_highest_priority_queue_that_needs_work()` ask the servers (a probe is a fetch: what it finds
is run, not fetched twice). The worker runs it through `KaleSelector`, Conveyor's selector interface.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from typing import Any

from conveyor.compat.kale import queue_info
from conveyor.compat.kale.exceptions import ImproperlyConfiguredException
from conveyor.errors import ConfigError
from conveyor.worker.selectors import (
    HighestPriorityFirst,
    HighestPriorityLottery,
    Lottery,
    LotteryLottery,
    NeedsWork,
    Q,
    QueueSelector,
    Random,
    ReducedLottery,
    selector_class,
)

log = logging.getLogger(__name__)


class SelectQueueBase:
    """ndkale's base class of a queue selector.

    `__init__(queue_info)`; `get_queue()` returns a `TaskQueue` of `self.queue_info.get_queues()`
    (or None: nothing to serve this round).
    """

    def __init__(self, queue_info: queue_info.QueueInfo) -> None:
        self.queue_info = queue_info

    def get_queue(self, *args: Any, **kwargs: Any) -> queue_info.TaskQueue | None:
        raise NotImplementedError("Base class cannot be used directly.")


class KaleSelector(QueueSelector):
    """An ndkale selector (a `SelectQueueBase`) as a Conveyor selector.

    Each round its queue_info probes with the worker's `needs_work`, and the TaskQueue it returns is
    mapped back by name.
    """

    def __init__(self, selector: SelectQueueBase) -> None:
        super().__init__()
        self.selector = selector

    def get_queue(self, queues: Sequence[Q], needs_work: NeedsWork[Q] = None) -> Q | None:
        by_name = {q.name: q for q in queues}
        probe = self._probe(needs_work)
        info = self.selector.queue_info
        info.needs_work = lambda tq: tq.name not in by_name or probe(by_name[tq.name])
        try:
            chosen = self.selector.get_queue()
        finally:
            info.needs_work = None
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
    (`QueueSelector`).
    """
    cls: object = spec
    if isinstance(spec, str) and "." in spec and not spec.startswith("kale.queue_selector."):
        module, _, attr = spec.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ImproperlyConfiguredException(f"QUEUE_SELECTOR: cannot load queue selector {spec!r}: {e}") from None
    if isinstance(cls, type) and issubclass(cls, SelectQueueBase):
        return KaleSelector(cls(queue_info.QueueInfo()))
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
