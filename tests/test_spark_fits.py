"""The quick schema check of map results (conveyor.spark.fits): it says "surely fits" only where
pyarrow's conversion agrees, and says it for the plain rows a map returns."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.spark.fits import EXACT_DOUBLE_INT, surely_fit

PLAIN_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
               pa.float32(), pa.float64(), pa.string(), pa.large_string(), pa.binary(), pa.large_binary(),
               pa.bool_()]  # fmt: skip


class Small(enum.IntEnum):
    ONE = 1


def converts(rows: list[dict[str, Any]], schema: pa.Schema) -> bool:
    try:
        pa.RecordBatch.from_pylist(rows, schema=schema)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return False
    return True


EDGES = [2**7 - 1, 2**7, -(2**7) - 1, 2**8 - 1, 2**8, 2**31, -(2**31) - 1, 2**32, 2**63 - 1, 2**63, 2**64,
         EXACT_DOUBLE_INT, EXACT_DOUBLE_INT + 1, -EXACT_DOUBLE_INT - 1, -1]  # fmt: skip
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


@pytest.mark.parametrize(("t", "value"), [
    (pa.int64(), 2**63 - 1), (pa.int64(), -(2**63)), (pa.int8(), -128), (pa.uint64(), 2**64 - 1),
    (pa.float64(), 1.5), (pa.float64(), 3), (pa.float64(), float("nan")), (pa.float32(), 1e300),
    (pa.string(), "plain"), (pa.string(), "é 日本"), (pa.large_string(), ""), (pa.binary(), b"\x00"),
    (pa.bool_(), False), (pa.int64(), None),
])  # fmt: skip
def test_plain_values_are_answered_without_pyarrow(t: pa.DataType, value: Any) -> None:
    schema = pa.schema([("x", t)])
    assert surely_fit([{"x": value}, {"x": value}], schema)
    assert converts([{"x": value}], schema)


@pytest.mark.parametrize(("t", "value"), [
    (pa.int64(), 2**63), (pa.int64(), True), (pa.int64(), 1.0), (pa.int64(), np.int64(1)), (pa.int64(), Small.ONE),
    (pa.uint8(), -1), (pa.float64(), EXACT_DOUBLE_INT + 1), (pa.float32(), 1), (pa.string(), "\udc80"),
    (pa.string(), b"bytes"), (pa.binary(), bytearray(b"x")), (pa.bool_(), 1),
])  # fmt: skip
def test_anything_in_doubt_is_left_to_pyarrow(t: pa.DataType, value: Any) -> None:
    assert not surely_fit([{"x": value}], pa.schema([("x", t)]))


def test_a_schema_with_a_type_that_is_not_plain_is_always_left_to_pyarrow() -> None:
    schema = pa.schema([("x", pa.int64()), ("when", pa.timestamp("us")), ("tags", pa.list_(pa.string()))])
    assert not surely_fit([{"x": 1, "when": None, "tags": None}], schema)
    assert surely_fit([], pa.schema([("x", pa.int64())]))  # no rows: nothing to refuse
