"""conveyor.compat.quokka.sql_executors: Quokka's 2023 SQLAggExecutor and BuildProbeJoinExecutor, driven as its runtime did.

Each executor gets lists of pyarrow Tables on streams 0 and 1, then `done`, as Quokka's runtime
(and the compat's 2023 form) calls them; what they emit is checked against DuckDB's answer over
the same rows. Bad input is checked to fail with an error naming the problem, and once through a
graph on Spark, where the error reaches the driver.
"""

from __future__ import annotations

from typing import Any

import duckdb
import polars
import pyarrow as pa
import pytest
import sqlglot
from pyspark.sql import SparkSession

from conveyor.compat.quokka import QuokkaContext
from conveyor.compat.quokka.executors import BuildProbeJoinExecutor, SQLAggExecutor
from conveyor.compat.quokka.placement_strategy import SingleChannelStrategy
from conveyor.compat.quokka.quokka_runtime import TaskGraph
from conveyor.compat.quokka.sql_executors import BuildProbeJoinExecutor as Defined
from conveyor.compat.quokka.target_info import BroadcastPartitioner, TargetInfo
from conveyor.compat.quokka.utils import LocalCluster
from conveyor.graph import GraphError

pytestmark = pytest.mark.timeout(300)

SALES = [
    pa.table({"region": ["n", "s", "n"], "item": ["a", "b", "a"], "qty": [1, 2, 3], "price": [1.5, 2.0, 4.0]}),
    pa.table({"region": ["s", "e"], "item": ["a", "c"], "qty": [5, 7], "price": [3.0, 0.5]}),
    pa.table({"region": ["n"], "item": ["b"], "qty": [11], "price": [10.0]}),
]
ORDERS = [  # the probe side: stream 0
    pa.table({"o_key": [1, 2, 3, 4], "o_cust": ["x", "y", "z", "x"]}),
    pa.table({"o_key": [5, 6, 7], "o_cust": ["w", "y", "x"]}),
]
ITEMS = [  # the build side: stream 1 (keys 1, 3 and 5 twice; 4, 6 and 7 have none)
    pa.table({"l_key": [1, 3, 5], "l_qty": [10, 30, 50]}),
    pa.table({"l_key": [5, 1, 9], "l_qty": [51, 11, 90]}),
]


def duckdb_rows(sql: str, **tables: pa.Table) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    for name, table in tables.items():
        con.register(name, table)
    return [tuple(row) for row in con.sql(sql).fetchall()]


def rows_of(frames: list[Any]) -> list[tuple[Any, ...]]:
    """The rows of polars frames, in a fixed order (a multiset compared as a list)."""
    out = [row for frame in frames if frame is not None for row in frame.rows()]
    return sorted(out, key=repr)


def drive(executor: Any, feed: list[tuple[int, list[pa.Table]]]) -> tuple[list[Any], Any]:
    """Quokka's runtime on one channel: each (stream, batches) to execute, then done; what each call emitted."""
    emitted = [executor.execute(batches, stream, 0) for stream, batches in feed]
    return emitted, executor.done(0)


# --- SQLAggExecutor ------------------------------------------------------------------------------


def test_sql_agg_groups_orders_and_answers_as_duckdb_over_every_batch() -> None:
    agg = SQLAggExecutor(
        ["region", "item"], [("revenue", "desc"), ("region", "asc")], "sum(qty * price) as revenue, count(*) as n"
    )
    emitted, result = drive(agg, [(0, SALES[:2]), (0, [SALES[2]])])
    assert emitted == [None, None]  # nothing until done
    assert isinstance(result, polars.DataFrame)
    assert result.columns == ["region", "item", "revenue", "n"]
    sales = pa.concat_tables(SALES)
    expected = duckdb_rows(
        "select region, item, sum(qty * price) as revenue, count(*) as n from sales group by region, item "
        "order by revenue desc, region",
        sales=sales,
    )
    assert result.rows() == expected  # in the order asked for
    assert result["revenue"].to_list() == sorted(result["revenue"].to_list(), reverse=True)


