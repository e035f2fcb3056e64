"""conveyor.compat.quokka: Quokka's 2023 SQL executors (aggregation, joins), driven as its runtime did.

Each executor gets lists of pyarrow Tables on streams 0 and 1, then `done`, as Quokka's runtime
(and the compat's 2023 form) calls them; what they emit is checked against DuckDB's answer over
the same rows: small tables made by hand, and TPC-H at scale 0.01 hash-partitioned over channels
and cut into batches as the tutorials' graphs deliver them (tpch-1, 3, 4 and 13's executors).
Bad input is checked to fail with an error naming the problem, and once through a graph on Spark,
where the error reaches the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import polars
import pyarrow as pa
import pytest
import sqlglot
from examples.tpch import duckdb_columns, generate
from pyspark.sql import SparkSession

from conveyor.compat.quokka import QuokkaContext, ray
from conveyor.compat.quokka.executors import BroadcastJoinExecutor, BuildProbeJoinExecutor, SQLAggExecutor
from conveyor.compat.quokka.placement_strategy import SingleChannelStrategy
from conveyor.compat.quokka.quokka_runtime import TaskGraph
from conveyor.compat.quokka.sql_executors import BuildProbeJoinExecutor as Defined
from conveyor.compat.quokka.target_info import BroadcastPartitioner, HashPartitioner, TargetInfo
from conveyor.compat.quokka.utils import LocalCluster
from conveyor.graph import GraphError
from tests.support.graph_helpers import assert_frames_close

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


@pytest.mark.parametrize("how", sorted(JOIN_SQL))
def test_broadcast_join_takes_quokka_2023s_how_and_joins_each_batch_with_the_small_table(how: str) -> None:
    join = BroadcastJoinExecutor(pa.concat_tables(ITEMS).to_pandas(), small_on="l_key", big_on="o_key", how=how)
    emitted = [join.execute([batch], 0, 0) for batch in ORDERS]
    assert join.done(0) is None
    expected = duckdb_rows(JOIN_SQL[how], orders=pa.concat_tables(ORDERS), items=pa.concat_tables(ITEMS))
    assert rows_of(emitted) == sorted(expected, key=repr)
    with pytest.raises(ValueError, match=r"how must be one of .*'outer'"):
        BroadcastJoinExecutor(ITEMS[0], on="l_key", how="outer")


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


def test_batches_lacking_columns_of_others_join_with_nulls_there() -> None:
    # what a left join upstream emits when its build side sent one channel nothing: the probe rows alone
    build = [pa.table({"k": [1, 2], "w": [10, 20]}), pa.table({"k": [3]})]
    probe = [pa.table({"k": [1, 3], "v": ["a", "c"]}), pa.table({"k": [2]})]
    emitted, _ = drive(BuildProbeJoinExecutor(on="k"), [(1, build), (0, probe)])
    assert sorted(emitted[1].rows(), key=repr) == sorted([(1, "a", 10), (2, None, 20), (3, "c", None)], key=repr)


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


# --- TPC-H at scale 0.01, as the tutorials' graphs deliver it --------------------------------------

CHANNELS = 3
BATCH_ROWS = 700


@pytest.fixture(scope="module")
def tpch(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    """TPC-H at scale 0.01 as DuckDB views (`lineitem`, `orders`, `customer`), typed as TPC-H declares them."""
    data = generate(0.01, tmp_path_factory.mktemp("tpch-001"), ("lineitem", "orders", "customer"))
    con = duckdb.connect()
    for table in ("lineitem", "orders", "customer"):
        source = f"read_csv('{Path(data) / table}.tbl', delim='|', header=false, columns={duckdb_columns(table)})"
        con.execute(f"create table {table} as select * exclude (_trailing) from {source}")
    return con


def arrow(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    return con.sql(sql).to_arrow_table()


def hashed(table: pa.Table, key: str) -> list[list[pa.Table]]:
    """`table` as `HashPartitioner(key)` sends it to `CHANNELS` channels, each in batches of `BATCH_ROWS` rows."""
    frame = polars.from_arrow(table)
    out: list[list[pa.Table]] = []
    for channel in range(CHANNELS):
        part = frame.filter(polars.col(key) % CHANNELS == channel).to_arrow()
        out.append([part.slice(i, BATCH_ROWS) for i in range(0, part.num_rows, BATCH_ROWS)])
    return out


def pairs(batches: list[pa.Table]) -> list[list[pa.Table]]:
    """Batches as the runtime hands them to `execute`: a list at a time (here two)."""
    return [batches[i : i + 2] for i in range(0, len(batches), 2)]


def join_channels(
    make: Callable[[], BuildProbeJoinExecutor],
    probe: pa.Table,
    probe_key: str,
    build: pa.Table,
    build_key: str,
    probe_first: int = 0,
) -> list[Any]:
    """Every channel's output, each channel driven by an executor of its own.

    A channel gets its build batches (stream 1) first, as the build side's lower `stage=` reads
    them, then its probe batches (stream 0); with `probe_first`, that many probe calls come first.
    """
    emitted: list[Any] = []
    for channel, (probe_batches, build_batches) in enumerate(
        zip(hashed(probe, probe_key), hashed(build, build_key), strict=True)
    ):
        join = make()
        probe_calls = pairs(probe_batches)
        feed = [(0, b) for b in probe_calls[:probe_first]]
        feed += [(1, b) for b in pairs(build_batches)] + [(0, b) for b in probe_calls[probe_first:]]
        emitted.extend(join.execute(batches, stream, channel) for stream, batches in feed)
        emitted.append(join.done(channel))
    return [frame for frame in emitted if frame is not None]


def aggregate(agg: SQLAggExecutor, frames: list[Any]) -> pd.DataFrame:
    """A single-channel SQLAggExecutor over `frames` (as pyarrow Tables, as the runtime hands them), as pandas."""
    for frame in frames:
        assert agg.execute([frame.to_arrow()], 0, 0) is None
    result = agg.done(0)
    assert isinstance(result, polars.DataFrame)
    return result.to_pandas()


def test_tpch_1_aggregate_over_batches_of_channels_answers_as_duckdb(tpch: duckdb.DuckDBPyConnection) -> None:
    lineitem = arrow(tpch, "select * from lineitem where l_shipdate <= date '1998-09-02'")
    agg = SQLAggExecutor(
        ["l_returnflag", "l_linestatus"],
        [("l_returnflag", "asc"), ("l_linestatus", "asc")],
        "sum(l_quantity) as sum_qty, sum(l_extendedprice) as sum_base_price, "
        "sum(l_extendedprice * (1 - l_discount)) as sum_disc_price, "
        "sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge, avg(l_quantity) as avg_qty, "
        "avg(l_extendedprice) as avg_price, avg(l_discount) as avg_disc, count(*) as count_order",
    )
    frames = [polars.from_arrow(b) for channel in hashed(lineitem, "l_orderkey") for b in channel]
    expected = tpch.sql(
        "select l_returnflag, l_linestatus, sum(l_quantity) as sum_qty, sum(l_extendedprice) as sum_base_price, "
        "sum(l_extendedprice * (1 - l_discount)) as sum_disc_price, "
        "sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge, avg(l_quantity) as avg_qty, "
        "avg(l_extendedprice) as avg_price, avg(l_discount) as avg_disc, count(*) as count_order "
        "from lineitem where l_shipdate <= date '1998-09-02' group by all order by all"
    ).df()
    assert_frames_close(aggregate(agg, frames), expected)


def test_tpch_3_two_build_probe_joins_then_the_aggregate_answer_as_duckdb(tpch: duckdb.DuckDBPyConnection) -> None:
    customer = arrow(tpch, "select c_custkey from customer where c_mktsegment = 'BUILDING'")
    orders = arrow(
        tpch, "select o_orderkey, o_orderdate, o_shippriority, o_custkey from orders where o_orderdate < date '1995-03-15'"
    )
    lineitem = arrow(tpch, "select l_orderkey, l_extendedprice, l_discount from lineitem where l_shipdate > date '1995-03-15'")
    first = join_channels(
        lambda: BuildProbeJoinExecutor(left_on="o_custkey", right_on="c_custkey"), orders, "o_custkey", customer, "c_custkey"
    )
    assert first and all(f.columns == ["o_orderkey", "o_orderdate", "o_shippriority", "o_custkey"] for f in first)
    joined = polars.concat(first).to_arrow()
    second = join_channels(
        lambda: BuildProbeJoinExecutor(left_on="o_orderkey", right_on="l_orderkey", key_to_keep="right"),
        joined,
        "o_orderkey",
        lineitem,
        "l_orderkey",
        probe_first=1,
    )
    assert all("l_orderkey" in f.columns and "o_orderkey" not in f.columns for f in second)
    agg = SQLAggExecutor(
        ["l_orderkey", "o_orderdate", "o_shippriority"],
        [("revenue", "desc"), ("o_orderdate", "asc"), ("l_orderkey", "asc")],
        "sum(l_extendedprice * (1 - l_discount)) as revenue",
    )
    ours = aggregate(agg, second)
    expected = tpch.sql(
        "select l_orderkey, o_orderdate, o_shippriority, sum(l_extendedprice * (1 - l_discount)) as revenue "
        "from customer, orders, lineitem where c_mktsegment = 'BUILDING' and c_custkey = o_custkey "
        "and l_orderkey = o_orderkey and o_orderdate < date '1995-03-15' and l_shipdate > date '1995-03-15' "
        "group by all order by revenue desc, o_orderdate, l_orderkey"
    ).df()
    assert len(expected) > 100
    assert_frames_close(ours, expected)


def test_tpch_4_semi_join_with_probe_batches_before_the_build_answers_as_duckdb(tpch: duckdb.DuckDBPyConnection) -> None:
    orders = arrow(
        tpch,
        "select o_orderkey, o_orderpriority from orders where o_orderdate >= date '1993-07-01' "
        "and o_orderdate < date '1993-10-01'",
    )
    lineitem = arrow(tpch, "select l_orderkey from lineitem where l_commitdate < l_receiptdate")
    for probe_first in (0, 1, 10_000):  # build first (stage order); one probe call held; the whole probe side held
        joined = join_channels(
            lambda: BuildProbeJoinExecutor(left_on="o_orderkey", right_on="l_orderkey", how="semi"),
            orders,
            "o_orderkey",
            lineitem,
            "l_orderkey",
            probe_first,
        )
        ours = aggregate(SQLAggExecutor(["o_orderpriority"], [("o_orderpriority", "asc")], "count(*) as order_count"), joined)
        expected = tpch.sql(
            "select o_orderpriority, count(*) as order_count from orders where o_orderdate >= date '1993-07-01' "
            "and o_orderdate < date '1993-10-01' and exists (select * from lineitem where l_orderkey = o_orderkey "
            "and l_commitdate < l_receiptdate) group by all order by all"
        ).df()
        pd.testing.assert_frame_equal(ours, expected, check_dtype=False)


def test_tpch_13_left_join_then_two_aggregates_answer_as_duckdb(tpch: duckdb.DuckDBPyConnection) -> None:
    customer = arrow(tpch, "select c_custkey from customer")
    orders = arrow(tpch, "select o_custkey, o_orderkey from orders where not o_comment like '%special%requests%'")
    # TPC-H gives no order to a customer whose key is a multiple of 3: channel 0 of 3 builds nothing, and
    # its customers (c_count 0) must come out of the left join all the same
    assert hashed(orders, "o_custkey")[0] == []
    joined = join_channels(
        lambda: BuildProbeJoinExecutor(left_on="c_custkey", right_on="o_custkey", how="left"),
        customer,
        "c_custkey",
        orders,
        "o_custkey",
    )
    counts = SQLAggExecutor(["c_custkey"], None, "count(o_orderkey) as c_count")
    per_customer = aggregate(counts, joined)
    agg = SQLAggExecutor(["c_count"], [("custdist", "desc"), ("c_count", "desc")], "count(*) as custdist")
    ours = aggregate(agg, [polars.from_pandas(per_customer)])
    expected = tpch.sql(
        "select c_count, count(*) as custdist from (select c_custkey, count(o_orderkey) as c_count from customer "
        "left outer join orders on c_custkey = o_custkey and o_comment not like '%special%requests%' group by c_custkey) "
        "group by c_count order by custdist desc, c_count desc"
    ).df()
    pd.testing.assert_frame_equal(ours, expected, check_dtype=False)


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


class Frames:
    """A reader of Quokka's 2023 protocol over frames given: each channel reads every `num_channels`-th of them."""

    def __init__(self, frames: list[pa.Table]) -> None:
        self.frames = frames

    def get_own_state(self, num_channels: int) -> dict[int, list[int]]:
        return {c: list(range(c, len(self.frames), num_channels)) for c in range(num_channels)}

    def execute(self, channel: int, state: int) -> tuple[None, polars.DataFrame]:
        return None, polars.from_arrow(self.frames[state])


