"""The retry and time-limit policy, in one place: what the worker, the stores' attempt counts and `conveyor.spark.map` all follow.

- A message gets `attempts_for(max_retries)` deliveries (its `max_attempts`); the store makes the
  last failed one a dead letter. `conveyor.spark.map` gives each row as many tries, at once inside
  its message (a row's neighbours keep their results), and its messages as many deliveries.
- A failure is retried after `backoff_delay` (exponential, with jitter) unless it is not retryable
  (`is_retryable`: the exception says so, or is one of the task's `no_retry` types): then it is
  failed at once (`retry_decision`).
- A task's time limit and backoff travel in its message's headers (`time_limit_of`, `backoff_of`),
  so a consumer enforces them without importing the task.
- A running task's lease is extended every `lease / HEARTBEAT_FRACTION` seconds (`heartbeat_s`).
"""

from __future__ import annotations

import enum
import logging
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from conveyor.constants import (
    DEFAULT_BACKOFF_BASE_S,
    DEFAULT_BACKOFF_CAP_S,
    DEFAULT_BACKOFF_FACTOR,
    DEFAULT_LEASE_S,
    H_RETRY_BACKOFF,
    H_TIME_LIMIT,
    MAX_ATTEMPTS_LIMIT,
)
from conveyor.errors import TaskOptionError

if TYPE_CHECKING:
    from conveyor.message import Message

log = logging.getLogger(__name__)

HEARTBEAT_FRACTION = 3  # a running task's lease is extended when a third of it has passed


def is_number(v: object) -> TypeGuard[float]:
    """A finite int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_max_retries(max_retries: object, where: str = "") -> int:
    """`max_retries` as given, or TaskOptionError: an int in 0..MAX_ATTEMPTS_LIMIT - 1."""
    if type(max_retries) is not int or not 0 <= max_retries < MAX_ATTEMPTS_LIMIT:
        raise TaskOptionError(f"{where}max_retries must be an int in 0..{MAX_ATTEMPTS_LIMIT - 1}, got {max_retries!r}")
    return max_retries


def attempts_for(max_retries: int) -> int:
    """Deliveries a message gets: the first attempt and its retries (the store's `max_attempts`)."""
    return max_retries + 1


class Jitter(str, enum.Enum):
    """How a retry delay is randomised below its exponential ceiling c.

    FULL: uniform in [0, c] (spreads a herd of retries best, but may retry at once).
    EQUAL: uniform in [c/2, c] (the default: spread out, and never sooner than half the ceiling).
    NONE: exactly c.
    """

    FULL = "full"
    EQUAL = "equal"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: the n-th attempt's retry waits up to min(cap, base * factor**(n-1)) s."""

    base: float = DEFAULT_BACKOFF_BASE_S
    factor: float = DEFAULT_BACKOFF_FACTOR
    cap: float = DEFAULT_BACKOFF_CAP_S
    jitter: Jitter = Jitter.EQUAL

    def __post_init__(self) -> None:
        if not (is_number(self.base) and self.base >= 0):
            raise TaskOptionError(f"retry_backoff: base must be a finite number >= 0, got {self.base!r}")
        if not (is_number(self.factor) and self.factor >= 1):
            raise TaskOptionError(f"retry_backoff: factor must be a finite number >= 1, got {self.factor!r}")
        if not (is_number(self.cap) and self.cap >= self.base):
            raise TaskOptionError(f"retry_backoff: cap must be a finite number >= base ({self.base}), got {self.cap!r}")
        try:
            object.__setattr__(self, "jitter", Jitter(self.jitter))
        except ValueError:
            raise TaskOptionError(
                f"retry_backoff: jitter must be one of {[j.value for j in Jitter]}, got {self.jitter!r}"
            ) from None

    @classmethod
    def of(cls, spec: BackoffSpec) -> Backoff:
        """A Backoff from a Backoff, a base in seconds, or a tuple (base[, factor[, cap[, jitter]]])."""
        if isinstance(spec, Backoff):
            return spec
        if is_number(spec):
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
class RetryDecision:
    """What to do with a failed message: retry after `delay_s`, or fail it now (`final`)."""

    final: bool
    delay_s: float = 0.0


def retry_decision(message: Message, retryable: bool, rng: random.Random | None = None) -> RetryDecision:
    """The policy for a failed delivery: fail it, nack it at once, or wait its backoff.

    A non-retryable failure fails at once; one out of attempts is nacked without delay (the store
    makes it a dead letter); any other waits its backoff.
    """
    if not retryable:
        return RetryDecision(final=True)
    if message.attempts >= message.max_attempts:
        return RetryDecision(final=False)
    return RetryDecision(final=False, delay_s=backoff_delay(message.attempts, backoff_of(message.headers), rng))


def is_retryable(exc: BaseException, no_retry: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether a retry could help.

    Not if the exception's class says `retryable = False`, nor if it is one of the task's
    `no_retry` types.
    """
    try:  # an exception object may do anything, even when asked this
        if getattr(exc, "retryable", True) is False:
            return False
    except Exception:
        return True
    return not (no_retry and isinstance(exc, no_retry))


def heartbeat_s(lease_s: float | None) -> float:
    """Seconds between extensions of a running task's lease (None: the default lease)."""
    return (lease_s or DEFAULT_LEASE_S) / HEARTBEAT_FRACTION


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