def test_sql_agg_without_keys_is_one_row_and_nothing_when_no_batch_came() -> None:
    agg = SQLAggExecutor([], None, "sum(qty) as qty, avg(price) as price")
    _, result = drive(agg, [(0, [SALES[0], None]), (0, [SALES[1].slice(0, 0), SALES[1]])])
    expected = duckdb_rows("select sum(qty) as qty, avg(price) as price from s", s=pa.concat_tables(SALES[:2]))
    assert [tuple(float(v) for v in row) for row in result.rows()] == [tuple(float(v) for v in row) for row in expected]
    assert drive(SQLAggExecutor([], None, "count(*)"), [])[1] is None  # as Quokka: no input, no output


def test_sql_agg_takes_polars_and_pandas_frames_too() -> None:
    agg = SQLAggExecutor(["region"], [("region", "asc")], "sum(qty) as qty")
    _, result = drive(agg, [(0, [polars.from_arrow(SALES[0]), SALES[1].to_pandas()]), (0, [SALES[2]])])
    expected = duckdb_rows("select region, sum(qty) from s group by region order by region", s=pa.concat_tables(SALES))
    assert [(r, int(q)) for r, q in result.rows()] == [(r, int(q)) for r, q in expected]


def test_sql_agg_keys_go_into_the_query_as_written_as_quokka_put_them() -> None:
    agg = SQLAggExecutor(["upper(region)"], [("upper(region)", "DESC")], "sum(qty) as qty")  # an expression; capitals
    _, result = drive(agg, [(0, SALES)])
    sales = pa.concat_tables(SALES)
    expected = duckdb_rows("select upper(region), sum(qty) from s group by upper(region) order by upper(region) desc", s=sales)
    assert [(a, int(q)) for a, q in result.rows()] == [(a, int(q)) for a, q in expected]
    _, result = drive(SQLAggExecutor(["REGION"], [("REGION", "asc")], "count(*) as n"), [(0, SALES)])  # names match in any case
    assert result.rows() == duckdb_rows("select region, count(*) from s group by region order by region", s=sales)


def test_sql_agg_bad_arguments_are_errors_naming_them() -> None:
    with pytest.raises(ValueError, match="DuckDB cannot parse the statement 'sum\\(qty as qty'"):
        SQLAggExecutor(["region"], None, "sum(qty as qty")
    with pytest.raises(ValueError, match="groupby_keys must be a list"):
        SQLAggExecutor("region", None, "sum(qty)")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="each orderby key must be \\(column, 'asc' \\| 'desc'\\), got \\('qty', 'down'\\)"):
        SQLAggExecutor([], [("qty", "down")], "sum(qty) as qty")
    with pytest.raises(ValueError, match="sql_statement must be"):
        SQLAggExecutor([], None, " ")


def test_sql_agg_a_statement_duckdb_rejects_or_a_missing_key_is_an_error_at_done() -> None:
    agg = SQLAggExecutor(["region"], None, "sum(weight) as weight")
    agg.execute([SALES[0]], 0, 0)
    with pytest.raises(
        ValueError, match=r"DuckDB rejects .*sum\(weight\).* over the columns \['region', 'item', 'qty', 'price'\]"
    ):
        agg.done(0)
    agg = SQLAggExecutor(["store"], None, "sum(qty) as qty")
    agg.execute([SALES[0]], 0, 0)
    with pytest.raises(ValueError, match="group-by keys \\['store'\\] are not columns of its input"):
        agg.done(0)


# --- BuildProbeJoinExecutor ----------------------------------------------------------------------

JOIN_SQL = {
    "inner": "select o_key, o_cust, l_qty from orders join items on o_key = l_key",
    "left": "select o_key, o_cust, l_qty from orders left join items on o_key = l_key",
    "semi": "select o_key, o_cust from orders semi join items on o_key = l_key",
    "anti": "select o_key, o_cust from orders anti join items on o_key = l_key",
}


