"""The id helpers of the stores (`conveyor.storage.ids`), against plain Python on random ids.

Batches and recoveries run them over millions of ids, so they take shortcuts (consecutive ids, no
duplicates, bytes methods); each must agree with the obvious Python for every input.
"""

from __future__ import annotations

import itertools
from array import array

from hypothesis import given
from hypothesis import strategies as st

from conveyor.storage.ids import extend_ranges, first_occurrences, member, runs, sorted_above, span

IDS = st.lists(st.integers(0, 300), max_size=200)  # with duplicates, and runs of consecutive ids now and then
RUNS = st.builds(lambda a, n: list(range(a, a + n)), st.integers(0, 300), st.integers(0, 100))


@given(IDS | RUNS)
def test_span_is_the_first_id_of_consecutive_ascending_ids_only(ids: list[int]) -> None:
    consecutive = ids == list(range(ids[0], ids[0] + len(ids))) if ids else False
    for batch in (ids, array("q", ids), tuple(ids)):
        assert span(batch) == (ids[0] if consecutive else None)
    if consecutive:
        assert span(range(ids[0], ids[0] + len(ids))) == ids[0]


@given(IDS | RUNS)
def test_first_occurrences_marks_each_ids_first_place(ids: list[int]) -> None:
    seen: set[int] = set()
    expected = []
    for i in ids:
        expected.append(i not in seen)
        seen.add(i)
    assert first_occurrences(array("q", ids)) == bytes(expected)


@given(IDS, IDS)
def test_member_marks_the_ids_in_the_other_set(ids: list[int], sub: list[int]) -> None:
    a, b = sorted(set(ids)), sorted(set(sub))
    assert member(array("q", a), array("q", b)) == bytes(i in set(b) for i in a)


@given(st.lists(st.sampled_from([0, 1, 4, 255]), max_size=100), st.integers(0, 10**12))
def test_runs_are_the_ranges_of_a_code_and_extend_ranges_joins_touching_ones(codes: list[int], first: int) -> None:
    ranges = runs(bytes(codes), 255, first)
    assert [first + k for k, c in enumerate(codes) if c == 255] == [i for a, b in ranges for i in range(a, b)]
    assert all(b < c for (_, b), (c, _) in itertools.pairwise(ranges))  # maximal: never touching
    joined: list[tuple[int, int]] = []
    half = len(codes) // 2
    extend_ranges(joined, runs(bytearray(codes[:half]), 255, first))
    extend_ranges(joined, runs(bytearray(codes[half:]), 255, first + half))
    assert joined == ranges  # two halves extended one after the other: a run across the cut is one range


@given(IDS, st.integers(-1, 301))
def test_sorted_above_pages_past_an_id(ids: list[int], after: int) -> None:
    assert sorted_above(iter(ids), after) == sorted(i for i in ids if i > after)
