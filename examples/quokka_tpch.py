"""TPC-H Q3, Q6, Q8 and Q12 as Quokka's TPC-H apps of 2022 wrote them, run by `conveyor.compat.quokka`.

    python examples/quokka_tpch.py [--data DIR] [--scale 0.1] [--format csv|parquet] [--query q3 ...]

Each query is the program of Quokka's app (its runtime API of spring 2022: `TaskGraph()`,
`new_input_reader_node` over Quokka's input datasets, the five-argument task nodes, its stock
`AggExecutor`, `PolarJoinExecutor` and `BroadcastJoinExecutor`, results read with `ray.get(...)`),
with its imports pointed at the compat and its inputs at local files (bucket = a directory). The
apps' own predicates are kept, where they differ from the TPC-H text (Q3's order date, Q6's and
Q8's bounds): `SQL` holds each as DuckDB runs it, to check the answers. Without --data, the tables
are generated with tpchgen-cli into a temporary directory.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import polars
import pyarrow as pa
import pyarrow.compute as compute
from tpch import TABLES, generate, to_parquet

from conveyor.compat.quokka import ray
from conveyor.compat.quokka.dataset import InputCSVDataset, InputMultiParquetDataset
from conveyor.compat.quokka.quokka_runtime import TaskGraph
from conveyor.compat.quokka.sql import AggExecutor, BroadcastJoinExecutor, PolarJoinExecutor

# the apps' schemas (their schema.py): every column, and "null" for the empty field after the last "|"
lineitem_scheme, order_scheme, customer_scheme, part_scheme, supplier_scheme, nation_scheme, region_scheme = (
    [*TABLES[t], "null"] for t in ("lineitem", "orders", "customer", "part", "supplier", "nation", "region")
)


def day(text: str) -> Any:
    return compute.strptime(text, format="%Y-%m-%d", unit="s")


def q3(bucket: str, fmt: str, channels: int = 2) -> pd.DataFrame:
    """The app's Q3: customers of BUILDING, orders before 1995-03-03, items shipped after 1995-03-15; top 10."""
    task_graph = TaskGraph()

    def batch_func2(df: pd.DataFrame) -> pd.DataFrame:
        df["product"] = df["l_extendedprice"] * (1 - df["l_discount"])
        return df.groupby(["o_orderkey", "o_orderdate", "o_shippriority"]).agg(revenue=("product", "sum"))

    def final_func(state: pd.DataFrame) -> pd.DataFrame:
        return state.sort_values(["revenue", "o_orderdate"], ascending=[False, True])[:10]

    def orders_filter(x: pa.Table) -> Any:
        kept = x.filter(compute.less(x["o_orderdate"], day("1995-03-03")))
        return polars.from_arrow(kept.select(["o_orderkey", "o_custkey", "o_shippriority", "o_orderdate"]))

    def lineitem_filter(x: pa.Table) -> Any:
        kept = x.filter(compute.greater(x["l_shipdate"], day("1995-03-15")))
        return polars.from_arrow(kept.select(["l_orderkey", "l_extendedprice", "l_discount"]))

    def customer_filter(x: pa.Table) -> Any:
        return polars.from_arrow(x.filter(compute.equal(x["c_mktsegment"], "BUILDING")).select(["c_custkey"]))

    if fmt == "csv":
        lineitem_reader = InputCSVDataset(bucket, "lineitem.tbl", lineitem_scheme, sep="|")
        orders_reader = InputCSVDataset(bucket, "orders.tbl", order_scheme, sep="|")
        customer_reader = InputCSVDataset(bucket, "customer.tbl", customer_scheme, sep="|")
        lineitem = task_graph.new_input_reader_node(lineitem_reader, {"localhost": channels}, batch_func=lineitem_filter)
        orders = task_graph.new_input_reader_node(orders_reader, {"localhost": channels}, batch_func=orders_filter)
        customer = task_graph.new_input_reader_node(customer_reader, {"localhost": channels}, batch_func=customer_filter)
    else:
        lineitem_reader = InputMultiParquetDataset(
            bucket,
            "lineitem.parquet",
            columns=["l_orderkey", "l_extendedprice", "l_discount"],
            filters=[("l_shipdate", ">", day("1995-03-15"))],
        )
        orders_reader = InputMultiParquetDataset(
            bucket,
            "orders.parquet",
            columns=["o_orderkey", "o_custkey", "o_shippriority", "o_orderdate"],
            filters=[("o_orderdate", "<", day("1995-03-03"))],
        )
        customer_reader = InputMultiParquetDataset(
            bucket, "customer.parquet", columns=["c_custkey"], filters=[("c_mktsegment", "==", "BUILDING")]
        )
        lineitem = task_graph.new_input_reader_node(lineitem_reader, {"localhost": channels})
        orders = task_graph.new_input_reader_node(orders_reader, {"localhost": channels})
        customer = task_graph.new_input_reader_node(customer_reader, {"localhost": channels})

    join_executor1 = PolarJoinExecutor(
        left_on="c_custkey", right_on="o_custkey", columns=["o_orderkey", "o_orderdate", "o_shippriority"]
    )
    join_executor2 = PolarJoinExecutor(left_on="o_orderkey", right_on="l_orderkey", batch_func=batch_func2)
    temp = task_graph.new_non_blocking_node(
        {0: customer, 1: orders}, None, join_executor1, {"localhost": channels}, {0: "c_custkey", 1: "o_custkey"}
    )
    joined = task_graph.new_non_blocking_node(
        {0: temp, 1: lineitem}, None, join_executor2, {"localhost": channels}, {0: "o_orderkey", 1: "l_orderkey"}
    )

    def partition_key1(data: Any, source_channel: int, target_channel: int) -> Any:
        return data if source_channel == target_channel else None

    intermediate = task_graph.new_non_blocking_node(
        {0: joined}, None, AggExecutor(fill_value=0), {"localhost": channels}, {0: partition_key1}
    )
    agged = task_graph.new_blocking_node({0: intermediate}, None, AggExecutor(final_func=final_func), {"localhost": 1}, {0: None})
    task_graph.create()
    task_graph.run_with_fault_tolerance()
    result: pd.DataFrame = ray.get(agged.to_pandas.remote())
    return result


