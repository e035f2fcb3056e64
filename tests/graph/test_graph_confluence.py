"""Confluence of the stock executors: the same rows, in shuffled orders and batchings, give the same output set.

(In-process: the executors are plain Python objects; the runtime only feeds them.)
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from conveyor import Executor
from conveyor.graph import Count, FilterProject, HashAggregate, HashJoin, Limit, Map, Sort
from conveyor.graph.channels import to_table

SEEDS = range(6)


def rows_of(seed: int, n: int, keys: int, prefix: str) -> pa.Table:
    rng = np.random.default_rng(seed)
    key = rng.integers(0, keys, n)
    nulls = rng.random(n) < 0.05  # null keys never join, but group together
    return pa.table(
        {
            f"{prefix}k": pa.array(key, mask=nulls),
            f"{prefix}s": pa.array([f"s{v % 7}" for v in key]),
            f"{prefix}x": rng.normal(size=n),
        }
    )


def batchings(table: pa.Table, rng: np.random.Generator) -> list[pa.Table]:
    """The table's rows shuffled and cut at random points (empty batches included)."""
    shuffled = table.take(pa.array(rng.permutation(table.num_rows)))
    cuts = np.sort(rng.integers(0, table.num_rows + 1, rng.integers(0, 12)))
    bounds = [0, *cuts.tolist(), table.num_rows]
    return [shuffled.slice(a, b - a) for a, b in itertools.pairwise(bounds)]


def feed(executor: Executor, streams: list[tuple[Hashable, pa.Table]], channel: int = 3) -> pa.Table:
    """Run an executor over batches as the runtime does; all outputs concatenated."""
    outs = [to_table(executor.execute(batch, stream, channel), "test") for stream, batch in streams]
    outs.append(to_table(executor.done(channel), "test"))
    tables = [t for t in outs if t is not None]
    return pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})


def canonical(table: pa.Table) -> list[tuple]:
    """The output as a sorted multiset of rows (floats rounded: sums in another order differ in ulps)."""
    rows = table.to_pylist()
    return sorted((tuple((k, round(v, 9) if isinstance(v, float) else v) for k, v in sorted(r.items())) for r in rows), key=repr)


def interleave(rng: np.random.Generator, *sides: tuple[Hashable, list[pa.Table]]) -> list[tuple[Hashable, pa.Table]]:
    """Merge the batch lists of several streams in a random order, keeping each stream's order."""
    pending = [[(s, b) for b in batches] for s, batches in sides]
    out = []
    while any(pending):
        live = [p for p in pending if p]
        out.append(live[rng.integers(len(live))].pop(0))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_hash_join_symmetric_is_confluent(seed: int) -> None:
    rng = np.random.default_rng(seed)
    left, right = rows_of(seed, 300, 40, "l"), rows_of(seed + 100, 200, 40, "r")
    reference = None
    for _ in range(4):
        streams = interleave(rng, (0, batchings(left, rng)), (1, batchings(right, rng)))
        out = canonical(feed(HashJoin(["lk", "ls"], ["rk", "rs"]), streams))
        reference = reference if reference is not None else out
        assert out == reference
    # and it is the inner join
    l_rows, r_rows = left.to_pylist(), right.to_pylist()
    expected = [{**a, **b} for a in l_rows for b in r_rows if a["lk"] is not None and a["lk"] == b["rk"] and a["ls"] == b["rs"]]
    assert reference == canonical(pa.Table.from_pylist(expected)) and len(expected) > 100


@pytest.mark.parametrize("seed", SEEDS)
def test_hash_join_build_side_first_matches_symmetric(seed: int) -> None:
    rng = np.random.default_rng(seed)
    build, probe = rows_of(seed, 150, 30, "b"), rows_of(seed + 7, 400, 30, "p")
    symmetric = canonical(feed(HashJoin("pk", "bk"), interleave(rng, (0, batchings(probe, rng)), (1, batchings(build, rng)))))
    for _ in range(3):
        streams = [(1, b) for b in batchings(build, rng)] + [(0, b) for b in batchings(probe, rng)]
        join = HashJoin("pk", "bk", build=1)
        assert canonical(feed(join, streams)) == symmetric
        assert join.sides[0].num_rows == 0  # the probe side was never stored


def test_hash_join_build_order_violation_is_an_error() -> None:
    join = HashJoin("k", build=1)
    join.execute(pa.table({"k": [1]}), 0, 0)
    with pytest.raises(ValueError, match="build batch arrived after the probe side started on channel 0"):
        join.execute(pa.table({"k": [1]}), 1, 0)


@pytest.mark.parametrize("seed", SEEDS)
def test_hash_aggregate_is_confluent(seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = rows_of(seed, 500, 25, "")
    aggs = {
        "total": ("sum", "x"),
        "n": ("count", "x"),
        "rows": ("count", None),
        "avg": ("mean", "x"),
        "lo": ("min", "x"),
        "hi": ("max", "x"),
    }
    outs = [canonical(feed(HashAggregate(["k", "s"], aggs), [(0, b) for b in batchings(table, rng)])) for _ in range(4)]
    assert all(o == outs[0] for o in outs)
    df = table.to_pandas()
    grouped = df.groupby(["k", "s"], dropna=False).x.agg(["sum", "count", "mean", "min", "max"])
    assert len(outs[0]) == len(grouped)
    # small partials are combined on the way: many batches still give one row per group
    many = HashAggregate(["k", "s"], aggs)
    feed(many, [(0, table.slice(i, 5)) for i in range(0, 500, 5)])
    assert many.partial_rows <= 100 * 25 * 7


@pytest.mark.parametrize("seed", SEEDS)
def test_filter_project_map_count_sort_are_confluent(seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = rows_of(seed, 400, 50, "")
    executors = {
        "filter": lambda: FilterProject(pc.field("x") > 0, {"k": "k", "y": pc.field("x") * pc.scalar(2.0)}),
        "map": lambda: Map(lambda t: t.to_pandas().assign(z=lambda d: d.x + 1)),
        "count": lambda: Count(),
        "sort": lambda: Sort([("x", "descending")]),
        "top": lambda: Sort([("x", "descending")], limit=7),
    }
    for name, make in executors.items():
        outs = [feed(make(), [(0, b) for b in batchings(table, rng)]) for _ in range(4)]
        assert all(canonical(o) == canonical(outs[0]) for o in outs), name
        if name in ("sort", "top"):  # a sort's output is also the same sequence
            assert all(o.column("x").to_pylist() == outs[0].column("x").to_pylist() for o in outs), name
    assert feed(Count(), [(0, table)]).column("count").to_pylist() == [400]
    assert (
        feed(Sort("x", limit=7), [(0, b) for b in batchings(table, rng)]).column("x").to_pylist()
        == sorted(table.column("x").to_pylist())[:7]
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_limit_takes_n_rows_in_input_order_and_finishes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = rows_of(seed, 300, 50, "")
    batches = batchings(table, rng)
    limit = Limit(37)
    fed = []
    for batch in batches:
        if limit.finished:
            break
        fed.append(batch)
        limit.execute(batch, 0, 0)
    out = feed(Limit(37), [(0, b) for b in batches])
    assert out.num_rows == 37 and limit.finished
    assert out.to_pylist() == pa.concat_tables(batches).slice(0, 37).to_pylist()
    assert Limit(0).finished
