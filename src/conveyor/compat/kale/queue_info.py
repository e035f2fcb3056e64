"""ndkale's queue information (`kale.queue_info`): the queues of the QUEUE_CONFIG YAML.

They are read by Conveyor's own reader (`conveyor.tasks.queue_config`, which reads ndkale's format).

ndkale opens QUEUE_CONFIG relative to the working directory; so does this module.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from conveyor.compat.kale import settings
from conveyor.compat.kale.exceptions import ImproperlyConfiguredException
from conveyor.errors import ConfigError
from conveyor.tasks.queue_config import QueueConfig, load_queues


class TaskQueue:
    """One queue as ndkale shows it: its fields, `simple_name` and the dead-letter name ndkale used."""

    def __init__(
        self,
        name: str = "default",
        priority: int = 5,
        num_iterations: int = 2,
        long_poll_time_sec: float = 5,
        batch_size: int | None = None,
        visibility_timeout_sec: float = 600,
    ) -> None:
        self.config = QueueConfig(name, priority, batch_size, visibility_timeout_sec, long_poll_time_sec, num_iterations)
        self.simple_name = self.name = name
        self.dlq_name = "dlq-" + name  # Conveyor keeps dead letters inside the queue itself; kept for code that logs it
        self.priority = priority
        self.num_iterations = num_iterations
        self.batch_size = batch_size
        self.long_poll_time_sec = long_poll_time_sec
        self.visibility_timeout_sec = visibility_timeout_sec


def load_configs(config_file: str | os.PathLike[str] | None = None) -> list[QueueConfig]:
    """The queues of `config_file` (default: the QUEUE_CONFIG setting), highest priority first."""
    path = settings.current().queue_config_path() if config_file is None else os.path.abspath(config_file)
    if not os.path.exists(path):
        raise ImproperlyConfiguredException(
            f"QUEUE_CONFIG: no queue configuration at {path} (a relative QUEUE_CONFIG is taken from the working "
            f"directory, {os.getcwd()}, as ndkale does)"
        )
    try:
        return load_queues(path)
    except ConfigError as e:
        raise ImproperlyConfiguredException(str(e)) from None


class QueueInfo:
    """The configured queues: `get_queues()` (highest priority first) and `get_queue(name)`."""

    def __init__(
        self, config_file: str | os.PathLike[str] | None = None, sqs_talk: Any = None, queue_cls: type[TaskQueue] = TaskQueue
    ) -> None:
        self._file = config_file
        self._queues = [
            queue_cls(c.name, c.priority, c.num_iterations, c.long_poll_time_sec, c.batch_size, c.visibility_timeout_sec)
            for c in load_configs(config_file)
        ]
        self._by_name = {q.simple_name: q for q in self._queues}
        # whether a queue has work: set by the worker while its selector chooses (a probe fetches from the
        # servers); None elsewhere: every queue is taken to need work, as ndkale does when it cannot tell
        self.needs_work: Callable[[TaskQueue], bool] | None = None

    def get_queues(self) -> list[TaskQueue]:
        return list(self._queues)

    def does_queue_need_work(self, queue: TaskQueue) -> bool:
        return True if self.needs_work is None else self.needs_work(queue)

    def is_queue_empty(self, queue: TaskQueue) -> bool:
        return not self.does_queue_need_work(queue)

    def get_highest_priority_queue_that_needs_work(self) -> TaskQueue | None:
        """The highest-priority queue that needs work (None: all are empty)."""
        return next((q for q in self._queues if self.does_queue_need_work(q)), None)

    def get_queue(self, simple_name: str) -> TaskQueue:
        """The queue named `simple_name`; ImproperlyConfiguredException (naming the known ones) if none."""
        try:
            return self._by_name[simple_name]
        except KeyError:
            where = self._file if self._file is not None else settings.current().queue_config_path()
            raise ImproperlyConfiguredException(
                f"queue {simple_name!r} is not in {where}; configured: {sorted(self._by_name)}"
            ) from None