def q6(bucket: str, fmt: str, channels: int = 2) -> pd.DataFrame:
    """The app's Q6: items shipped after 1994-01-01 (no upper bound), discount 5-7%, quantity under 24."""
    task_graph = TaskGraph()

    def lineitem_filter(df: pa.Table) -> pd.DataFrame:
        keep = compute.and_(
            compute.and_(compute.greater(df["l_shipdate"], day("1994-01-01")), compute.greater_equal(df["l_discount"], 0.05)),
            compute.and_(compute.less_equal(df["l_discount"], 0.07), compute.less(df["l_quantity"], 24)),
        )
        filtered_df = df.filter(keep).to_pandas()
        return pd.DataFrame([(filtered_df.l_extendedprice * filtered_df.l_discount).sum()], columns=["sum"])

    def lineitem_filter_parquet(df: pa.Table) -> pd.DataFrame:
        filtered_df = df.to_pandas()
        return pd.DataFrame([(filtered_df.l_extendedprice * filtered_df.l_discount).sum()], columns=["sum"])

    if fmt == "csv":
        lineitem_reader = InputCSVDataset(bucket, "lineitem.tbl", lineitem_scheme, sep="|")
        lineitem = task_graph.new_input_reader_node(lineitem_reader, {"localhost": channels}, batch_func=lineitem_filter)
    else:
        filters = [
            ("l_shipdate", ">", day("1994-01-01")),
            ("l_discount", ">=", 0.05),
            ("l_discount", "<=", 0.07),
            ("l_quantity", "<", 24),
        ]
        lineitem_reader = InputMultiParquetDataset(
            bucket, "lineitem.parquet", columns=["l_discount", "l_extendedprice"], filters=filters
        )
        lineitem = task_graph.new_input_reader_node(lineitem_reader, {"localhost": channels}, batch_func=lineitem_filter_parquet)

    agged = task_graph.new_blocking_node({0: lineitem}, None, AggExecutor(), {"localhost": 1}, {0: None})
    task_graph.create()
    task_graph.run()
    result: pd.DataFrame = ray.get(agged.to_pandas.remote())
    return result


