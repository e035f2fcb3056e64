"""Settings that import the tasks (to build TASK_MAPPER from the classes, say)."""

from taskworker import tasks
from taskworker.settings import *  # noqa: F403

TASK_MAPPER = {"old.name.Fibonacci": tasks.FibonacciTask.task_name}
