"""The id-array helpers of the stores (`conveyor.storage.ids`), against plain Python on random ids.

Batches and recoveries run them over millions of ids, so they are numpy; each must agree with the
obvious Python for every input, including the small batches that take a shortcut.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from conveyor.storage.ids import extend_ranges, first_occurrences, member, runs, sorted_above

IDS = st.lists(st.integers(0, 300), max_size=200)  # past the small-batch shortcut (64), with duplicates


@given(IDS)
def test_first_occurrences_marks_each_ids_first_place(ids: list[int]) -> None:
    seen: set[int] = set()
    expected = []
    for i in ids:
        expected.append(i not in seen)
        seen.add(i)
    assert first_occurrences(np.array(ids, np.int64)).tolist() == expected


@given(IDS, IDS)
def test_member_marks_the_ids_in_the_other_set(ids: list[int], sub: list[int]) -> None:
    a, b = sorted(set(ids)), sorted(set(sub))
    got = member(np.array(a, np.int64), np.array(b, np.int64))
    assert got.tolist() == [i in set(b) for i in a]


@given(st.lists(st.booleans(), max_size=100), st.integers(0, 10**12))
def test_runs_are_the_ranges_of_true_and_extend_ranges_joins_touching_ones(mask: list[bool], first: int) -> None:
    ranges = runs(np.array(mask, bool), first)
    assert [first + k for k, m in enumerate(mask) if m] == [i for a, b in ranges for i in range(a, b)]
    assert all(b < c for (_, b), (c, _) in itertools.pairwise(ranges))  # maximal: never touching
    joined: list[tuple[int, int]] = []
    half = len(mask) // 2
    extend_ranges(joined, runs(np.array(mask[:half], bool), first))
    extend_ranges(joined, runs(np.array(mask[half:], bool), first + half))
    assert joined == ranges  # two halves extended one after the other: a run across the cut is one range


@given(IDS, st.integers(-1, 301))
def test_sorted_above_pages_past_an_id(ids: list[int], after: int) -> None:
    assert sorted_above(iter(ids), after).tolist() == sorted(i for i in ids if i > after)