def q8(bucket: str, fmt: str, channels: int = 2) -> pd.DataFrame:
    """The app's Q8: BRAZIL's share of ECONOMY ANODIZED STEEL sold in AMERICA, orders strictly within 1995-1996."""
    task_graph = TaskGraph()
    nation = pd.read_csv(f"{bucket}/nation.tbl", header=None, names=nation_scheme, sep="|")
    region = pd.read_csv(f"{bucket}/region.tbl", header=None, names=region_scheme, sep="|")
    region = region[region.r_name == "AMERICA"]
    america = nation.merge(region, left_on="n_regionkey", right_on="r_regionkey")

    if fmt == "csv":

        def lineitem_filter(x: pa.Table) -> Any:
            return polars.from_arrow(x.drop(["null"])).select(
                ["l_partkey", "l_orderkey", "l_suppkey", "l_extendedprice", "l_discount"]
            )

        def orders_filter(x: pa.Table) -> Any:
            keep = compute.and_(
                compute.less(x["o_orderdate"], day("1996-12-31")), compute.greater(x["o_orderdate"], day("1995-01-01"))
            )
            return polars.from_arrow(x.drop(["null"]).filter(keep)).select(["o_orderkey", "o_custkey", "o_orderdate"])

        def customer_filter(x: pa.Table) -> Any:
            return polars.from_arrow(x.drop(["null"])).select(["c_custkey", "c_nationkey"])

        def part_filter(x: pa.Table) -> Any:
            return polars.from_arrow(x.drop(["null"]).filter(compute.equal(x["p_type"], "ECONOMY ANODIZED STEEL"))).select(
                ["p_partkey"]
            )

        def supplier_filter(x: pa.Table) -> Any:
            return polars.from_arrow(x.drop(["null"])).select(["s_suppkey", "s_nationkey"])

        def reader(table: str, scheme: list[str], func: Callable[[pa.Table], Any]) -> Any:
            return task_graph.new_input_reader_node(
                InputCSVDataset(bucket, f"{table}.tbl", scheme, sep="|"), {"localhost": channels}, batch_func=func
            )

        lineitem = reader("lineitem", lineitem_scheme, lineitem_filter)
        orders = reader("orders", order_scheme, orders_filter)
        customer = reader("customer", customer_scheme, customer_filter)
        part = reader("part", part_scheme, part_filter)
        supplier = reader("supplier", supplier_scheme, supplier_filter)
    else:

        def parquet(table: str, columns: list[str], filters: Any = None) -> Any:
            return task_graph.new_input_reader_node(
                InputMultiParquetDataset(bucket, f"{table}.parquet", columns=columns, filters=filters), {"localhost": channels}
            )

        lineitem = parquet("lineitem", ["l_partkey", "l_orderkey", "l_suppkey", "l_extendedprice", "l_discount"])
        orders = parquet(
            "orders",
            ["o_orderkey", "o_custkey", "o_orderdate"],
            [("o_orderdate", "<", day("1996-12-31")), ("o_orderdate", ">", day("1995-01-01"))],
        )
        customer = parquet("customer", ["c_custkey", "c_nationkey"])
        part = parquet("part", ["p_partkey"], [("p_type", "==", "ECONOMY ANODIZED STEEL")])
        supplier = parquet("supplier", ["s_suppkey", "s_nationkey"])

    def pass_thru(data: Any, source_channel: int, target_channel: int) -> Any:
        return data if source_channel // channels == target_channel else None

    def batch_func(x: pd.DataFrame) -> pd.DataFrame:  # input is pandas! output is also pandas
        x["o_year"] = pd.DatetimeIndex(x["o_orderdate"]).year
        x["volume"] = x["l_extendedprice"] * (1 - x["l_discount"])
        x["brazil"] = x["volume"] * (x["n_name"] == "BRAZIL")
        return x.groupby("o_year").agg({"brazil": ["sum"], "volume": ["sum"]})

    def final_func(x: pd.DataFrame) -> pd.DataFrame:
        x["mkt_share"] = x["brazil"] / x["volume"]
        return x

    one = {"localhost": 1}
    bjoin = BroadcastJoinExecutor(america, small_on="n_nationkey", big_on="c_nationkey", columns=["c_custkey"])
    filtered_customer = task_graph.new_non_blocking_node({0: customer}, None, bjoin, one, {0: pass_thru})
    join1 = PolarJoinExecutor(
        left_on="p_partkey", right_on="l_partkey", columns=["l_suppkey", "l_orderkey", "l_extendedprice", "l_discount"]
    )
    part_lineitem = task_graph.new_non_blocking_node({0: part, 1: lineitem}, None, join1, one, {0: "p_partkey", 1: "l_partkey"})
    join2 = PolarJoinExecutor(
        left_on="l_orderkey",
        right_on="o_orderkey",
        columns=["l_suppkey", "o_custkey", "o_orderdate", "l_extendedprice", "l_discount"],
    )
    part_lineitem_orders = task_graph.new_non_blocking_node(
        {0: part_lineitem, 1: orders}, None, join2, one, {0: "l_orderkey", 1: "o_orderkey"}
    )
    join3 = PolarJoinExecutor(
        left_on="o_custkey", right_on="c_custkey", columns=["l_suppkey", "o_orderdate", "l_extendedprice", "l_discount"]
    )
    plo_customers = task_graph.new_non_blocking_node(
        {0: part_lineitem_orders, 1: filtered_customer}, None, join3, one, {0: "o_custkey", 1: "c_custkey"}
    )
    bjoin2 = BroadcastJoinExecutor(nation, small_on="n_nationkey", big_on="s_nationkey")
    filtered_supplier = task_graph.new_non_blocking_node({0: supplier}, None, bjoin2, one, {0: pass_thru})
    join4 = PolarJoinExecutor(
        left_on="l_suppkey",
        right_on="s_suppkey",
        columns=["o_orderdate", "l_extendedprice", "l_discount", "n_name"],
        batch_func=batch_func,
    )
    all_nations = task_graph.new_non_blocking_node(
        {0: plo_customers, 1: filtered_supplier}, None, join4, one, {0: "l_suppkey", 1: "s_suppkey"}
    )
    result = task_graph.new_blocking_node({0: all_nations}, None, AggExecutor(final_func=final_func), one, {0: None})
    task_graph.create()
    task_graph.run_with_fault_tolerance()
    answer: pd.DataFrame = ray.get(result.to_pandas.remote())
    return answer


