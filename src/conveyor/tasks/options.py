"""Task options: what a task asks of the queue (queue, priority, time limit, retries, backoff), validated where it is declared.

The retry and time-limit rules themselves are `conveyor.tasks.policy`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conveyor.constants import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_QUEUE,
    H_RETRY_BACKOFF,
    H_TIME_LIMIT,
    PRIORITY_MAX,
    PRIORITY_MIN,
)
from conveyor.errors import TaskOptionError
from conveyor.tasks.policy import DEFAULT_BACKOFF, Backoff, BackoffSpec, attempts_for, check_max_retries, is_number

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """What a task asks of the queue; checked on construction (TaskOptionError names the field).

    queue: the queue it is published to.
    priority: `Message.priority` (order within its queue; higher first). Not the queue's own
        priority, which the queue YAML sets and the queue selectors use.
    time_limit: seconds a run may take (None: no limit); must stay below the queue's
        `visibility_timeout_sec`, checked at publish time.
    max_retries: retries after the first attempt (message `max_attempts = max_retries + 1`).
    retry_backoff: the delay before each retry (`Backoff.of` accepts shorthands).
    no_retry: exception types that fail the message at once, without retries (ndkale's
        EXCEPTION_LIST idea).
    """

    queue: str = DEFAULT_QUEUE
    priority: int = 0
    time_limit: float | None = None
    max_retries: int = DEFAULT_MAX_RETRIES
    retry_backoff: Backoff = field(default=DEFAULT_BACKOFF)
    no_retry: tuple[type[BaseException], ...] = ()

    if TYPE_CHECKING:
        # the signature of the dataclass's own __init__, which also takes a BackoffSpec (__post_init__ makes it a Backoff)
        def __init__(
            self,
            queue: str = ...,
            priority: int = ...,
            time_limit: float | None = ...,
            max_retries: int = ...,
            retry_backoff: BackoffSpec = ...,
            no_retry: tuple[type[BaseException], ...] = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        check_queue(self.queue)
        check_priority(self.priority)
        if self.time_limit is not None:
            if not (is_number(self.time_limit) and self.time_limit > 0):
                raise TaskOptionError(f"time_limit must be a positive number of seconds or None, got {self.time_limit!r}")
            object.__setattr__(self, "time_limit", float(self.time_limit))
        check_max_retries(self.max_retries)
        object.__setattr__(self, "retry_backoff", Backoff.of(self.retry_backoff))
        nr = self.no_retry
        if isinstance(nr, type):
            nr = (nr,)
        if not (isinstance(nr, tuple) and all(isinstance(t, type) and issubclass(t, BaseException) for t in nr)):
            raise TaskOptionError(f"no_retry must be a tuple of exception types, got {self.no_retry!r}")
        object.__setattr__(self, "no_retry", nr)

    @property
    def max_attempts(self) -> int:
        return attempts_for(self.max_retries)

    def headers(self) -> dict[str, str]:
        """The headers that carry these options to a consumer (only the non-default ones)."""
        h: dict[str, str] = {}
        if self.time_limit is not None:
            h[H_TIME_LIMIT] = repr(self.time_limit)
        if self.retry_backoff != DEFAULT_BACKOFF:
            h[H_RETRY_BACKOFF] = self.retry_backoff.header()
        return h


def check_queue(queue: object) -> str:
    if type(queue) is not str or not queue:
        raise TaskOptionError(f"queue must be a non-empty str, got {queue!r}")
    return queue


def check_priority(priority: object) -> int:
    if type(priority) is not int or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise TaskOptionError(f"priority must be an int in [{PRIORITY_MIN}, {PRIORITY_MAX}], got {priority!r}")
    return priority
