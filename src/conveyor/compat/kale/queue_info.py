"""ndkale's queue information (`kale.queue_info`): the queues of the QUEUE_CONFIG YAML.

They are read by Conveyor's own reader (`conveyor.tasks.queue_config`, which reads ndkale's format).
Each is a QUEUE_CLASS object (`TaskQueue` or a subclass of yours), whose `_decorate_name` gives
the name tasks are published to and served from (ndkale's way to prefix a release, say).

ndkale opens QUEUE_CONFIG relative to the working directory; so does this module.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from conveyor.compat.kale import settings, utils
from conveyor.compat.kale.exceptions import ImproperlyConfiguredException
from conveyor.errors import ConfigError
from conveyor.tasks.queue_config import QueueConfig, load_queues


class TaskQueue:
    """One queue as ndkale shows it: its fields, `simple_name` and the dead-letter name ndkale used.

    `name` and `dlq_name` are what `_decorate_name(simple_name)` returns; ndkale's default, kept,
    is the name itself and `dlq-<name>`.
    """

    def __init__(
        self,
        name: str = "default",
        priority: int = 5,
        num_iterations: int = 2,
        long_poll_time_sec: float = 5,
        batch_size: int | None = 5,
        visibility_timeout_sec: float = 600,
    ) -> None:
        self.simple_name = name
        # Conveyor keeps dead letters inside the queue itself: dlq_name is kept for code that logs it
        self.name, self.dlq_name = self._decorate_name(name)
        self.priority = priority
        self.num_iterations = num_iterations
        self.batch_size = batch_size
        self.long_poll_time_sec = long_poll_time_sec
        self.visibility_timeout_sec = visibility_timeout_sec

    def _decorate_name(self, name: str) -> tuple[str, str]:
        """The queue's name and its dead-letter queue's name, from the configured name."""
        return name, "dlq-" + name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} priority={self.priority}>"


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


def queue_class() -> type[TaskQueue]:
    """The QUEUE_CLASS setting's class: a dotted path or a class, a TaskQueue subclass.

    ndkale's default, `kale.queue_info.TaskQueue`, is this module's; so is any `kale.` path.
    """
    spec = settings.current().QUEUE_CLASS
    found: object = spec
    if isinstance(spec, str):
        path = "conveyor.compat." + spec if spec.startswith("kale.") else spec
        try:
            found = utils.class_import_from_path(path)
        except (ImportError, AttributeError) as e:
            raise ImproperlyConfiguredException(f"QUEUE_CLASS: cannot load {spec!r}: {e}") from None
    if not (isinstance(found, type) and issubclass(found, TaskQueue)):
        raise ImproperlyConfiguredException(f"QUEUE_CLASS: {spec!r} is not a queue_info.TaskQueue subclass")
    return found


def served_configs(config_file: str | os.PathLike[str] | None = None) -> list[QueueConfig]:
    """The queues of `config_file` (default: QUEUE_CONFIG) as Conveyor serves them: named by QUEUE_CLASS."""
    cls = queue_class()
    return [dataclasses.replace(c, name=_task_queue(cls, c).name) for c in load_configs(config_file)]


def _task_queue(queue_cls: type[TaskQueue], c: QueueConfig) -> TaskQueue:
    """The queue configured as `c`, a `queue_cls` object."""
    return queue_cls(
        name=c.name,
        priority=c.priority,
        num_iterations=c.num_iterations,
        long_poll_time_sec=c.long_poll_time_sec,
        batch_size=c.batch_size,
        visibility_timeout_sec=c.visibility_timeout_sec,
    )


class QueueInfoBase:
    """ndkale's base class of queue information: subclass it for queues from elsewhere than QUEUE_CONFIG.

    A subclass implements `get_queues()` (TaskQueues), and for the selectors that ask about work
    `is_queue_empty(queue)`, `does_queue_need_work(queue)` and
    `get_highest_priority_queue_that_needs_work()`. A queue selector of your own may be given one
    (see `queue_selector.SelectQueueBase`); the worker serves only the queues of QUEUE_CONFIG.
    """

    def get_queues(self) -> list[TaskQueue]:
        """The queues, as TaskQueue objects."""
        raise NotImplementedError("Base class cannot be used directly.")

    def get_highest_priority_queue_that_needs_work(self) -> TaskQueue | None:
        """The highest-priority queue that needs work (None: none does)."""
        raise NotImplementedError("Base class cannot be used directly.")

    def is_queue_empty(self, queue: TaskQueue) -> bool:
        """Whether `queue` has no task to run now."""
        raise NotImplementedError("Base class cannot be used directly.")

    def does_queue_need_work(self, queue: TaskQueue) -> bool:
        """Whether `queue` should be worked on."""
        raise NotImplementedError("Base class cannot be used directly.")


class QueueInfo(QueueInfoBase):
    """The queues of QUEUE_CONFIG: `get_queues()` (highest priority first) and `get_queue(name)`.

    Whether a queue has work is asked of the servers while the worker's queue selector chooses (the
    worker sets `needs_work`: a probe is a fetch, and what it finds is run); elsewhere every queue
    is taken to need work, as ndkale does when it cannot tell. `queue_cls` defaults to the
    QUEUE_CLASS setting's; `sqs_talk` is accepted for ndkale's signature, and unused.
    """

    def __init__(
        self,
        config_file: str | os.PathLike[str] | None = None,
        sqs_talk: Any = None,
        queue_cls: type[TaskQueue] | None = None,
    ) -> None:
        self._file = config_file
        self._queues = self._get_queues_from_config(config_file, queue_cls if queue_cls is not None else queue_class())
        self._by_name = {q.simple_name: q for q in self._queues}
        self.needs_work: Callable[[TaskQueue], bool] | None = None

    @classmethod
    def _get_queues_from_config(
        cls, config_file: str | os.PathLike[str] | None, queue_cls: type[TaskQueue] = TaskQueue
    ) -> list[TaskQueue]:
        """The queues of `config_file` (None: QUEUE_CONFIG) as `queue_cls` objects, highest priority first."""
        return [_task_queue(queue_cls, c) for c in load_configs(config_file)]

    def get_queues(self) -> list[TaskQueue]:
        """The queues, highest priority first (a new list each call)."""
        return list(self._queues)

    def is_queue_empty(self, queue: TaskQueue) -> bool:
        """Whether the servers have no task of `queue` ready (asked only while the worker's selector chooses)."""
        return self.needs_work is not None and not self.needs_work(queue)

    def does_queue_need_work(self, queue: TaskQueue) -> bool:
        """Whether `queue` has work: not `is_queue_empty(queue)`, as ndkale."""
        return not self.is_queue_empty(queue)

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