def q12(bucket: str, fmt: str, channels: int = 2) -> pd.DataFrame:
    """The app's Q12: late MAIL and SHIP items received in 1994, by order priority."""
    task_graph = TaskGraph()

    def batch_func(df: pd.DataFrame) -> pd.DataFrame:
        df["high"] = ((df["o_orderpriority"] == "1-URGENT") | (df["o_orderpriority"] == "2-HIGH")).astype(int)
        df["low"] = ((df["o_orderpriority"] != "1-URGENT") & (df["o_orderpriority"] != "2-HIGH")).astype(int)
        return df.groupby("l_shipmode").agg({"high": ["sum"], "low": ["sum"]})

    def orders_filter(x: pa.Table) -> Any:
        return polars.from_arrow(x.select(["o_orderkey", "o_orderpriority"]))

    def lineitem_filter(x: pa.Table) -> Any:
        keep = compute.and_(
            compute.and_(
                compute.and_(
                    compute.is_in(x["l_shipmode"], value_set=pa.array(["SHIP", "MAIL"])),
                    compute.less(x["l_commitdate"], x["l_receiptdate"]),
                ),
                compute.and_(
                    compute.less(x["l_shipdate"], x["l_commitdate"]), compute.greater_equal(x["l_receiptdate"], day("1994-01-01"))
                ),
            ),
            compute.less(x["l_receiptdate"], day("1995-01-01")),
        )
        return polars.from_arrow(x.filter(keep).select(["l_orderkey", "l_shipmode"]))

    def lineitem_filter_parquet(x: pa.Table) -> Any:
        keep = compute.and_(compute.less(x["l_commitdate"], x["l_receiptdate"]), compute.less(x["l_shipdate"], x["l_commitdate"]))
        return polars.from_arrow(x.filter(keep).select(["l_orderkey", "l_shipmode"]))

    if fmt == "csv":
        lineitem_reader = InputCSVDataset(bucket, "lineitem.tbl", lineitem_scheme, sep="|")
        orders_reader = InputCSVDataset(bucket, "orders.tbl", order_scheme, sep="|")
        lineitem = task_graph.new_input_reader_node(lineitem_reader, {"localhost": channels}, batch_func=lineitem_filter)
        orders = task_graph.new_input_reader_node(orders_reader, {"localhost": channels}, batch_func=orders_filter)
    else:
        filters = [
            ("l_shipmode", "in", ["SHIP", "MAIL"]),
            ("l_receiptdate", "<", day("1995-01-01")),
            ("l_receiptdate", ">=", day("1994-01-01")),
        ]
        lineitem_reader = InputMultiParquetDataset(
            bucket,
            "lineitem.parquet",
            columns=["l_shipdate", "l_commitdate", "l_shipmode", "l_receiptdate", "l_orderkey"],
            filters=filters,
        )
        orders_reader = InputMultiParquetDataset(bucket, "orders.parquet", columns=["o_orderkey", "o_orderpriority"])
        lineitem = task_graph.new_input_reader_node(lineitem_reader, {"localhost": channels}, batch_func=lineitem_filter_parquet)
        orders = task_graph.new_input_reader_node(orders_reader, {"localhost": channels}, batch_func=polars.from_arrow)

    join_executor = PolarJoinExecutor(left_on="o_orderkey", right_on="l_orderkey", batch_func=batch_func)
    output_stream = task_graph.new_non_blocking_node(
        {0: orders, 1: lineitem}, None, join_executor, {"localhost": channels}, {0: "o_orderkey", 1: "l_orderkey"}
    )
    agged = task_graph.new_blocking_node({0: output_stream}, None, AggExecutor(), {"localhost": 1}, {0: None})
    task_graph.create()
    task_graph.run_with_fault_tolerance()
    result: pd.DataFrame = ray.get(agged.to_pandas.remote())
    return result


