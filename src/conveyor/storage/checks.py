"""Checks of what callers pass to a store's operations: a put's columns, results, errors, leases and id lists.

Each raises TypeError or ValueError naming the operation, before the store changes anything.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Any, cast

from conveyor.constants import MAX_ATTEMPTS_LIMIT, MAX_LEASE_S, PRIORITY_MAX, PRIORITY_MIN
from conveyor.storage.ids import as_range


def check_put(
    payloads: Sequence[bytes],
    priority: int | Sequence[int],
    not_before: float | Sequence[float],
    max_attempts: int | Sequence[int],
    headers: Sequence[dict[str, str]] | None,
    default_max_attempts: int,
) -> tuple[array[int], array[float], array[int]]:
    """The columns of a put of `payloads`: (priority, not_before, max_attempts).

    The columns of a put of `payloads` (a scalar applies to all): (priority, not_before,
    max_attempts), with max_attempts 0 replaced by `default_max_attempts`.
    """
    n = len(payloads)
    prio = column(priority, n, True, "priority")
    max_att = column(max_attempts, n, True, "max_attempts")
    nb = column(not_before, n, False, "not_before")
    if not all(type(p) is bytes for p in payloads):
        bad = next(i for i, p in enumerate(payloads) if type(p) is not bytes)
        raise TypeError(f"put: message {bad} has a {type(payloads[bad]).__name__} payload, not bytes")
    if min(prio, default=0) < PRIORITY_MIN or max(prio, default=0) > PRIORITY_MAX:
        raise ValueError(f"put: priority must be within [{PRIORITY_MIN}, {PRIORITY_MAX}]")
    if headers is not None:
        if len(headers) != n:
            raise ValueError(f"put: {n} payloads but {len(headers)} headers")
        last = None
        for i, h in enumerate(headers):
            if h is last:  # one dict shared by a batch (a server's put): checked once
                continue
            if h and (type(h) is not dict or not all(type(k) is str and type(v) is str for k, v in h.items())):
                raise TypeError(f"put: message {i} headers must be a dict of str to str")
            last = h
    if min(max_att, default=0) < 0 or max(max_att, default=0) > MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"put: max_attempts must be within [0, {MAX_ATTEMPTS_LIMIT}] (0: store default)")
    try:
        finite = all(map(math.isfinite, nb))
    except OverflowError:  # an int too big for a float
        finite = False
    if not finite:
        raise ValueError("put: not_before must be a finite time")
    if 0 in max_att:
        max_att = [default_max_attempts if x == 0 else x for x in max_att]
    times = n if len(prio) == 1 else 1, n if len(nb) == 1 else 1, n if len(max_att) == 1 else 1
    return array("i", prio) * times[0], array("d", nb) * times[1], array("H", max_att) * times[2]


def check_results(n: int, results: Sequence[bytes | None]) -> None:
    """The results of an ack of `n` ids: one per id, each bytes or None."""
    if len(results) != n:
        raise ValueError(f"ack: {n} ids but {len(results)} results")
    for r in results:
        if r is not None and type(r) is not bytes:
            raise TypeError(f"ack: a result must be bytes or None, not {type(r).__name__}")


def check_nack(n: int, errors: Sequence[str] | None, delay_s: float) -> list[str]:
    """The errors of a nack of `n` ids (one per id, "" when None), after checking them and its delay."""
    errs = [""] * n if errors is None else list(errors)
    if len(errs) != n:
        raise ValueError(f"nack: {n} ids but {len(errs)} errors")
    if not all(type(e) is str for e in errs):
        raise TypeError("nack: errors must be str")
    if not 0 <= delay_s < float("inf"):
        raise ValueError(f"nack: delay_s must be a finite number >= 0, got {delay_s}")
    return errs


def check_lease(lease_s: object, what: str) -> float:
    """A lease as a float within (0, MAX_LEASE_S], else ValueError (an endless lease would never return a message)."""
    if type(lease_s) not in (int, float) or not 0 < cast(float, lease_s) <= MAX_LEASE_S:
        raise ValueError(f"{what}: lease_s must be a number of seconds in (0, {MAX_LEASE_S:g}], got {lease_s!r}")
    return float(cast(float, lease_s))


def as_ids(ids: Sequence[int]) -> Sequence[int]:
    """Message ids as an `array("q")`, or a `range` when they run consecutively.

    TypeError unless they are a flat sequence of integers.
    """
    if type(ids) is range:
        return ids
    if not isinstance(ids, (str, bytes, bytearray, memoryview)):
        try:
            return as_range(ids if isinstance(ids, array) and ids.typecode == "q" else array("q", ids))
        except (TypeError, OverflowError):
            pass
    raise TypeError(f"message ids must be a flat sequence of integers, got {type(ids).__name__}")


def column(value: object, n: int, integer: bool, name: str) -> Sequence[Any]:
    """n values from a sequence, or one value for all: one value per message, or a sequence of one for all.

    TypeError unless every value is an integer (`integer`) or a number: 2.7 is no max_attempts,
    and True no priority.
    """
    ok = _integer if integer else _number
    if type(value) in (list, tuple) and (seq := cast("Sequence[object]", value)) and seq.count(seq[0]) == len(seq):
        value = seq[0]  # the usual case: one value for all (equal values: 1 and 1.0 hold the same)
    if type(value) in (list, tuple):
        seq = cast("Sequence[object]", value)
        if len(seq) == n and all(map(ok, set(map(type, seq)))):
            return seq
    elif ok(type(value)):
        return [value]
    want = "an integer" if integer else "a number"
    raise TypeError(f"put: {name} must be {want} (one for all, or one per message), got {value!r:.60}")


def _integer(t: type) -> bool:
    return t is not bool and (issubclass(t, int) or hasattr(t, "__index__"))


def _number(t: type) -> bool:
    return _integer(t) or issubclass(t, float)