@pytest.mark.parametrize("how", sorted(JOIN_SQL))
def test_build_probe_join_builds_from_stream_1_and_emits_each_probe_batch_joined(how: str) -> None:
    join = BuildProbeJoinExecutor(left_on="o_key", right_on="l_key", how=how)
    emitted, last = drive(join, [(1, [ITEMS[0]]), (1, [ITEMS[1]]), (0, [ORDERS[0]]), (0, [ORDERS[1]])])
    assert emitted[:2] == [None, None]  # building
    assert all(isinstance(e, polars.DataFrame) for e in emitted[2:])  # each probe batch answered as it came
    assert last is None
    expected = duckdb_rows(JOIN_SQL[how], orders=pa.concat_tables(ORDERS), items=pa.concat_tables(ITEMS))
    assert rows_of(emitted) == sorted(expected, key=repr)
    assert emitted[2].columns == ["o_key", "o_cust", "l_qty"][: 3 if how in ("inner", "left") else 2]


@pytest.mark.parametrize("how", sorted(JOIN_SQL))
def test_probe_batches_before_the_build_side_are_held_and_joined_later(how: str) -> None:
    join = BuildProbeJoinExecutor(left_on="o_key", right_on="l_key", how=how)
    emitted, last = drive(join, [(0, [ORDERS[0]]), (1, ITEMS), (0, [ORDERS[1]])])
    assert emitted[:2] == [None, None]  # held, then built
    expected = duckdb_rows(JOIN_SQL[how], orders=pa.concat_tables(ORDERS), items=pa.concat_tables(ITEMS))
    assert rows_of([*emitted, last]) == sorted(expected, key=repr)

    join = BuildProbeJoinExecutor(left_on="o_key", right_on="l_key", how=how)
    emitted, last = drive(join, [(0, ORDERS), (1, [ITEMS[0]]), (1, [ITEMS[1]])])  # the whole probe side first
    assert emitted == [None, None, None]
    assert rows_of([last]) == sorted(expected, key=repr)  # joined at done, against the whole build side


@pytest.mark.parametrize(("how", "kept"), [("inner", False), ("semi", False), ("left", True), ("anti", True)])
def test_a_build_side_that_sent_nothing_keeps_the_probe_rows_only_for_left_and_anti(how: str, kept: bool) -> None:
    join = BuildProbeJoinExecutor(on="o_key", how=how)
    emitted, last = drive(join, [(1, [None]), (0, ORDERS)])
    assert emitted == [None, None]
    probe_rows = polars.from_arrow(pa.concat_tables(ORDERS)).rows()
    assert rows_of([last]) == (sorted(probe_rows, key=repr) if kept else [])


def test_key_to_keep_right_names_the_key_after_the_build_side() -> None:
    join = BuildProbeJoinExecutor(left_on="o_key", right_on="l_key", key_to_keep="right")
    emitted, _ = drive(join, [(1, ITEMS), (0, ORDERS)])
    assert emitted[1].columns == ["l_key", "o_cust", "l_qty"]
    expected = duckdb_rows(JOIN_SQL["inner"], orders=pa.concat_tables(ORDERS), items=pa.concat_tables(ITEMS))
    assert rows_of(emitted) == sorted(expected, key=repr)


def test_on_names_the_key_of_both_sides_and_lists_of_keys_join_on_each() -> None:
    probe = pa.table({"k": [1, 1, 2], "j": ["a", "b", "a"], "v": [1, 2, 3]})
    build = pa.table({"k": [1, 2, 2], "j": ["b", "a", "a"], "w": [10, 20, 30]})
    emitted, _ = drive(BuildProbeJoinExecutor(on=["k", "j"]), [(1, [build]), (0, [probe])])
    expected = duckdb_rows("select p.k, p.j, v, w from p join b on p.k = b.k and p.j = b.j", p=probe, b=build)
    assert rows_of(emitted) == sorted(expected, key=repr)
    assert Defined is BuildProbeJoinExecutor  # compat.quokka.executors gives the one sql_executors defines


