"""Helpers over batches of message ids.

Helpers over batches of message ids: whether they run consecutively, first occurrences within a
batch, membership, [start, end) ranges of ids, and ids sorted for paging. A batch is any sequence
of ints (an `array("q")`, a list, a `range`); the common cases take no Python loop per id.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable, Sequence


def span(ids: Sequence[int]) -> int | None:
    """The first of `ids` when they run consecutively upwards (first, first + 1, ...), else None.

    Ids put together and taken in order do: then a batch is a slice of every column. A `range`
    says so at once; other batches are looked at in C (sorted, and no id twice).
    """
    n = len(ids)
    if not n:
        return None
    first = ids[0]
    if type(ids) is range:
        return first if ids.step == 1 or n == 1 else None
    if ids[-1] - first != n - 1:
        return None
    if n > 2:
        values = ids.tolist() if isinstance(ids, array) else list(ids)
        if values != sorted(values) or len(set(values)) != n:
            return None
    return first


def as_range(ids: Sequence[int]) -> Sequence[int]:
    """`ids` as a `range` when they run consecutively upwards (then every step after is a slice), else as they are."""
    first = span(ids)
    return ids if first is None or type(ids) is range else range(first, first + len(ids))


def first_occurrences(ids: Sequence[int]) -> bytes:
    """Mask (a byte an id, 0 or 1) of each id's first place in `ids`: a duplicate within one call counts once."""
    n = len(ids)
    if n < 2 or span(ids) is not None or len(set(ids)) == n:  # the usual cases, without a loop
        return b"\x01" * n
    seen: set[int] = set()
    out = bytearray(n)
    for k, i in enumerate(ids):
        if i not in seen:
            out[k] = 1
            seen.add(i)
    return bytes(out)


def member(ids: Iterable[int], sub: Iterable[int]) -> bytes:
    """Mask (a byte an id, 0 or 1) of `ids` that are in `sub`."""
    return bytes(map(set(sub).__contains__, ids))


def runs(codes: bytes | bytearray, code: int, first: int) -> list[tuple[int, int]]:
    """[start, end) id ranges where `codes` holds `code`; codes[0] stands for id `first`."""
    return [(first + m.start(), first + m.end()) for m in re.finditer(re.escape(bytes((code,))) + b"+", codes)]


def extend_ranges(gaps: list[tuple[int, int]], ranges: Iterable[tuple[int, int]]) -> None:
    """Append ascending [start, end) ranges to `gaps`, joining a range that starts where the last one ends."""
    for a, b in ranges:
        if gaps and gaps[-1][1] == a:
            gaps[-1] = (gaps[-1][0], b)
        else:
            gaps.append((a, b))


def sorted_above(ids: Iterable[int], after: int) -> list[int]:
    """The ids above `after`, sorted."""
    return sorted(filter(after.__lt__, ids))
