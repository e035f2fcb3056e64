"""TPC-H Q1, Q3, Q6 and Q12 at scale factor 0.01 on the TaskGraph, checked against DuckDB.

Q3 and Q12 run the streaming hash join (`conveyor.graph.join`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from examples.tpch import names
from pyspark.sql import SparkSession

from conveyor import Dataset, TaskGraph
from conveyor.graph import HashAggregate, HashJoin, Sort
from tests.support.graph_helpers import assert_frames_close, duckdb_answer, example


def q1_lineitem(df: pd.DataFrame) -> pd.DataFrame:
    df = df[df.l_shipdate <= pd.Timestamp("1998-09-02")]
    disc = df.l_extendedprice * (1 - df.l_discount)
    return df.assign(disc_price=disc, charge=disc * (1 + df.l_tax)).drop(columns=["l_shipdate", "l_tax"])


def build_q1(graph: TaskGraph, data: Path) -> Dataset:
    cols = ["l_returnflag", "l_linestatus", "l_quantity", "l_extendedprice", "l_discount", "l_tax", "l_shipdate"]
    lineitem = graph.new_input_csv(data / "lineitem.tbl", names("lineitem"), 2, batch_func=q1_lineitem, sep="|", columns=cols)
    aggs = {
        "sum_qty": ("sum", "l_quantity"),
        "sum_base_price": ("sum", "l_extendedprice"),
        "sum_disc_price": ("sum", "disc_price"),
        "sum_charge": ("sum", "charge"),
        "avg_qty": ("mean", "l_quantity"),
        "avg_price": ("mean", "l_extendedprice"),
        "avg_disc": ("mean", "l_discount"),
        "count_order": ("count", None),
    }
    # a string key: rows are spread over the 2 channels by the stable hash of l_returnflag
    grouped = graph.new_non_blocking_node(
        {0: lineitem}, HashAggregate(["l_returnflag", "l_linestatus"], aggs), 2, {0: "l_returnflag"}
    )
    return graph.new_blocking_node({0: grouped}, Sort(["l_returnflag", "l_linestatus"]), 1, {0: None})


def build_q3(graph: TaskGraph, data: Path) -> Dataset:
    def customers(df: pd.DataFrame) -> pd.DataFrame:
        return df.loc[df.c_mktsegment == "BUILDING", ["c_custkey"]]

    def orders(df: pd.DataFrame) -> pd.DataFrame:
        return df[df.o_orderdate < pd.Timestamp("1995-03-15")]

    def lineitems(df: pd.DataFrame) -> pd.DataFrame:
        df = df[df.l_shipdate > pd.Timestamp("1995-03-15")]
        return pd.DataFrame({"l_orderkey": df.l_orderkey, "volume": df.l_extendedprice * (1 - df.l_discount)})

    cust = graph.new_input_csv(
        data / "customer.tbl", names("customer"), 1, batch_func=customers, sep="|", columns=["c_custkey", "c_mktsegment"]
    )
    ords = graph.new_input_csv(
        data / "orders.tbl",
        names("orders"),
        2,
        batch_func=orders,
        sep="|",
        dependents=[cust],
        columns=["o_orderkey", "o_custkey", "o_orderdate", "o_shippriority"],
    )
    items = graph.new_input_csv(
        data / "lineitem.tbl",
        names("lineitem"),
        2,
        batch_func=lineitems,
        sep="|",
        dependents=[ords],
        columns=["l_orderkey", "l_extendedprice", "l_discount", "l_shipdate"],
    )
    cust_orders = graph.new_non_blocking_node(
        {"c": cust, "o": ords},
        HashJoin("c_custkey", "o_custkey", left_stream="c", right_stream="o", build="c"),
        2,
        {"c": "c_custkey", "o": "o_custkey"},
    )
    # the join's output (level 1) sorts before the lineitems (level 2): a build side again
    joined = graph.new_non_blocking_node(
        {0: cust_orders, 1: items}, HashJoin("o_orderkey", "l_orderkey", build=0), 2, {0: "o_orderkey", 1: "l_orderkey"}
    )
    revenue = graph.new_non_blocking_node(
        {0: joined},
        HashAggregate(["l_orderkey", "o_orderdate", "o_shippriority"], {"revenue": ("sum", "volume")}),
        2,
        {0: "l_orderkey"},
    )
    return graph.new_blocking_node(
        {0: revenue}, Sort([("revenue", "descending"), ("o_orderdate", "ascending")], limit=10), 1, {0: None}
    )


def test_q1(spark: SparkSession, tpch_sf001: Path) -> None:
    graph = TaskGraph(spark)
    out = build_q1(graph, tpch_sf001)
    graph.run()
    ours = out.to_pandas()
    expected = duckdb_answer("q1", tpch_sf001)
    assert_frames_close(ours[list(expected.columns)], expected)


def test_q3(spark: SparkSession, tpch_sf001: Path) -> None:
    graph = TaskGraph(spark)
    out = build_q3(graph, tpch_sf001)
    graph.run()
    expected = duckdb_answer("q3", tpch_sf001)
    ours = out.to_pandas()[list(expected.columns)]
    assert len(expected) == 10
    assert_frames_close(ours, expected)


def test_q6(spark: SparkSession, tpch_sf001: Path) -> None:
    graph = TaskGraph(spark)
    out = example("tpch_q6").build_q6(graph, str(tpch_sf001))
    stats = graph.run()
    expected = duckdb_answer("q6", tpch_sf001)
    assert_frames_close(out.to_pandas(), expected)
    assert stats.batches_read["lineitem"] >= 2  # both reader tasks read


@pytest.mark.parametrize("parallelism", [2, 1])
def test_q12(spark: SparkSession, tpch_sf001: Path, parallelism: int) -> None:
    graph = TaskGraph(spark)
    out = example("tpch_q12").build_q12(graph, str(tpch_sf001), parallelism)
    stats = graph.run()
    # with one channel, both inputs are read inside the join's task, lineitems (the build side) first
    assert stats.fused_inputs == ([] if parallelism == 2 else ["lineitem", "orders"])
    expected = duckdb_answer("q12", tpch_sf001)
    assert_frames_close(out.to_pandas(), expected)
