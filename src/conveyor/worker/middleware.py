"""Behaviour around a consumer's core loop, as hooks (dramatiq style): retries and time limits.

A consumer calls every middleware's hooks in order. `deadline` gives a running task's time limit
(the earliest wins); `on_failure` decides what happens to a failed message (the first decision
wins; with none, the message is retried at once while it has attempts left); `on_finish` sees
every outcome. Users add their own (metrics, logging) by subclassing `Middleware`.
"""

from __future__ import annotations

import random

from conveyor.errors import TaskError
from conveyor.message import Message
from conveyor.tasks.policy import RetryDecision as Decision  # the name middleware authors use
from conveyor.tasks.policy import retry_decision, time_limit_of


class Middleware:
    """Hooks a consumer calls; each default does nothing."""

    def deadline(self, message: Message, started: float) -> float | None:
        """When (monotonic time) the task must stop, or None for no limit."""
        return None

    def on_failure(self, message: Message, error: TaskError) -> Decision | None:
        """How to handle a failure, or None to leave it to the next middleware."""
        return None

    def on_finish(self, message: Message, error: TaskError | None) -> None:
        """Called once per finished message (error None: it succeeded and was acked)."""


class TimeLimits(Middleware):
    """A task's `time_limit` (from its message headers), or `default_s` for messages without one."""

    def __init__(self, default_s: float | None = None) -> None:
        self.default_s = default_s

    def deadline(self, message: Message, started: float) -> float | None:
        limit = time_limit_of(message.headers)
        if limit is None:
            limit = self.default_s
        return None if limit is None else started + limit


class Retries(Middleware):
    """The retry policy (`conveyor.tasks.policy.retry_decision`).

    Exponential backoff with jitter (the task's `retry_backoff`) while attempts are left; a
    non-retryable error (unknown task, damaged payload, a `no_retry` exception) fails at once. Once
    a message has used its `max_attempts`, the store makes the nack a dead letter.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()

    def on_failure(self, message: Message, error: TaskError) -> Decision | None:
        return retry_decision(message, error.retryable, self.rng)


__all__ = ["Decision", "Middleware", "Retries", "TimeLimits", "default_middleware"]


def default_middleware() -> list[Middleware]:
    return [TimeLimits(), Retries()]
