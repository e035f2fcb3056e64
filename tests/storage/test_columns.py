"""The column helpers of the stores (`conveyor.storage.columns`), against plain Python on random input.

They take shortcuts (a slice for consecutive positions, stretches of them in a long batch, bytes
methods over masks, strided byte slices over records); each must agree with the obvious Python for
every input, shortcut or not. Records are checked against `struct`, with the layouts of the files.
"""

from __future__ import annotations

import struct
from array import array

from hypothesis import given
from hypothesis import strategies as st

from conveyor.constants import INDEX_FIELDS, INDEX_RECORD, MESSAGE_PREFIX, MESSAGE_PREFIX_FIELDS
from conveyor.storage.columns import (
    NOT,
    add,
    column,
    column_bytes,
    fill,
    gather,
    layout,
    mask_and,
    mask_or,
    nonzero,
    pack_column,
    put,
    put_all,
    table,
    where,
)

SIZE = 600  # a window long enough for batches past the length where stretches are looked for (256)
IDS_AT = 1000  # the window's first id
# positions: scattered (repeats included), or stretches of consecutive ones, long and short
SCATTERED = st.lists(st.integers(0, SIZE - 1), max_size=400)
STRETCHED = st.lists(
    st.tuples(st.integers(0, SIZE - 1), st.integers(1, 120)).map(lambda t: list(range(t[0], min(t[0] + t[1], SIZE)))),
    max_size=12,
).map(lambda parts: [p for part in parts for p in part])
POSITIONS = SCATTERED | STRETCHED


def columns() -> tuple[bytearray, array[int], array[float], list[object]]:
    return bytearray(range(256)) * 3, array("I", range(SIZE)), array("d", [0.5] * SIZE), [None] * SIZE


@given(POSITIONS)
def test_where_and_gather_read_what_is_at_the_ids(at: list[int]) -> None:
    ids = [IDS_AT + p for p in at]
    for batch in (ids, array("q", ids)):
        got = where(batch, IDS_AT)
        assert list(got) == at
        assert type(got) is range or not at or at != list(range(at[0], at[0] + len(at)))  # consecutive: a range
        for col in columns():
            assert gather(col, got) == [col[p] for p in at]


@given(POSITIONS, st.data())
def test_put_and_put_all_write_each_value_the_later_staying(at: list[int], data: st.DataObject) -> None:
    values = data.draw(st.lists(st.integers(0, 255), min_size=len(at), max_size=len(at)))
    written = [columns(), columns()]
    for cols in written:
        model = [list(c) for c in cols]
        for p, v in zip(at, values, strict=True):
            for m in model:
                m[p] = v
        where_ = where([IDS_AT + p for p in at], IDS_AT)
        if cols is written[0]:
            for c in cols:
                put(c, where_, values)
        else:  # by ids, as a recovery replays index records
            put_all(array("q", [IDS_AT + p for p in at]), [(c, values) for c in cols], IDS_AT)
        assert [list(c) for c in cols] == model


@given(POSITIONS, st.integers(0, 255))
def test_fill_writes_one_value_everywhere_asked(at: list[int], value: int) -> None:
    for col in columns():
        model = list(col)
        for p in at:
            model[p] = value
        fill(col, where([IDS_AT + p for p in at], IDS_AT), value)
        assert list(col) == model


@given(POSITIONS, st.sampled_from([1, -1, 3]))
def test_add_adds_to_each_position(at: list[int], by: int) -> None:
    col = array("q", [7] * SIZE)
    model = list(col)
    for p in at:
        model[p] += by
    add(col, where([IDS_AT + p for p in at], IDS_AT), by)
    assert list(col) == model


MASK = st.lists(st.booleans(), max_size=300).map(bytes)


@given(MASK, st.data())
def test_masks_combine_and_turn_over_position_by_position(a: bytes, data: st.DataObject) -> None:
    b = data.draw(st.lists(st.booleans(), min_size=len(a), max_size=len(a)).map(bytes))
    assert mask_and(a, b) == bytes(x and y for x, y in zip(a, b, strict=True))
    assert mask_or(a, b) == bytes(x or y for x, y in zip(a, b, strict=True))
    assert a.translate(NOT) == bytes(not x for x in a)


@given(st.sets(st.integers(0, 255)), st.binary(max_size=100))
def test_a_table_marks_its_codes(codes: set[int], data: bytes) -> None:
    assert data.translate(table(sorted(codes))) == bytes(c in codes for c in data)


@given(st.sampled_from("BHIq"), st.data())
def test_nonzero_marks_the_values_not_zero(code: str, data: st.DataObject) -> None:
    most = 2 ** (8 * array(code).itemsize - (code == "q")) - 1  # a value of every byte set
    some = [v for v in (1, 255, 256, 65535, 65536, 2**24) if v <= most]  # a byte set here and there
    values = data.draw(st.lists(st.sampled_from([0, most, *some]), max_size=50))
    assert nonzero(array(code, values)) == bytes(v != 0 for v in values)


RECORD = st.tuples(
    st.integers(0, 2**32 - 1),
    st.floats(allow_nan=False),
    st.integers(0, 2**63 - 1),
    st.integers(0, 255),
    st.integers(0, 255),
    st.integers(0, 2**16 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.floats(allow_nan=False),
)


@given(st.lists(RECORD, max_size=40), st.integers(0, 7))
def test_records_are_read_and_written_a_field_at_a_time_as_struct_lays_them_out(
    records: list[tuple[float, ...]], start: int
) -> None:
    fields = layout(INDEX_RECORD, INDEX_FIELDS)
    n = len(records)
    data = bytes(start) + b"".join(INDEX_RECORD.pack(*r) for r in records)
    written = bytearray(INDEX_RECORD.size * n)
    for k, name in enumerate(INDEX_FIELDS):
        f = fields[name]
        values = [r[k] for r in records]
        assert column(data, n, INDEX_RECORD.size, f, start).tolist() == values
        assert column_bytes(data, n, INDEX_RECORD.size, f, start) == b"".join(struct.pack("<" + f.code, v) for v in values)
        pack_column(written, INDEX_RECORD.size, f, values)
    assert bytes(written) == data[start:]


def test_a_layout_names_each_fields_offset_size_and_type() -> None:
    fields = layout(MESSAGE_PREFIX, MESSAGE_PREFIX_FIELDS)
    assert [(f.offset, f.size, f.code) for f in fields.values()] == [
        (0, 1, "B"),
        (1, 8, "Q"),
        (9, 4, "i"),
        (13, 2, "H"),
        (15, 8, "d"),
        (23, 8, "d"),
        (31, 4, "I"),
    ]
    assert sum(f.size for f in fields.values()) == MESSAGE_PREFIX.size
