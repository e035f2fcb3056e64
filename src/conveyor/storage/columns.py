"""Per-message columns in typed arrays, and what a batch of ids reads from them or writes to them.

A queue's state keeps each per-message field in a column over its window of ids: the status in a
`bytearray` (a byte a message), numbers in `array.array`s of a fixed item size, objects in lists.
Where a batch sits in the window (`where`) is a `range` when its ids run consecutively (put
together, taken in order: the usual case), and then reading or writing it is one slice, copied,
filled or counted in C; any other batch loops over its own positions, never over a column.

Whole columns are scanned with bytes methods (`count`, `translate` through a `table`) and selected
with `itertools.compress`; byte masks are combined as integers (`mask_and`, `mask_or`). Records of
a fixed layout (a `struct` format with its field names: `layout`) are packed and unpacked a field
at a time with strided byte slices (`pack_column`, `column`), so that a million records take no
Python loop but their CRCs.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass
from itertools import compress, islice, pairwise
from operator import sub
from typing import Any, TypeAlias, TypeVar

from conveyor.storage.ids import span

T = TypeVar("T")
Where: TypeAlias = "range | list[int]"  # positions in a window; a range when they run consecutively
_LITTLE = sys.byteorder == "little"  # the files are little-endian, arrays in the machine's order
_MANY = 256  # positions past which `put` and `fill` look for stretches of consecutive ones


def where(ids: Sequence[int], base: int) -> Where:
    """The positions of `ids` (all in the window) in columns whose first entry is id `base`."""
    first = span(ids)
    if first is not None:
        return range(first - base, first - base + len(ids))
    return list(map((-base).__add__, ids))


def gather(col: Sequence[T], at: Where) -> list[T]:
    """The values of a column at these positions."""
    if type(at) is range:
        part = col[at.start : at.stop]
        return part.tolist() if isinstance(part, array) else list(part)
    return [col[i] for i in at]


def like(col: MutableSequence[Any], values: Sequence[Any]) -> MutableSequence[Any]:
    """`values` as what a slice of `col` takes: an array of its type, bytes, or a list."""
    if isinstance(col, array):
        if isinstance(values, array) and values.typecode == col.typecode:
            return values
        return array(col.typecode, values)
    if isinstance(col, bytearray):
        return bytearray(values)
    return list(values)


def repeated(col: MutableSequence[Any], value: Any, n: int) -> MutableSequence[Any]:
    """`n` times `value`, as what a slice of `col` takes."""
    if isinstance(col, array):
        return array(col.typecode, (value,)) * n
    if isinstance(col, bytearray):
        return bytearray((value,)) * n
    return [value] * n


def put(col: MutableSequence[Any], at: Where, values: Sequence[Any]) -> None:
    """Write one value per position (where a position comes twice, the later value stays)."""
    put_all(at, [(col, values)])


def put_all(at: Sequence[int], writes: Sequence[tuple[MutableSequence[Any], Sequence[Any]]], base: int = 0) -> None:
    """`put` into several columns at the same positions, (column, values) each: those of ids `at` given a `base`."""
    if type(at) is range:
        for col, values in writes:
            col[at.start - base : at.stop - base] = like(col, values)
        return
    stretches = _stretches(at)
    for col, values in writes:
        if stretches is None:
            for i, v in zip(at, values, strict=True):
                col[i - base] = v
        else:
            for a, b in stretches:
                col[at[a] - base : at[a] - base + b - a] = like(col, values[a:b])


def fill(col: MutableSequence[Any], at: Where, value: Any) -> None:
    """Write `value` at every position."""
    if type(at) is range:
        col[at.start : at.stop] = repeated(col, value, len(at))
        return
    stretches = _stretches(at)
    if stretches is None:
        for i in at:
            col[i] = value
    else:
        for a, b in stretches:
            col[at[a] : at[a] + b - a] = repeated(col, value, b - a)


def _stretches(at: Sequence[int]) -> list[tuple[int, int]] | None:
    """The [a, b) spans of `at` whose positions run consecutively, if long; None when a loop costs less."""
    if len(at) < _MANY:
        return None
    steps = bytes(map((1).__eq__, map(sub, islice(at, 1, None), at)))  # 1 where the next position follows
    if steps.count(0) * 8 > len(at):  # short stretches: a slice each costs more than a loop
        return None
    return list(pairwise([0, *(k + 1 for k in compress(range(len(steps)), steps.translate(NOT))), len(at)]))


def add(col: array[int], at: Where, by: int) -> None:
    """Add `by` to the values at these positions."""
    if type(at) is not range:
        for i in at:
            col[i] += by
    elif len(at):
        part = col[at.start : at.stop]
        if part.count(part[0]) == len(part):  # the usual case: a batch's messages were delivered as often
            col[at.start : at.stop] = array(col.typecode, (part[0] + by,)) * len(part)
        else:
            col[at.start : at.stop] = array(col.typecode, map(by.__add__, part))


def table(codes: Sequence[int]) -> bytes:
    """A `bytes.translate` table that maps each of `codes` to 1 and every other byte to 0."""
    out = bytearray(256)
    for c in codes:
        out[c] = 1
    return bytes(out)


NOT = table((0,))  # a byte mask turned over, through `bytes.translate`
_NONZERO = table(range(1, 256))


def nonzero(col: array[int]) -> bytes:
    """The byte mask (0 or 1 a value) of the values of an integer array that are not zero."""
    raw = col.tobytes()
    mask = raw[:: col.itemsize].translate(_NONZERO)
    for j in range(1, col.itemsize):  # a value is zero when each of its bytes is
        mask = mask_or(mask, raw[j :: col.itemsize].translate(_NONZERO))
    return mask


def mask_and(a: bytes | bytearray, b: bytes | bytearray) -> bytes:
    """Byte masks (0 or 1 a byte, as long as each other) combined position by position: both set."""
    return (int.from_bytes(a, "little") & int.from_bytes(b, "little")).to_bytes(len(a), "little")


def mask_or(a: bytes | bytearray, b: bytes | bytearray) -> bytes:
    """Byte masks (0 or 1 a byte, as long as each other) combined position by position: either set."""
    return (int.from_bytes(a, "little") | int.from_bytes(b, "little")).to_bytes(len(a), "little")


# --- records of a fixed layout ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Field:
    """Where a field sits in a record, how big it is, and its `struct`/`array` type code."""

    offset: int
    size: int
    code: str


def layout(record: struct.Struct, names: Sequence[str]) -> dict[str, Field]:
    """The fields of a little-endian `record` format (one type letter a field), named in order."""
    order, codes = record.format[0], record.format[1:]
    if order != "<" or len(codes) != len(names):
        raise ValueError(f"{record.format!r}: a little-endian format of one letter per field of {names} is expected")
    fields = {}
    for k, (name, code) in enumerate(zip(names, codes, strict=True)):
        size = struct.calcsize(order + code)
        if code not in "sx" and array(code).itemsize != size:
            raise ValueError(f"{record.format!r}: field {name!r} has no array type of {size} bytes")
        fields[name] = Field(struct.calcsize(order + codes[:k]), size, code)
    return fields


def column_bytes(buf: bytes | bytearray, n: int, stride: int, f: Field, start: int = 0) -> bytes:
    """The bytes of field `f` of `n` records of `stride` bytes from `buf[start:]`, end to end."""
    first = start + f.offset
    if f.size == 1:
        return bytes(buf[first : first + stride * n : stride])
    raw = bytearray(n * f.size)
    for j in range(f.size):
        raw[j :: f.size] = buf[first + j : first + j + stride * n : stride]
    return bytes(raw)


def column(buf: bytes | bytearray, n: int, stride: int, f: Field, start: int = 0) -> array[Any]:
    """Field `f` of `n` records of `stride` bytes from `buf[start:]`, as an array."""
    col = array(f.code, column_bytes(buf, n, stride, f, start))
    if not _LITTLE:
        col.byteswap()
    return col


def pack_column(out: bytearray, stride: int, f: Field, values: Sequence[Any]) -> None:
    """Write field `f` of each record in `out` (records of `stride` bytes), one value a record."""
    raw = values if isinstance(values, array) and values.typecode == f.code and _LITTLE else array(f.code, values)
    if not _LITTLE:
        raw.byteswap()
    data = raw.tobytes()
    for j in range(f.size):
        out[f.offset + j :: stride] = data[j :: f.size]