def test_a_left_join_channel_with_no_build_rows_reaches_a_second_join_and_the_aggregate(spark: SparkSession) -> None:
    customer = [pa.table({"c_custkey": list(range(k, k + 4)), "c_nation": [k % 3, 1, 2, 0]}) for k in (1, 5, 9)]
    orders = [pa.table({"o_custkey": [1, 2, 4, 5], "o_orderkey": [10, 20, 40, 50]}), pa.table({"o_custkey": [7, 7]})]
    orders[1] = orders[1].append_column("o_orderkey", pa.array([70, 71]))
    nation = [pa.table({"n_key": [0, 1, 2], "n_name": ["zero", "one", "two"]})]
    qc = QuokkaContext(LocalCluster(), exec_per_node=3)  # no order's key is a multiple of 3: channel 0 builds nothing
    task_graph = TaskGraph(qc)
    built = task_graph.new_input_reader_node(Frames(orders), stage=-1)
    names = task_graph.new_input_reader_node(Frames(nation), stage=-1)
    probed = task_graph.new_input_reader_node(Frames(customer), stage=0)

    def hashed_on(key: str) -> TargetInfo:
        return TargetInfo(partitioner=HashPartitioner(key), predicate=None, projection=None, batch_funcs=[])

    first = task_graph.new_non_blocking_node(
        {0: probed, 1: built},
        BuildProbeJoinExecutor(left_on="c_custkey", right_on="o_custkey", how="left"),
        source_target_info={0: hashed_on("c_custkey"), 1: hashed_on("o_custkey")},
    )
    second = task_graph.new_non_blocking_node(
        {0: first, 1: names},
        BuildProbeJoinExecutor(left_on="c_nation", right_on="n_key"),
        source_target_info={0: hashed_on("c_nation"), 1: hashed_on("n_key")},
    )
    info = TargetInfo(partitioner=BroadcastPartitioner(), predicate=None, projection=None, batch_funcs=[])
    agged = task_graph.new_blocking_node(
        {0: second},
        SQLAggExecutor(["n_name"], [("n_name", "asc")], "count(o_orderkey) as orders, count(*) as customers"),
        placement_strategy=SingleChannelStrategy(),
        source_target_info={0: info},
    )
    task_graph.create()
    task_graph.run()
    result = ray.get(qc.dataset_manager.to_df.remote(agged))
    expected = duckdb_rows(
        "select n_name, count(o_orderkey) as orders, count(*) as customers from c left join o on c_custkey = o_custkey "
        "join n on c_nation = n_key group by n_name order by n_name",
        c=pa.concat_tables(customer),
        o=pa.concat_tables(orders),
        n=nation[0],
    )
    assert result.rows() == expected
