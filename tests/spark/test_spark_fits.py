"""The quick schema check of map results (conveyor.spark.fits), and the results check that uses it.

The quick check says "surely fits" only where pyarrow's conversion agrees, and says it for the plain
rows a map returns. The check of a message's results that uses it is spark/rows.py `_misfits`.
"""

from __future__ import annotations

import collections
import enum
import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import conveyor.spark.fits as fits
from conveyor.spark.fits import EXACT_DOUBLE_INT, FitCheck
from conveyor.spark.rows import _misfits

PLAIN_TYPES = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
    pa.float32(),
    pa.float64(),
    pa.string(),
    pa.large_string(),
    pa.binary(),
    pa.large_binary(),
    pa.bool_(),
]


class Small(enum.IntEnum):
    ONE = 1


def surely_fit(rows: list[Any], schema: pa.Schema) -> bool:
    return FitCheck(schema).surely_fit(rows)


def converts(rows: list[dict[str, Any]], schema: pa.Schema) -> bool:
    try:
        pa.RecordBatch.from_pylist(rows, schema=schema)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return False
    return True


EDGES = [
    2**7 - 1,
    2**7,
    -(2**7) - 1,
    2**8 - 1,
    2**8,
    2**31,
    -(2**31) - 1,
    2**32,
    2**63 - 1,
    2**63,
    2**64,
    EXACT_DOUBLE_INT,
    EXACT_DOUBLE_INT + 1,
    -EXACT_DOUBLE_INT - 1,
    -1,
]
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(EDGES),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.sampled_from(["\udc80", "ok\ud800", "é", "日本"]),
    st.binary(),
    st.sampled_from([np.int64(3), np.float64(1.5), Small.ONE, bytearray(b"x"), [1], {"a": 1}, 1j]),
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(PLAIN_TYPES), st.lists(values, min_size=1, max_size=6))
def test_surely_fit_only_what_pyarrow_converts(t: pa.DataType, vals: list[Any]) -> None:
    schema = pa.schema([("x", t), ("y", pa.int64())])
    rows = [{"x": v, "y": 1} for v in vals]
    if surely_fit(rows, schema):
        assert converts(rows, schema), (t, vals)


@pytest.mark.parametrize(
    ("t", "value"),
    [
        (pa.int64(), 2**63 - 1),
        (pa.int64(), -(2**63)),
        (pa.int8(), -128),
        (pa.uint64(), 2**64 - 1),
        (pa.float64(), 1.5),
        (pa.float64(), 3),
        (pa.float64(), float("nan")),
        (pa.float32(), 1e300),
        (pa.string(), "plain"),
        (pa.string(), "é 日本"),
        (pa.large_string(), ""),
        (pa.binary(), b"\x00"),
        (pa.bool_(), False),
        (pa.int64(), None),
    ],
)
def test_plain_values_are_answered_without_pyarrow(t: pa.DataType, value: Any) -> None:
    schema = pa.schema([("x", t)])
    assert surely_fit([{"x": value}, {"x": value}], schema)
    assert converts([{"x": value}], schema)


@pytest.mark.parametrize(
    ("t", "value"),
    [
        (pa.int64(), 2**63),
        (pa.int64(), True),
        (pa.int64(), 1.0),
        (pa.int64(), np.int64(1)),
        (pa.int64(), Small.ONE),
        (pa.uint8(), -1),
        (pa.float64(), EXACT_DOUBLE_INT + 1),
        (pa.float32(), 1),
        (pa.string(), "\udc80"),
        (pa.string(), b"bytes"),
        (pa.binary(), bytearray(b"x")),
        (pa.bool_(), 1),
    ],
)
def test_anything_in_doubt_is_left_to_pyarrow(t: pa.DataType, value: Any) -> None:
    assert not surely_fit([{"x": value}], pa.schema([("x", t)]))


def test_a_schema_with_a_type_that_is_not_plain_is_always_left_to_pyarrow() -> None:
    schema = pa.schema([("x", pa.int64()), ("when", pa.timestamp("us")), ("tags", pa.list_(pa.string()))])
    assert not surely_fit([{"x": 1, "when": None, "tags": None}], schema)
    assert surely_fit([], pa.schema([("x", pa.int64())]))  # no rows: nothing to refuse


def test_rows_that_are_not_plain_dicts_are_left_to_pyarrow() -> None:
    schema = pa.schema([("x", pa.int64())])
    for row in ([1], (1,), None, collections.UserDict({"x": 1})):
        assert not surely_fit([row], schema)


def test_text_and_bytes_beyond_what_one_array_holds_are_left_to_pyarrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fits, "SIZED_BYTES_MAX", 10)
    for t, small, big in ((pa.string(), "abcd", "abcdefghijk"), (pa.binary(), b"abcd", b"abcdefghijk")):
        schema = pa.schema([("x", t)])
        assert surely_fit([{"x": small}, {"x": small}], schema)
        assert not surely_fit([{"x": small}] * 3, schema)  # 12 bytes in all
        assert not surely_fit([{"x": big}], schema)
    assert not surely_fit([{"x": "ééé"}], pa.schema([("x", pa.string())]))  # counted at 4 bytes a character
    assert surely_fit([{"x": "abcdefghijk"}], pa.schema([("x", pa.large_string())]))  # 64-bit offsets


def test_a_check_pickles_as_it_travels_with_its_runner() -> None:
    check = pickle.loads(pickle.dumps(FitCheck(pa.schema([("x", pa.int32()), ("y", pa.string())]))))
    assert check.surely_fit([{"x": 1, "y": "a"}])
    assert not check.surely_fit([{"x": 2**31, "y": "a"}])


def test_a_message_s_misfit_rows_are_told_apart_from_the_rows_that_fit() -> None:
    schema = pa.schema([("i", pa.int64()), ("name", pa.string())])
    check = FitCheck(schema)
    good = [{"i": 1, "name": "a"}, {"i": 2, "name": None}]
    assert _misfits(good, schema, check) == {}
    bad = [good[0], {"i": "two", "name": "b"}, good[1], {"i": 2**64, "name": "c"}]
    found = _misfits(bad, schema, check)
    assert sorted(found) == [1, 3]
    assert "'two'" in found[1] and "does not fit the schema" in found[1]
    assert _misfits(bad, schema) == found  # without the quick check: the same answer
