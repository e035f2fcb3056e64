"""Tasks: definitions, envelopes, options and retry policy, the registry, publishing and running.

The definitions are `@task` and `Task`; the running is the run side of a message.
"""

from __future__ import annotations

from conveyor.tasks.definition import Task, TaskFunction, task
from conveyor.tasks.publish import Args, Publisher, TaskHandle, default_pool, get_default_pool, set_default_pool

__all__ = [
    "Args",
    "Publisher",
    "Task",
    "TaskFunction",
    "TaskHandle",
    "default_pool",
    "get_default_pool",
    "set_default_pool",
    "task",
]
