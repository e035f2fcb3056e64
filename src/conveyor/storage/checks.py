"""Checks of what callers pass to a store's operations: a put's columns, results, errors, leases and id lists.

Each raises TypeError or ValueError naming the operation, before the store changes anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from conveyor.constants import MAX_ATTEMPTS_LIMIT, MAX_LEASE_S, PRIORITY_MAX, PRIORITY_MIN


def check_put(
    payloads: Sequence[bytes],
    priority: int | Sequence[int],
    not_before: float | Sequence[float],
    max_attempts: int | Sequence[int],
    headers: Sequence[dict[str, str]] | None,
    default_max_attempts: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The columns of a put of `payloads`: (priority, not_before, max_attempts).

    The columns of a put of `payloads` (a scalar applies to all): (priority, not_before,
    max_attempts), with max_attempts 0 replaced by `default_max_attempts`.
    """
    n = len(payloads)
    prio = column(priority, n, np.int64, "priority")
    max_att = column(max_attempts, n, np.int64, "max_attempts")
    nb = column(not_before, n, np.float64, "not_before")
    if not all(type(p) is bytes for p in payloads):
        bad = next(i for i, p in enumerate(payloads) if type(p) is not bytes)
        raise TypeError(f"put: message {bad} has a {type(payloads[bad]).__name__} payload, not bytes")
    if (prio < PRIORITY_MIN).any() or (prio > PRIORITY_MAX).any():
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
    if (max_att < 0).any() or (max_att > MAX_ATTEMPTS_LIMIT).any():
        raise ValueError(f"put: max_attempts must be within [0, {MAX_ATTEMPTS_LIMIT}] (0: store default)")
    if not np.isfinite(nb).all():
        raise ValueError("put: not_before must be a finite time")
    max_att[max_att == 0] = default_max_attempts
    return prio, nb, max_att


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


def as_ids(ids: Sequence[int]) -> np.ndarray:
    """Message ids as an int64 array; TypeError unless they are a flat sequence of integers."""
    arr = np.asarray(ids)
    if arr.size == 0:
        return np.empty(0, np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise TypeError(f"message ids must be a flat sequence of integers, got {type(ids).__name__}")
    return arr.astype(np.int64, copy=False)


def column(value: object, n: int, dtype: type, name: str) -> np.ndarray:
    """A writable array of n values from a sequence, or from one value for all.

    A writable array of n values from a sequence, or from one value for all; TypeError unless every
    value is an integer (an integer dtype) or a number (a float dtype): 2.7 is no max_attempts.
    """
    kinds = "iu" if np.dtype(dtype).kind in "iu" else "iuf"
    if type(value) in (list, tuple) and (seq := cast("Sequence[object]", value)) and seq.count(seq[0]) == len(seq):
        value = seq[0]  # the usual case: one value for all (equal values: 1 and 1.0 hold the same)
    arr = np.asarray(value) if isinstance(value, (int, float, np.number, list, tuple, np.ndarray)) else None
    if arr is None or arr.dtype.kind not in kinds or arr.ndim > 1 or (arr.ndim == 1 and len(arr) != n):
        want = "an integer" if kinds == "iu" else "a number"
        raise TypeError(f"put: {name} must be {want} (one for all, or one per message), got {value!r:.60}")
    return np.full(n, arr, dtype) if arr.ndim == 0 else arr.astype(dtype)
