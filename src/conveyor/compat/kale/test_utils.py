"""ndkale's helpers for testing kale code (`kale.test_utils`): stock tasks, and messages made without a queue.

The same names and behaviour as ndkale's, so that a project's tests that use them run with their
import changed: tasks that succeed, fail, time out, run long or put themselves off, a
`MockMessage` built from a task instance, and `new_mock_task`/`new_mock_message`. The task classes
register (as any kale task) under `conveyor.compat.kale.test_utils.<Class>`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from conveyor.compat.kale import exceptions, message, queue_info, queue_selector, settings, task


class MockTask(task.Task):
    """Succeeds; task id 'mock_task'."""

    @classmethod
    def _get_task_id(cls, *args: Any, **kwargs: Any) -> str:
        return "mock_task"

    def run_task(self, *args: Any, **kwargs: Any) -> None:
        return None


class FailTask(task.Task):
    """Raises TaskException (retryable); task id 'fail_task'."""

    @classmethod
    def _get_task_id(cls, *args: Any, **kwargs: Any) -> str:
        return "fail_task"

    def run_task(self, *args: Any, **kwargs: Any) -> None:
        raise exceptions.TaskException("Task failed.")


class ShouldNotRunTask(task.Task):
    """Puts itself off every time (`should_run_task` is False); task id 'should_not_run_task'."""

    @classmethod
    def _get_task_id(cls, *args: Any, **kwargs: Any) -> str:
        return "should_not_run_task"

    def should_run_task(self, *args: Any, **kwargs: Any) -> bool:
        return False

    def run_task(self, *args: Any, **kwargs: Any) -> None:
        return None


class TimeoutTask(task.Task):
    """Raises TimeoutException, as a task stopped by its time limit; task id 'fail_task'."""

    @classmethod
    def _get_task_id(cls, *args: Any, **kwargs: Any) -> str:
        return "fail_task"

    def run_task(self, *args: Any, **kwargs: Any) -> None:
        raise exceptions.TimeoutException("Task failed.")


class SlowButNotTooSlowTask(task.Task):
    """Looks as if it ran `target_runtime` (90 s) within its time limit (100 s), without waiting.

    Its run moves its start time back, so `_alert_runtime_exceeded` is called; task id
    'moderately_slow_task'.
    """

    time_limit = 100
    target_runtime = 90

    @classmethod
    def _get_task_id(cls, *args: Any, **kwargs: Any) -> str:
        return "moderately_slow_task"

    def run_task(self, *args: Any, **kwargs: Any) -> None:
        self._start_time = (self._start_time or 0) - self.target_runtime


class FailTaskNoRetries(FailTask):
    """FailTask with retries off (`max_retries = None`)."""

    max_retries: ClassVar[Any] = None


class MockMessage(message.KaleMessage):
    """A KaleMessage for `task_inst`, without a queue: its id 'id', the task's name and id, counts as given."""

    def __init__(
        self,
        task_inst: task.Task,
        task_args: Any = None,
        task_kwargs: Any = None,
        app_data: Any = None,
        retry_num: int = 0,
        failure_num: int = 0,
    ) -> None:
        super().__init__(
            sqs_message_id="id",
            task_name=task_inst.task_name,
            task_id=task_inst.task_id,
            payload={"args": task_args or [], "kwargs": task_kwargs or {}, "app_data": app_data or {}},
            current_retry_num=retry_num,
            current_failure_num=failure_num,
        )
        self.task_inst = task_inst


class MockConsumer:
    """A consumer that finds nothing."""

    def consume(self, *args: Any, **kwargs: Any) -> list[message.KaleMessage]:
        return []


class TestQueueClass(queue_info.TaskQueue):
    """A TaskQueue subclass, for the QUEUE_CLASS setting in tests."""

    __test__ = False  # a helper, not a test class for pytest to collect where it is imported


class TestQueueSelector(queue_selector.SelectQueueBase):
    """Always the first of the queue information's queues."""

    __test__ = False

    def get_queue(self, *args: Any, **kwargs: Any) -> queue_info.TaskQueue | None:
        return self.queue_info.get_queues()[0]


def new_mock_message(task_class: type[task.Task] | None = None) -> MockMessage:
    """A MockMessage for a new instance of `task_class` (default MockTask)."""
    return MockMessage(new_mock_task(task_class))


def new_mock_task(task_class: type[task.Task] | None = None) -> task.Task:
    """A new instance of `task_class` (default MockTask), as the worker would make it from a message."""
    cls = task_class if task_class is not None else MockTask
    s = settings.current()
    return cls({"id": cls._get_task_id(), "_enqueued_time": s.TIMESTAMP_FUNC(), "_publisher": s.PUBLISHER_STR_FUNC()})
