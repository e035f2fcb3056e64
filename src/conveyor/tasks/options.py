"""Task options and the retry policy: what a task asks of the queue, validated where it is declared.

`TaskOptions` holds a task's queue, priority, time limit, retries and backoff. `Backoff` and
`backoff_delay` give the delay a consumer waits before a failed message is served again.
`time_limit_of` and `backoff_of` read both back from a message's headers, so a consumer can
enforce them without importing the task.
"""

from __future__ import annotations

import enum
import logging
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

from conveyor.constants import (
    DEFAULT_BACKOFF_BASE_S,
    DEFAULT_BACKOFF_CAP_S,
    DEFAULT_BACKOFF_FACTOR,
    DEFAULT_MAX_RETRIES,
    DEFAULT_QUEUE,
    H_RETRY_BACKOFF,
    H_TIME_LIMIT,
    MAX_ATTEMPTS_LIMIT,
    PRIORITY_MAX,
    PRIORITY_MIN,
)
from conveyor.errors import TaskOptionError

log = logging.getLogger(__name__)


class Jitter(str, enum.Enum):
    """How a retry delay is randomised below its exponential ceiling c.

    FULL: uniform in [0, c] (spreads a herd of retries best, but may retry at once).
    EQUAL: uniform in [c/2, c] (the default: spread out, and never sooner than half the ceiling).
    NONE: exactly c.
    """

    FULL = "full"
    EQUAL = "equal"
    NONE = "none"


def _number(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: the n-th attempt's retry waits up to min(cap, base * factor**(n-1)) s."""

    base: float = DEFAULT_BACKOFF_BASE_S
    factor: float = DEFAULT_BACKOFF_FACTOR
    cap: float = DEFAULT_BACKOFF_CAP_S
    jitter: Jitter = Jitter.EQUAL

    def __post_init__(self) -> None:
        if not (_number(self.base) and self.base >= 0):
            raise TaskOptionError(f"retry_backoff: base must be a finite number >= 0, got {self.base!r}")
        if not (_number(self.factor) and self.factor >= 1):
            raise TaskOptionError(f"retry_backoff: factor must be a finite number >= 1, got {self.factor!r}")
        if not (_number(self.cap) and self.cap >= self.base):
            raise TaskOptionError(f"retry_backoff: cap must be a finite number >= base ({self.base}), got {self.cap!r}")
        try:
            object.__setattr__(self, "jitter", Jitter(self.jitter))
        except ValueError:
            raise TaskOptionError(f"retry_backoff: jitter must be one of {[j.value for j in Jitter]}, "
                                  f"got {self.jitter!r}") from None  # fmt: skip

    @classmethod
    def of(cls, spec: BackoffSpec) -> Backoff:
        """A Backoff from a Backoff, a base in seconds, or a tuple (base[, factor[, cap[, jitter]]])."""
        if isinstance(spec, Backoff):
            return spec
        if _number(spec):
            base = float(spec)
            return cls(base, cap=max(DEFAULT_BACKOFF_CAP_S, base))
        if isinstance(spec, tuple) and 1 <= len(spec) <= 4:
            return cls(*spec)
        raise TaskOptionError(
            f"retry_backoff must be a Backoff, a base in seconds or a tuple (base, factor, cap[, jitter]), got {spec!r}"
        )

    def header(self) -> str:
        return f"{self.base!r},{self.factor!r},{self.cap!r},{self.jitter.value}"

    @classmethod
    def parse(cls, text: str) -> Backoff:
        """The Backoff `header()` wrote; ValueError (TaskOptionError) if malformed."""
        parts = text.split(",")
        if len(parts) != 4:
            raise TaskOptionError(f"malformed backoff header {text!r}")
        try:
            return cls(float(parts[0]), float(parts[1]), float(parts[2]), Jitter(parts[3]))
        except ValueError as e:
            raise TaskOptionError(f"malformed backoff header {text!r}: {e}") from None


DEFAULT_BACKOFF = Backoff()
BackoffSpec = Backoff | float | int | tuple[Any, ...]  # what `retry_backoff=` accepts (see Backoff.of)


def backoff_delay(attempt: int, retry_backoff: BackoffSpec = DEFAULT_BACKOFF, rng: random.Random | None = None) -> float:
    """Seconds to wait before serving a message again after its `attempt`-th delivery failed.

    attempt: the failed delivery's number (`Message.attempts`, 1 for the first).
    rng: a seeded `random.Random` makes the jitter reproducible; None uses the `random` module.
    """
    b = Backoff.of(retry_backoff)
    n = max(1, int(attempt)) - 1
    try:
        ceiling = min(b.cap, b.base * b.factor**n)
    except OverflowError:  # factor**n beyond a float: the cap applies
        ceiling = b.cap
    r = rng if rng is not None else random
    if b.jitter is Jitter.FULL:
        return r.uniform(0.0, ceiling)
    if b.jitter is Jitter.EQUAL:
        return ceiling / 2 + r.uniform(0.0, ceiling / 2)
    return ceiling


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
        def __init__(self, queue: str = ..., priority: int = ..., time_limit: float | None = ..., max_retries: int = ...,
                     retry_backoff: BackoffSpec = ..., no_retry: tuple[type[BaseException], ...] = ...) -> None: ...  # fmt: skip

    def __post_init__(self) -> None:
        check_queue(self.queue)
        check_priority(self.priority)
        if self.time_limit is not None:
            if not (_number(self.time_limit) and self.time_limit > 0):
                raise TaskOptionError(f"time_limit must be a positive number of seconds or None, got {self.time_limit!r}")
            object.__setattr__(self, "time_limit", float(self.time_limit))
        if type(self.max_retries) is not int or not 0 <= self.max_retries < MAX_ATTEMPTS_LIMIT:
            raise TaskOptionError(f"max_retries must be an int in 0..{MAX_ATTEMPTS_LIMIT - 1}, got {self.max_retries!r}")
        object.__setattr__(self, "retry_backoff", Backoff.of(self.retry_backoff))
        nr = self.no_retry
        if isinstance(nr, type):
            nr = (nr,)
        if not (isinstance(nr, tuple) and all(isinstance(t, type) and issubclass(t, BaseException) for t in nr)):
            raise TaskOptionError(f"no_retry must be a tuple of exception types, got {self.no_retry!r}")
        object.__setattr__(self, "no_retry", nr)

    @property
    def max_attempts(self) -> int:
        return self.max_retries + 1

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


def time_limit_of(headers: Mapping[str, str]) -> float | None:
    """A message's time limit in seconds from its headers (None: no limit, or unreadable)."""
    v = headers.get(H_TIME_LIMIT)
    if v is None:
        return None
    try:
        t = float(v)
    except ValueError:
        log.warning("ignoring malformed %s header %r", H_TIME_LIMIT, v)
        return None
    return t if t > 0 and math.isfinite(t) else None


def backoff_of(headers: Mapping[str, str]) -> Backoff:
    """A message's retry backoff from its headers (the default when absent or unreadable)."""
    v = headers.get(H_RETRY_BACKOFF)
    if v is None:
        return DEFAULT_BACKOFF
    try:
        return Backoff.parse(v)
    except TaskOptionError:
        log.warning("ignoring malformed %s header %r; using the default backoff", H_RETRY_BACKOFF, v)
        return DEFAULT_BACKOFF
