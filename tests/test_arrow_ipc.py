"""Arrow IPC bytes and byte-bounded slices (conveyor.arrow_ipc), shared by the graph's channels and map_batches."""

from __future__ import annotations

import pyarrow as pa
import pytest

from conveyor.arrow_ipc import decode, encode, slices


def test_a_table_or_a_batch_comes_back_as_it_went() -> None:
    table = pa.table({"id": [1, 2, 3], "name": ["a", None, "c"]})
    assert decode(encode(table)).equals(table)
    assert decode(pa.py_buffer(encode(table.to_batches()[0]))).equals(table)


@pytest.mark.parametrize("sizes", [[100] * 64, [10] * 60 + [5_000] + [10] * 60, [10, 10, 50_000, 10]])
def test_slices_are_consecutive_runs_under_the_bound_or_single_rows(sizes: list[int]) -> None:
    """Uneven rows too: a run over the bound is halved, and only a row larger than the bound comes alone above it."""
    table = pa.table({"id": list(range(len(sizes))), "blob": [b"x" * n for n in sizes]})
    parts = list(slices(table, 2_000))
    assert pa.concat_tables(parts).equals(table)
    assert all(p.nbytes <= 2_000 or p.num_rows == 1 for p in parts)
    if len(set(sizes)) == 1:  # even rows: as few runs as the bound allows
        assert len(parts) == -(-table.nbytes // 2_000)


def test_a_small_table_is_one_slice() -> None:
    table = pa.table({"id": [1, 2]})
    assert list(slices(table, 1 << 20)) == [table]