QUERIES: dict[str, Callable[[str, str, int], pd.DataFrame]] = {"q3": q3, "q6": q6, "q8": q8, "q12": q12}
TABLES_OF = {
    "q3": ("lineitem", "orders", "customer"),
    "q6": ("lineitem",),
    "q8": ("lineitem", "orders", "customer", "part", "supplier", "nation", "region"),
    "q12": ("lineitem", "orders"),
}

# the apps' queries as DuckDB runs them (their predicates, which differ from the TPC-H text in places)
SQL = {
    "q3": """
        select l_orderkey as o_orderkey, o_orderdate, o_shippriority, sum(l_extendedprice * (1 - l_discount)) as revenue
        from customer, orders, lineitem
        where c_mktsegment = 'BUILDING' and c_custkey = o_custkey and l_orderkey = o_orderkey
          and o_orderdate < date '1995-03-03' and l_shipdate > date '1995-03-15'
        group by l_orderkey, o_orderdate, o_shippriority order by revenue desc, o_orderdate limit 10""",
    "q6": """
        select sum(l_extendedprice * l_discount) as sum from lineitem
        where l_shipdate > date '1994-01-01' and l_discount >= 0.05 and l_discount <= 0.07 and l_quantity < 24""",
    "q8": """
        select extract(year from o_orderdate) as o_year,
               sum(case when n2.n_name = 'BRAZIL' then l_extendedprice * (1 - l_discount) else 0 end)
                 / sum(l_extendedprice * (1 - l_discount)) as mkt_share
        from part, supplier, lineitem, orders, customer, nation n1, nation n2, region
        where p_partkey = l_partkey and s_suppkey = l_suppkey and l_orderkey = o_orderkey and o_custkey = c_custkey
          and c_nationkey = n1.n_nationkey and n1.n_regionkey = r_regionkey and r_name = 'AMERICA'
          and s_nationkey = n2.n_nationkey and o_orderdate > date '1995-01-01' and o_orderdate < date '1996-12-31'
          and p_type = 'ECONOMY ANODIZED STEEL'
        group by o_year order by o_year""",
    "q12": """
        select l_shipmode,
               sum(case when o_orderpriority = '1-URGENT' or o_orderpriority = '2-HIGH' then 1 else 0 end) as high,
               sum(case when o_orderpriority <> '1-URGENT' and o_orderpriority <> '2-HIGH' then 1 else 0 end) as low
        from orders, lineitem
        where o_orderkey = l_orderkey and l_shipmode in ('MAIL', 'SHIP') and l_commitdate < l_receiptdate
          and l_shipdate < l_commitdate and l_receiptdate >= date '1994-01-01' and l_receiptdate < date '1995-01-01'
        group by l_shipmode order by l_shipmode""",
}  # fmt: skip


