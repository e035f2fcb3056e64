"""Workers: queue selection and configuration (the consumer loop builds on these)."""

from __future__ import annotations

from .selectors import (
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
from .settings import QueueConfig, Settings, load_queues, load_settings

__all__ = [
    "SELECTORS",
    "HighestPriorityFirst",
    "HighestPriorityLottery",
    "Lottery",
    "LotteryLottery",
    "QueueConfig",
    "QueueSelector",
    "Random",
    "ReducedLottery",
    "Settings",
    "load_queues",
    "load_settings",
    "selector_class",
]
