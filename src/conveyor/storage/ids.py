"""Helpers over arrays of message ids, in numpy.

Helpers over arrays of message ids: first occurrences within a batch, membership of sorted ids,
[start, end) ranges of ids, and ids sorted for paging. Numpy throughout: batches and recoveries
handle millions of ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import numpy as np

_SMALL = 64  # below this many ids, plain Python beats numpy's per-call cost


def first_occurrences(ids: np.ndarray) -> np.ndarray:
    """Mask of each id's first place in `ids`: a duplicate within one call counts once."""
    if len(ids) < 2:
        return np.ones(len(ids), bool)
    if len(ids) <= _SMALL and len(set(ids.tolist())) == len(ids):  # the usual case, without sorting
        return np.ones(len(ids), bool)
    first = np.zeros(len(ids), bool)
    first[np.unique(ids, return_index=True)[1]] = True
    return first


def member(ids: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """Mask of `ids` (sorted, unique) that are in `sub` (sorted, unique)."""
    if not len(sub):
        return np.zeros(len(ids), bool)
    pos = np.searchsorted(sub, ids)
    return cast(np.ndarray, (pos < len(sub)) & (sub[np.minimum(pos, len(sub) - 1)] == ids))


def runs(mask: np.ndarray, first: int) -> list[tuple[int, int]]:
    """[start, end) id ranges where `mask` is True; mask[0] stands for id `first`."""
    if not mask.any():
        return []
    edges = np.flatnonzero(np.diff(np.r_[False, mask, False]))
    return [(first + int(a), first + int(b)) for a, b in zip(edges[0::2], edges[1::2], strict=True)]


def extend_ranges(gaps: list[tuple[int, int]], ranges: Iterable[tuple[int, int]]) -> None:
    """Append ascending [start, end) ranges to `gaps`, joining a range that starts where the last one ends."""
    for a, b in ranges:
        if gaps and gaps[-1][1] == a:
            gaps[-1] = (gaps[-1][0], b)
        else:
            gaps.append((a, b))


def sorted_above(ids: Iterable[int], after: int) -> np.ndarray:
    """The ids above `after`, sorted (numpy: paging through a million ids stays cheap)."""
    arr = np.fromiter(ids, np.int64)
    arr = arr[arr > after]
    arr.sort()
    return arr