def flat(query: str, result: Any) -> pd.DataFrame:
    """An app's result in the columns and row order of its SQL (index to columns, one level of names)."""
    if not isinstance(result, pd.DataFrame):
        result = result.to_pandas()
    frame = result.copy()
    if isinstance(frame.columns, pd.MultiIndex):
        frame.columns = [a for a, *_ in frame.columns]
    if query != "q6":
        frame = frame.reset_index()
    if query == "q8":
        frame = frame[["o_year", "mkt_share"]].sort_values("o_year")
    elif query == "q12":
        frame = frame[["l_shipmode", "high", "low"]].sort_values("l_shipmode")
    elif query == "q3":
        frame = frame[["o_orderkey", "o_orderdate", "o_shippriority", "revenue"]]
    return frame.reset_index(drop=True)


def same_answer(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Same shape; numbers equal within 1e-6 (relative: sums in another order); other values equal as dates or text."""
    if a.shape != b.shape:
        return False
    for x, y in zip(a.columns, b.columns, strict=True):
        u, v = a[x].to_numpy(), b[y].to_numpy()
        if np.issubdtype(v.dtype, np.number) and not np.issubdtype(v.dtype, np.bool_):
            if not np.allclose(u.astype(float), v.astype(float), rtol=1e-6, atol=0):
                return False
        elif [str(s)[:10] for s in u] != [str(s)[:10] for s in v]:
            return False
    return True


def prepare(data_dir: str, queries: list[str], fmt: str, scale: float) -> str:
    """The tables the queries read, generated at `scale` when missing (and as Parquet for --format parquet)."""
    tables = tuple(sorted({t for q in queries for t in TABLES_OF[q]}))
    generate(scale, data_dir, tables)
    if fmt == "parquet":
        to_parquet(data_dir, tables)
    return data_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a directory of TPC-H .tbl files (default: generated)")
    parser.add_argument("--scale", type=float, default=0.1, help="TPC-H scale factor of generated data (default 0.1)")
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv", help="read the .tbl files or Parquet")
    parser.add_argument("--query", action="append", choices=sorted(QUERIES), help="a query to run (default: all)")
    parser.add_argument("--channels", type=int, default=2, help="channels of the inputs and joins (default 2)")
    args = parser.parse_args()
    queries = args.query or sorted(QUERIES)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = prepare(args.data or tmp, queries, args.format, args.scale)
        for query in queries:
            start = time.perf_counter()
            result = QUERIES[query](data_dir, args.format, args.channels)
            print(f"{query} ({time.perf_counter() - start:.2f} s):")
            print(result)


if __name__ == "__main__":
    main()
