"""Workers: consumers that run tasks, local consumer pools, queue selection and configuration."""

from __future__ import annotations

from conveyor.tasks.queue_config import QueueConfig, load_queues
from conveyor.worker.consumer import Consumer
from conveyor.worker.consumer_pool import ConsumerPool, TaskFailure
from conveyor.worker.hooks import ConsumerHooks, HookFailure
from conveyor.worker.middleware import Decision, Middleware, Retries, TimeLimits
from conveyor.worker.options import ConsumerOptions
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
from conveyor.worker.settings import Settings, load_settings
from conveyor.worker.stats import ConsumerStats

__all__ = [
    "SELECTORS",
    "Consumer",
    "ConsumerHooks",
    "ConsumerOptions",
    "ConsumerPool",
    "ConsumerStats",
    "Decision",
    "HighestPriorityFirst",
    "HighestPriorityLottery",
    "HookFailure",
    "Lottery",
    "LotteryLottery",
    "Middleware",
    "QueueConfig",
    "QueueSelector",
    "Random",
    "ReducedLottery",
    "Retries",
    "Settings",
    "TaskFailure",
    "TimeLimits",
    "load_queues",
    "load_settings",
    "selector_class",
]