def test_a_build_batch_after_probing_began_is_an_error_naming_the_remedy() -> None:
    join = BuildProbeJoinExecutor(left_on="o_key", right_on="l_key")
    join.execute([ITEMS[0]], 1, 0)
    join.execute([ORDERS[0]], 0, 0)
    with pytest.raises(ValueError, match="arrived after probe batches were joined: give stream 1's input a lower stage="):
        join.execute([ITEMS[1]], 1, 0)


def test_build_probe_join_bad_arguments_and_batches_are_errors_naming_them() -> None:
    with pytest.raises(ValueError, match="how must be one of \\['inner', 'left', 'semi', 'anti'\\], got 'outer'"):
        BuildProbeJoinExecutor(on="k", how="outer")
    with pytest.raises(ValueError, match="key_to_keep must be 'left' or 'right', got 'both'"):
        BuildProbeJoinExecutor(on="k", key_to_keep="both")
    with pytest.raises(ValueError, match="give on, or left_on and right_on, not both"):
        BuildProbeJoinExecutor(on="k", left_on="k")
    with pytest.raises(ValueError, match="give on, or both left_on and right_on"):
        BuildProbeJoinExecutor(left_on="k")
    join = BuildProbeJoinExecutor(left_on="o_key", right_on="key")
    with pytest.raises(
        ValueError, match="the build \\(stream 1\\) side has no key column \\['key'\\] \\(columns: \\['l_key', 'l_qty'\\]\\)"
    ):
        join.execute([ITEMS[0]], 1, 0)
    join = BuildProbeJoinExecutor(left_on="order", right_on="l_key")
    with pytest.raises(ValueError, match="the probe \\(stream 0\\) side has no key column \\['order'\\]"):
        join.execute([ORDERS[0]], 0, 0)
    with pytest.raises(ValueError, match="streams are 0 \\(probe\\) and 1 \\(build\\), got stream 2"):
        join.execute([ORDERS[0]], 2, 0)


def test_a_join_polars_refuses_is_an_error_naming_the_keys_and_changes_nothing() -> None:
    join = BuildProbeJoinExecutor(left_on="o_key", right_on="l_key")
    join.execute(ITEMS, 1, 0)
    text_keys = pa.table({"o_key": ["1", "3"], "o_cust": ["x", "z"]})
    with pytest.raises(ValueError, match=r"joining \['o_key'\] with \['l_key'\] \(inner\) failed"):
        join.execute([text_keys], 0, 0)
    emitted, last = drive(join, [(0, ORDERS)])  # the batch refused is not kept; the build side is as it was
    expected = duckdb_rows(JOIN_SQL["inner"], orders=pa.concat_tables(ORDERS), items=pa.concat_tables(ITEMS))
    assert rows_of([*emitted, last]) == sorted(expected, key=repr)


# --- through a graph -----------------------------------------------------------------------------


def test_a_statement_duckdb_rejects_in_a_graph_fails_the_run_naming_it(spark: SparkSession) -> None:
    qc = QuokkaContext(LocalCluster())
    task_graph = TaskGraph(qc)

    class Sales:
        def get_own_state(self, num_channels: int) -> dict[int, list[int]]:
            return {c: list(range(c, len(SALES), num_channels)) for c in range(num_channels)}

        def execute(self, channel: int, state: int) -> tuple[None, polars.DataFrame]:
            return None, polars.from_arrow(SALES[state])

    sales = task_graph.new_input_reader_node(Sales())
    info = TargetInfo(partitioner=BroadcastPartitioner(), predicate=sqlglot.exp.TRUE, projection=None, batch_funcs=[])
    task_graph.new_blocking_node(
        {0: sales},
        SQLAggExecutor(["region"], None, "sum(weight)"),
        placement_strategy=SingleChannelStrategy(),
        source_target_info={0: info},
    )
    task_graph.create()
    with pytest.raises(GraphError, match=r"DuckDB rejects .*sum\(weight\)"):
        task_graph.run()
