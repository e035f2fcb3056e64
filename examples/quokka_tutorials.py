"""TPC-H 1, 3, 4, 6, 12, 13, 14 and 19 as Quokka's graph-API tutorials of 2023 wrote them, run by `conveyor.compat.quokka`.

    python examples/quokka_tutorials.py [--data DIR] [--scale 0.1] [--format csv|parquet] [--query tpch-3 ...]

Each function is the program of one tutorial in Quokka's apps/graph_api/tutorials, its logic
written anew with the compat's imports (lesson3.2 is tpch-6, lesson3.1 is tpch-4, mod.py is
tpch-12): a `QuokkaContext` on a `LocalCluster` with `memory_limit` set, input readers ordered by
`stage=`, `BuildProbeJoinExecutor`s behind `HashPartitioner`s, `TargetInfo` predicates,
projections and batch functions, and a single-channel `SQLAggExecutor`; it returns the answer of
`ray.get(qc.dataset_manager.to_df.remote(agged))` as pandas. `exec_per_node` is the joins'
channels (1 in the tutorials, Quokka's default).

"csv" reads `<data>/tpc-h-public/<table>.tbl`, whose first line names the columns, as the
tutorials' files did (`with_header` makes them). "parquet" reads `<data>/<table>.parquet` with
`InputParquetDataset`: tpch-12 as its Parquet branch does (the reader filters on ship mode and
receipt date, the edge's predicate keeps the rest); the other tutorials have no Parquet branch
that runs (tpch-4's reads only two columns of orders and filters lineitem with tpch-12's
predicates), so theirs read the columns their graph uses and keep the CSV branch's predicates.

`SQL` asks each tutorial's question (its predicates, its output columns) as Spark SQL and DuckDB
both run it. tpch-1's averages are the tutorial's averages of each batch's averages (as its
docstring says): `same_answer` compares them within 10%, every other number within 1e-6.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars
import pyarrow.compute as compute
import sqlglot
from tpch import TABLES, generate, to_parquet

from conveyor.compat.quokka import QuokkaContext, ray
from conveyor.compat.quokka.dataset import InputDiskCSVDataset, InputParquetDataset
from conveyor.compat.quokka.executors import BuildProbeJoinExecutor, SQLAggExecutor
from conveyor.compat.quokka.placement_strategy import SingleChannelStrategy
from conveyor.compat.quokka.quokka_runtime import TaskGraph
from conveyor.compat.quokka.target_info import BroadcastPartitioner, HashPartitioner, TargetInfo
from conveyor.compat.quokka.utils import LocalCluster

HEADED = "tpc-h-public"  # the directory of the tutorials' .tbl files, each with a header line


def with_header(data_dir: str | Path, tables: tuple[str, ...]) -> Path:
    """`<data_dir>/tpc-h-public/<table>.tbl`: each generated `.tbl` with a first line naming its columns (kept when there).

    The generator's trailing "|" of each line is dropped, as the tutorials' files had none.
    """
    out = Path(data_dir) / HEADED
    out.mkdir(exist_ok=True)
    for table in tables:
        target = out / f"{table}.tbl"
        if target.exists() and target.stat().st_size > 0:
            continue
        partial = target.with_suffix(".part")
        with open(Path(data_dir) / f"{table}.tbl", "rb") as source, open(partial, "wb") as sink:
            sink.write("|".join(TABLES[table]).encode() + b"\n")
            while block := source.read(64 * 1024 * 1024):
                block += source.readline()  # to the end of the line: each block's lines are whole
                sink.write(block.replace(b"|\n", b"\n"))
        partial.rename(target)
    return out


def prepare(data_dir: str | Path, queries: list[str], fmt: str, scale: float) -> Path:
    """The tables the queries read, generated at `scale` when missing, with header lines (csv) or as Parquet."""
    tables = tuple(sorted({t for q in queries for t in TABLES_OF[q]}))
    generate(scale, data_dir, tables)
    if fmt == "csv":
        with_header(data_dir, tables)
    else:
        to_parquet(data_dir, tables)
    return Path(data_dir)


def context(exec_per_node: int = 1) -> tuple[QuokkaContext, TaskGraph]:
    """Each tutorial's start: a local cluster, its context with memory_limit 0.01, a TaskGraph on it.

    `exec_per_node` 2 hash-partitions both sides of each join over two channels, each its own build and probe.
    """
    qc = QuokkaContext(LocalCluster(), exec_per_node=exec_per_node)
    qc.set_config("memory_limit", 0.01)
    return qc, TaskGraph(qc)


def reader(data: str | Path, fmt: str, table: str, columns: list[str], filters: Any = None) -> Any:
    """The tutorials' reader of `table`: its whole header-line `.tbl` file, or `columns` of its Parquet file."""
    if fmt == "csv":
        return InputDiskCSVDataset(f"{data}/{HEADED}/{table}.tbl", header=True, sep="|", stride=16 * 1024 * 1024)
    if fmt == "parquet":
        return InputParquetDataset(str(data), f"{table}.parquet", columns=columns, filters=filters)
    raise ValueError(f"format {fmt!r}: csv or parquet")


def plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Decimal columns (DuckDB's exact sums) as floats, so that values compare within a tolerance."""
    frame = frame.copy()
    for column in frame.columns:
        if frame[column].dtype == object and any(isinstance(v, Decimal) for v in frame[column]):
            frame[column] = frame[column].astype(float)
    return frame


def answer(qc: QuokkaContext, dataset: Any) -> pd.DataFrame:
    """The tutorials' last line, `ray.get(qc.dataset_manager.to_df.remote(agged))`, as pandas."""
    result = ray.get(qc.dataset_manager.to_df.remote(dataset))
    if not isinstance(result, polars.DataFrame):
        raise TypeError(f"the dataset manager gave a {type(result).__name__}, not a polars DataFrame")
    return plain(result.to_pandas())


def broadcast(predicate: Any = None, batch_funcs: list[Any] | None = None) -> dict[int, TargetInfo]:
    """The tutorials' edge into their single-channel aggregate."""
    info = TargetInfo(partitioner=BroadcastPartitioner(), predicate=predicate, projection=None, batch_funcs=batch_funcs or [])
    return {0: info}


def edge(key: str, predicate: str | None = None, projection: list[str] | None = None) -> TargetInfo:
    """A join's input edge: hash-partitioned on `key`, filtered and projected."""
    parsed = sqlglot.parse_one(predicate) if predicate else None
    return TargetInfo(partitioner=HashPartitioner(key), predicate=parsed, projection=projection, batch_funcs=[])


def tpch_6(data: str | Path, fmt: str = "csv", exec_per_node: int = 1) -> pd.DataFrame:
    """tpch-6 (and lesson3.2): revenue of discounted small items shipped in 1994."""
    qc, task_graph = context(exec_per_node)

    def batch_func(df: polars.DataFrame) -> polars.DataFrame:
        return df.with_columns((df["l_extendedprice"] * df["l_discount"]).alias("revenue"))

    columns = ["l_shipdate", "l_discount", "l_quantity", "l_extendedprice"]
    lineitem = task_graph.new_input_reader_node(reader(data, fmt, "lineitem", columns), stage=-1)
    where = (
        "l_shipdate between date '1994-01-01' and date '1994-12-31' and l_discount between 0.05 and 0.07 and l_quantity <= 23.99"
    )
    agged = task_graph.new_blocking_node(
        {0: lineitem},
        SQLAggExecutor([], None, "sum(revenue) as revenue"),
        placement_strategy=SingleChannelStrategy(),
        source_target_info=broadcast(sqlglot.parse_one(where), [batch_func]),
    )
    task_graph.create()
    task_graph.run()
    return answer(qc, agged)


def tpch_1(data: str | Path, fmt: str = "csv", exec_per_node: int = 1) -> pd.DataFrame:
    """tpch-1: the pricing summary of items shipped by 1998-09-02; its averages are averages of per-batch averages."""
    qc, task_graph = context(exec_per_node)

    def batch_func(df: polars.DataFrame) -> polars.DataFrame:
        df = df.with_columns((df["l_extendedprice"] * (1 - df["l_discount"])).alias("actual_price"))
        df = df.with_columns((df["l_extendedprice"] * (1 - df["l_discount"]) * (1 + df["l_tax"])).alias("tax_price"))
        aggregates = [("actual_price", "sum"), ("tax_price", "sum"), ("l_quantity", "sum"), ("l_extendedprice", "sum")]
        aggregates += [("l_quantity", "hash_mean"), ("l_extendedprice", "hash_mean"), ("l_discount", "hash_mean")]
        aggregates += [("l_extendedprice", "hash_count")]
        return polars.from_arrow(df.to_arrow().group_by(["l_returnflag", "l_linestatus"]).aggregate(aggregates))

    columns = ["l_shipdate", "l_returnflag", "l_linestatus", "l_quantity", "l_extendedprice", "l_discount", "l_tax"]
    lineitem = task_graph.new_input_reader_node(reader(data, fmt, "lineitem", columns), stage=-1)
    statement = (
        "sum(l_quantity_sum) as sum_qty, sum(l_extendedprice_sum) as sum_base_price, sum(actual_price_sum) as sum_disc_price, "
        "sum(tax_price_sum) as sum_charge, avg(l_quantity_mean) as avg_qty, avg(l_extendedprice_mean) as avg_price, "
        "avg(l_discount_mean) as avg_disc, sum(l_extendedprice_count) as count_order"
    )
    agg_executor = SQLAggExecutor(["l_returnflag", "l_linestatus"], [("l_returnflag", "asc"), ("l_linestatus", "asc")], statement)
    agged = task_graph.new_blocking_node(
        {0: lineitem},
        agg_executor,
        placement_strategy=SingleChannelStrategy(),
        source_target_info=broadcast(sqlglot.parse_one("l_shipdate <= date '1998-09-02'"), [batch_func]),
    )
    task_graph.create()
    task_graph.run()
    return answer(qc, agged)


def high_low(df: polars.DataFrame) -> polars.DataFrame:
    """tpch-12's (and mod.py's) batch function: orders of high and of low priority per ship mode."""
    df = df.with_columns(((df["o_orderpriority"] == "1-URGENT") | (df["o_orderpriority"] == "2-HIGH")).alias("high"))
    df = df.with_columns(((df["o_orderpriority"] != "1-URGENT") & (df["o_orderpriority"] != "2-HIGH")).alias("low"))
    return polars.from_arrow(df.to_arrow().group_by("l_shipmode").aggregate([("high", "sum"), ("low", "sum")]))


def day(text: str) -> Any:
    return compute.strptime(text, format="%Y-%m-%d", unit="s")


def tpch_12(data: str | Path, fmt: str = "csv", exec_per_node: int = 1) -> pd.DataFrame:
    """tpch-12 (and mod.py): late MAIL and SHIP items received in 1994, by order priority; Parquet as its branch."""
    qc, task_graph = context(exec_per_node)
    columns = ["l_shipdate", "l_commitdate", "l_shipmode", "l_receiptdate", "l_orderkey"]
    if fmt == "parquet":
        filters = [("l_shipmode", "in", ["SHIP", "MAIL"]), ("l_receiptdate", "<", day("1995-01-01"))]
        filters += [("l_receiptdate", ">=", day("1994-01-01"))]
        lineitem_reader = reader(data, fmt, "lineitem", columns, filters)
        lineitem_where = "l_commitdate < l_receiptdate and l_shipdate < l_commitdate "
        orders_projection = None
    else:
        lineitem_reader = reader(data, fmt, "lineitem", columns)
        lineitem_where = (
            "l_shipmode IN ('MAIL','SHIP') and l_commitdate < l_receiptdate and l_shipdate < l_commitdate and "
            "l_receiptdate >= date '1994-01-01' and l_receiptdate < date '1995-01-01'"
        )
        orders_projection = ["o_orderkey", "o_orderpriority"]
    lineitem = task_graph.new_input_reader_node(lineitem_reader, stage=-1)
    orders = task_graph.new_input_reader_node(reader(data, fmt, "orders", ["o_orderkey", "o_orderpriority"]))
    output_stream = task_graph.new_non_blocking_node(
        {0: orders, 1: lineitem},
        BuildProbeJoinExecutor(left_on="o_orderkey", right_on="l_orderkey"),
        source_target_info={
            0: edge("o_orderkey", None, orders_projection),
            1: edge("l_orderkey", lineitem_where, ["l_orderkey", "l_shipmode"]),
        },
    )
    agged = task_graph.new_blocking_node(
        {0: output_stream},
        SQLAggExecutor(["l_shipmode"], None, "sum(high_sum) as high, sum(low_sum) as low"),
        placement_strategy=SingleChannelStrategy(),
        source_target_info=broadcast(None, [high_low]),
    )
    task_graph.create()
    task_graph.run()
    return answer(qc, agged)


def tpch_3(data: str | Path, fmt: str = "csv", exec_per_node: int = 1) -> pd.DataFrame:
    """tpch-3: revenue of BUILDING customers' orders before 1995-03-15 shipped after it (every order: no LIMIT)."""
    qc, task_graph = context(exec_per_node)

    def batch_func(df: polars.DataFrame) -> polars.DataFrame:
        df = df.with_columns((df["l_extendedprice"] * (1 - df["l_discount"])).alias("actual_price"))
        grouped = df.to_arrow().group_by(["l_orderkey", "o_orderdate", "o_shippriority"]).aggregate([("actual_price", "sum")])
        return polars.from_arrow(grouped)

    lineitem_columns = ["l_orderkey", "l_extendedprice", "l_discount", "l_shipdate"]
    lineitem = task_graph.new_input_reader_node(reader(data, fmt, "lineitem", lineitem_columns), stage=-1)
    orders_columns = ["o_orderkey", "o_orderdate", "o_shippriority", "o_custkey"]
    orders = task_graph.new_input_reader_node(reader(data, fmt, "orders", orders_columns), stage=0)
    customer = task_graph.new_input_reader_node(reader(data, fmt, "customer", ["c_custkey", "c_mktsegment"]), stage=-1)
    first_joined = task_graph.new_non_blocking_node(
        {0: orders, 1: customer},
        BuildProbeJoinExecutor(left_on="o_custkey", right_on="c_custkey"),
        source_target_info={
            0: edge("o_custkey", "o_orderdate <= date '1995-03-14'", orders_columns),
            1: edge("c_custkey", "c_mktsegment = 'BUILDING'", ["c_custkey"]),
        },
    )
    output_stream = task_graph.new_non_blocking_node(
        {0: first_joined, 1: lineitem},
        BuildProbeJoinExecutor(left_on="o_orderkey", right_on="l_orderkey", key_to_keep="right"),
        source_target_info={
            0: edge("o_orderkey"),
            1: edge("l_orderkey", "l_shipdate >= date '1995-03-16'", ["l_orderkey", "l_extendedprice", "l_discount"]),
        },
    )
    agg_executor = SQLAggExecutor(
        ["l_orderkey", "o_orderdate", "o_shippriority"],
        [("revenue", "desc"), ("o_orderdate", "asc")],
        "sum(actual_price_sum) as revenue",
    )
    agged = task_graph.new_blocking_node(
        {0: output_stream},
        agg_executor,
        placement_strategy=SingleChannelStrategy(),
        source_target_info=broadcast(None, [batch_func]),
    )
    task_graph.create()
    task_graph.run()
    return answer(qc, agged)


def tpch_4(data: str | Path, fmt: str = "csv", exec_per_node: int = 1) -> pd.DataFrame:
    """tpch-4 (and lesson3.1): orders of 1993's third quarter with a late item, by priority (a semi join)."""
    qc, task_graph = context(exec_per_node)
    lineitem_columns = ["l_orderkey", "l_commitdate", "l_receiptdate"]
    lineitem = task_graph.new_input_reader_node(reader(data, fmt, "lineitem", lineitem_columns), stage=-1)
    orders = task_graph.new_input_reader_node(reader(data, fmt, "orders", ["o_orderkey", "o_orderpriority", "o_orderdate"]))
    output_stream = task_graph.new_non_blocking_node(
        {0: orders, 1: lineitem},
        BuildProbeJoinExecutor(left_on="o_orderkey", right_on="l_orderkey", how="semi"),
        source_target_info={
            0: edge(
                "o_orderkey", "o_orderdate between date '1993-07-01' and date '1993-09-30'", ["o_orderkey", "o_orderpriority"]
            ),
            1: edge("l_orderkey", "l_commitdate < l_receiptdate", ["l_orderkey"]),
        },
    )
    agged = task_graph.new_blocking_node(
        {0: output_stream},
        SQLAggExecutor(["o_orderpriority"], [("o_orderpriority", "asc")], "count(*) as order_count"),
        placement_strategy=SingleChannelStrategy(),
        source_target_info=broadcast(),
    )
    task_graph.create()
    task_graph.run()
    return answer(qc, agged)


def tpch_13(data: str | Path, fmt: str = "csv", exec_per_node: int = 1) -> pd.DataFrame:
    """tpch-13: customers by their count of orders not about special requests (a left join, then two aggregates)."""
    qc, task_graph = context(exec_per_node)
    orders_columns = ["o_custkey", "o_orderkey", "o_comment"]
    orders = task_graph.new_input_reader_node(reader(data, fmt, "orders", orders_columns), stage=-1)
    customer = task_graph.new_input_reader_node(reader(data, fmt, "customer", ["c_custkey"]), stage=0)
    first_joined = task_graph.new_non_blocking_node(
        {0: customer, 1: orders},
        BuildProbeJoinExecutor(left_on="c_custkey", right_on="o_custkey", how="left"),
        source_target_info={
            0: edge("c_custkey", None, ["c_custkey"]),
            1: edge("o_custkey", "not o_comment::text like '%special%requests%'", ["o_custkey", "o_orderkey"]),
        },
    )
    agged1 = task_graph.new_non_blocking_node(
        {0: first_joined},
        SQLAggExecutor(["c_custkey"], None, "count(o_orderkey) as c_count"),
        placement_strategy=SingleChannelStrategy(),
        source_target_info=broadcast(),
    )
    agged2 = task_graph.new_blocking_node(
        {0: agged1},
        SQLAggExecutor(["c_count"], [("custdist", "desc"), ("c_count", "desc")], "count(*) as custdist"),
        placement_strategy=SingleChannelStrategy(),
        source_target_info=broadcast(),
    )
    task_graph.create()
    task_graph.run()
    return answer(qc, agged2)


def tpch_14(data: str | Path, fmt: str = "csv", exec_per_node: int = 1) -> pd.DataFrame:
    """tpch-14: all revenue of September 1995 over the promotions' (TPC-H 14 divides the other way), times 100."""
    qc, task_graph = context(exec_per_node)

    def batch_func(df: polars.DataFrame) -> polars.DataFrame:
        promo = polars.when(df["p_type"].str.starts_with("PROMO")).then(df["l_extendedprice"] * (1 - df["l_discount"]))
        df = df.with_columns(promo.otherwise(0).alias("promo_revenue"))
        return df.with_columns((df["l_extendedprice"] * (1 - df["l_discount"])).alias("revenue"))

    lineitem_columns = ["l_partkey", "l_extendedprice", "l_discount", "l_shipdate"]
    lineitem = task_graph.new_input_reader_node(reader(data, fmt, "lineitem", lineitem_columns))
    part = task_graph.new_input_reader_node(reader(data, fmt, "part", ["p_partkey", "p_type"]), stage=-1)
    output_stream = task_graph.new_non_blocking_node(
        {0: lineitem, 1: part},
        BuildProbeJoinExecutor(left_on="l_partkey", right_on="p_partkey"),
        source_target_info={
            0: edge(
                "l_partkey",
                "l_shipdate between date '1995-09-01' and date '1995-09-30'",
                ["l_partkey", "l_extendedprice", "l_discount"],
            ),
            1: edge("p_partkey", None, ["p_partkey", "p_type"]),
        },
    )
    agged = task_graph.new_blocking_node(
        {0: output_stream},
        SQLAggExecutor([], None, "100 * sum(revenue) / sum(promo_revenue)"),
        placement_strategy=SingleChannelStrategy(),
        source_target_info=broadcast(None, [batch_func]),
    )
    task_graph.create()
    task_graph.run()
    return answer(qc, agged)


TPCH_19_PARTS = (
    "p_size between 1 and 5 and p_brand = 'Brand#12' and p_container in ('SM BOX', 'SM CASE', 'SM PACK', 'SM PKG')",
    "p_size between 1 and 10 and p_brand = 'Brand#23' and p_container in ('MED BAG', 'MED BOX', 'MED PACK', 'MED PKG')",
    "p_size between 1 and 15 and p_brand ='Brand#34' and p_container in ('LG BOX', 'LG CASE', 'LG PACK', 'LG PKG')",
)


def tpch_19(data: str | Path, fmt: str = "csv", exec_per_node: int = 1) -> pd.DataFrame:
    """tpch-19: discounted revenue of three kinds of part delivered in person by air (TPC-H 19's validation constants)."""
    qc, task_graph = context(exec_per_node)

    def batch_func(df: polars.DataFrame) -> polars.DataFrame:
        return df.with_columns((df["l_extendedprice"] * (1 - df["l_discount"])).alias("actual_price"))

    first, second, third = TPCH_19_PARTS
    lineitem_condition = (
        "l_quantity between 1 and 30 and l_shipinstruct = 'DELIVER IN PERSON' and l_shipmode in ('AIR', 'AIR REG')"
    )
    joined_predicate = (
        f"{first} and l_quantity between 1 and 11 or {second} and l_quantity between 10 and 20 or "
        f"{third} and l_quantity between 20 and 30"
    )
    lineitem_columns = ["l_partkey", "l_quantity", "l_extendedprice", "l_discount", "l_shipinstruct", "l_shipmode"]
    lineitem = task_graph.new_input_reader_node(reader(data, fmt, "lineitem", lineitem_columns))
    part_columns = ["p_partkey", "p_brand", "p_size", "p_container"]
    part = task_graph.new_input_reader_node(reader(data, fmt, "part", part_columns), stage=-1)
    output_stream = task_graph.new_non_blocking_node(
        {0: lineitem, 1: part},
        BuildProbeJoinExecutor(left_on="l_partkey", right_on="p_partkey"),
        source_target_info={
            0: edge("l_partkey", lineitem_condition),
            1: edge("p_partkey", " or ".join(TPCH_19_PARTS)),
        },
    )
    agged = task_graph.new_blocking_node(
        {0: output_stream},
        SQLAggExecutor([], None, "sum(actual_price) as revenue"),
        placement_strategy=SingleChannelStrategy(),
        source_target_info=broadcast(sqlglot.parse_one(joined_predicate), [batch_func]),
    )
    task_graph.create()
    task_graph.run()
    return answer(qc, agged)


QUERIES: dict[str, Callable[[str | Path, str, int], pd.DataFrame]] = {
    "tpch-1": tpch_1,
    "tpch-3": tpch_3,
    "tpch-4": tpch_4,
    "tpch-6": tpch_6,
    "tpch-12": tpch_12,
    "tpch-13": tpch_13,
    "tpch-14": tpch_14,
    "tpch-19": tpch_19,
}
TABLES_OF = {
    "tpch-1": ("lineitem",),
    "tpch-3": ("lineitem", "orders", "customer"),
    "tpch-4": ("lineitem", "orders"),
    "tpch-6": ("lineitem",),
    "tpch-12": ("lineitem", "orders"),
    "tpch-13": ("orders", "customer"),
    "tpch-14": ("lineitem", "part"),
    "tpch-19": ("lineitem", "part"),
}
# the rows' order that makes answers comparable (tpch-3's revenue order may break ties either way)
KEYS = {"tpch-3": ["l_orderkey"], "tpch-12": ["l_shipmode"]}
# tpch-1's averages of per-batch averages: near TPC-H's averages, as near as the batches are even
AVERAGES = {"tpch-1": ["avg_qty", "avg_price", "avg_disc"]}

# each tutorial's question (its predicates and output columns) as Spark SQL and DuckDB both run it
SQL = {
    "tpch-1": """
        select l_returnflag, l_linestatus, sum(l_quantity) as sum_qty, sum(l_extendedprice) as sum_base_price,
               sum(l_extendedprice * (1 - l_discount)) as sum_disc_price,
               sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge, avg(l_quantity) as avg_qty,
               avg(l_extendedprice) as avg_price, avg(l_discount) as avg_disc, count(*) as count_order
        from lineitem where l_shipdate <= date '1998-09-02'
        group by l_returnflag, l_linestatus order by l_returnflag, l_linestatus""",
    "tpch-3": """
        select l_orderkey, o_orderdate, o_shippriority, sum(l_extendedprice * (1 - l_discount)) as revenue
        from customer join orders on c_custkey = o_custkey join lineitem on l_orderkey = o_orderkey
        where c_mktsegment = 'BUILDING' and o_orderdate < date '1995-03-15' and l_shipdate > date '1995-03-15'
        group by l_orderkey, o_orderdate, o_shippriority order by revenue desc, o_orderdate""",
    "tpch-4": """
        select o_orderpriority, count(*) as order_count from orders
        where o_orderdate >= date '1993-07-01' and o_orderdate < date '1993-10-01'
          and exists (select * from lineitem where l_orderkey = o_orderkey and l_commitdate < l_receiptdate)
        group by o_orderpriority order by o_orderpriority""",
    "tpch-6": """
        select sum(l_extendedprice * l_discount) as revenue from lineitem
        where l_shipdate between date '1994-01-01' and date '1994-12-31' and l_discount between 0.05 and 0.07
          and l_quantity <= 23.99""",
    "tpch-12": """
        select l_shipmode,
               sum(case when o_orderpriority in ('1-URGENT', '2-HIGH') then 1 else 0 end) as high,
               sum(case when o_orderpriority not in ('1-URGENT', '2-HIGH') then 1 else 0 end) as low
        from orders join lineitem on o_orderkey = l_orderkey
        where l_shipmode in ('MAIL', 'SHIP') and l_commitdate < l_receiptdate and l_shipdate < l_commitdate
          and l_receiptdate >= date '1994-01-01' and l_receiptdate < date '1995-01-01'
        group by l_shipmode order by l_shipmode""",
    "tpch-13": """
        select c_count, count(*) as custdist from (
            select c_custkey, count(o_orderkey) as c_count
            from customer left outer join orders on c_custkey = o_custkey and o_comment not like '%special%requests%'
            group by c_custkey) counts
        group by c_count order by custdist desc, c_count desc""",
    "tpch-14": """
        select 100 * sum(l_extendedprice * (1 - l_discount))
               / sum(case when p_type like 'PROMO%' then l_extendedprice * (1 - l_discount) else 0 end) as ratio
        from lineitem join part on l_partkey = p_partkey
        where l_shipdate >= date '1995-09-01' and l_shipdate < date '1995-10-01'""",
    "tpch-19": """
        select sum(l_extendedprice * (1 - l_discount)) as revenue from lineitem join part on p_partkey = l_partkey
        where l_shipinstruct = 'DELIVER IN PERSON' and l_shipmode in ('AIR', 'AIR REG') and (
              (p_brand = 'Brand#12' and p_container in ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
               and l_quantity between 1 and 11 and p_size between 1 and 5)
           or (p_brand = 'Brand#23' and p_container in ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK')
               and l_quantity between 10 and 20 and p_size between 1 and 10)
           or (p_brand = 'Brand#34' and p_container in ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
               and l_quantity between 20 and 30 and p_size between 1 and 15))""",
}


def comparable(query: str, frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` (a tutorial's answer or its SQL's) in a row order both share, Decimals as floats."""
    frame = plain(frame)
    if query in KEYS:
        frame = frame.sort_values(KEYS[query])
    return frame.reset_index(drop=True)


def same_answer(query: str, ours: pd.DataFrame, theirs: pd.DataFrame) -> bool:
    """Same shape; numbers equal within 1e-6 (relative; tpch-1's averages within 10%); other values equal as dates or text."""
    a, b = comparable(query, ours), comparable(query, theirs)
    if a.shape != b.shape:
        return False
    for x, y in zip(a.columns, b.columns, strict=True):
        u, v = a[x].to_numpy(), b[y].to_numpy()
        if np.issubdtype(v.dtype, np.number) and not np.issubdtype(v.dtype, np.bool_):
            rtol = 0.1 if x in AVERAGES.get(query, []) else 1e-6
            if not np.allclose(u.astype(float), v.astype(float), rtol=rtol, atol=0):
                return False
        elif [str(s)[:10] for s in u] != [str(s)[:10] for s in v]:
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a directory of TPC-H .tbl files (default: generated)")
    parser.add_argument("--scale", type=float, default=0.1, help="TPC-H scale factor of generated data (default 0.1)")
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv", help="read the .tbl files or Parquet")
    parser.add_argument("--query", action="append", choices=list(QUERIES), help="a query to run (default: all)")
    parser.add_argument("--exec-per-node", type=int, default=1, help="the joins' channels (default 1, the tutorials')")
    args = parser.parse_args()
    queries = args.query or list(QUERIES)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = prepare(args.data or tmp, queries, args.format, args.scale)
        for query in queries:
            start = time.perf_counter()
            result = QUERIES[query](data_dir, args.format, args.exec_per_node)
            print(f"{query} ({time.perf_counter() - start:.2f} s):")
            print(result)


if __name__ == "__main__":
    main()
