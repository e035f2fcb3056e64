"""TPC-H query 12 (shipping modes and order priority) on the TaskGraph API.

    python examples/tpch_q12.py [--data DIR] [--scale 0.1] [--parallelism 2]

Without --data, the tables are generated with tpchgen-cli (at --scale) into a temporary directory.
The filtered lineitems are the build side of a streaming hash join (the orders input lists them
in `dependents`, so they arrive first and the orders stream through without being stored); the
join's output is aggregated by ship mode and sorted.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import pandas as pd
from tpch import generate, names

from conveyor import Dataset, TaskGraph
from conveyor.graph import HashAggregate, HashJoin, Sort

LINEITEM_COLUMNS = ["l_orderkey", "l_shipdate", "l_commitdate", "l_receiptdate", "l_shipmode"]


def q12_lineitem(df: pd.DataFrame) -> pd.DataFrame:
    """Mail and ship lineitems received in 1994, late but shipped before their commit date."""
    keep = (df.l_shipmode.isin(["MAIL", "SHIP"]) & (df.l_commitdate < df.l_receiptdate) & (df.l_shipdate < df.l_commitdate)
            & (df.l_receiptdate >= pd.Timestamp("1994-01-01")) & (df.l_receiptdate < pd.Timestamp("1995-01-01")))  # fmt: skip
    return df.loc[keep, ["l_orderkey", "l_shipmode"]]


def q12_orders(df: pd.DataFrame) -> pd.DataFrame:
    """Each order as a high (urgent or high priority) or low line count."""
    high = df.o_orderpriority.isin(["1-URGENT", "2-HIGH"]).to_numpy().astype(np.int64)
    return pd.DataFrame({"o_orderkey": df.o_orderkey.to_numpy(), "high": high, "low": 1 - high})


def build_q12(graph: TaskGraph, data_dir: str, parallelism: int = 2) -> Dataset:
    """Add Q12 to `graph`; the Dataset holds l_shipmode, high_line_count, low_line_count."""
    lineitem = graph.new_input_csv(f"{data_dir}/lineitem.tbl", names("lineitem"), parallelism, batch_func=q12_lineitem,
                                   sep="|", columns=LINEITEM_COLUMNS, name="lineitem")  # fmt: skip
    orders = graph.new_input_csv(f"{data_dir}/orders.tbl", names("orders"), parallelism, batch_func=q12_orders, sep="|",
                                 dependents=[lineitem], columns=["o_orderkey", "o_orderpriority"], name="orders")  # fmt: skip
    joined = graph.new_non_blocking_node({0: lineitem, 1: orders}, HashJoin("l_orderkey", "o_orderkey", build=0), parallelism,
                                         {0: "l_orderkey", 1: "o_orderkey"}, name="join")  # fmt: skip
    counts = graph.new_non_blocking_node(
        {0: joined}, HashAggregate("l_shipmode", {"high_line_count": ("sum", "high"), "low_line_count": ("sum", "low")}),
        1, {0: None}, name="aggregate")  # fmt: skip
    return graph.new_blocking_node({0: counts}, Sort("l_shipmode"), 1, {0: None}, name="q12")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="directory holding lineitem.tbl and orders.tbl (default: generate them)")
    parser.add_argument("--scale", type=float, default=0.1, help="TPC-H scale factor to generate (default 0.1)")
    parser.add_argument("--parallelism", type=int, default=2, help="reader tasks and join channels (default 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or str(generate(args.scale, tmp, ("lineitem", "orders")))
        graph = TaskGraph()
        result = build_q12(graph, data, args.parallelism)
        start = time.perf_counter()
        stats = graph.run()
        print(result.to_pandas().to_string(index=False))
        print(f"{time.perf_counter() - start:.2f} s; batches read: {stats.batches_read}")


if __name__ == "__main__":
    main()
