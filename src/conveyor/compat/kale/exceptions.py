"""ndkale's exceptions (`kale.exceptions`), under the same names, so `except` clauses keep working.

Where a Conveyor error means the same thing, the kale exception is also that Conveyor error:
`ImproperlyConfiguredException` is a `ConfigError`, `InvalidTimeLimitTaskException` and
`InvalidTaskDelayException` are `TaskOptionError`s.
"""

from __future__ import annotations

from conveyor.errors import ConfigError, TaskOptionError


class ImproperlyConfiguredException(ConfigError):
    """The kale settings (or the queue configuration they name) are missing or invalid."""


class TaskException(Exception):
    """Base class of task exceptions."""


class ChubbyTaskException(TaskException):
    """A task too big to publish (kept for `except` clauses: Conveyor's limit is the server's frame size)."""


class TimeoutException(TaskException):
    """Raised inside a task that ran past its `time_limit`."""


class InvalidTimeLimitTaskException(TaskException, TaskOptionError):
    """A task's `time_limit` is at or above its queue's `visibility_timeout_sec`."""


class InvalidTaskDelayException(TaskException, TaskOptionError):
    """A task published with a `delay_sec` that is not a number of seconds >= 0."""


class BlacklistedException(TaskException):
    """Raised (by a task's `_check_blacklist`) for a task that must not run; never retried."""


class QueueException(Exception):
    """Base class of queue exceptions."""


class SendMessagesException(QueueException):
    """Some messages could not be sent (kept for `except` clauses)."""

    def __init__(self, msg_count: int) -> None:
        super().__init__(f"{msg_count} messages failed to be delivered")


class DeleteMessagesException(QueueException):
    """Some messages could not be deleted (kept for `except` clauses)."""

    def __init__(self, msg_count: int) -> None:
        super().__init__(f"{msg_count} messages failed to be deleted")


class ChangeMessagesVisibilityException(QueueException):
    """Some messages' visibility could not be changed (kept for `except` clauses)."""

    def __init__(self, msg_count: int) -> None:
        super().__init__(f"{msg_count} messages failed to change visibility")
