"""TPC-H query 6 (forecasting revenue change) on the TaskGraph API.

    python examples/tpch_q6.py [--data DIR] [--scale 0.1] [--parallelism 2]

Without --data, the lineitem table is generated with tpchgen-cli (at --scale) into a temporary
directory. The filter runs in the input's batch function (predicate and projection pushdown);
one channel sums the revenue.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import pandas as pd
from tpch import generate, names

from conveyor import Dataset, TaskGraph
from conveyor.graph import HashAggregate

COLUMNS = ["l_quantity", "l_extendedprice", "l_discount", "l_shipdate"]


def q6_filter(df: pd.DataFrame) -> pd.DataFrame:
    """The lineitems of 1994 with a discount of 5-7% and a quantity under 24, as their revenue."""
    keep = ((df.l_shipdate >= pd.Timestamp("1994-01-01")) & (df.l_shipdate < pd.Timestamp("1995-01-01"))
            & df.l_discount.between(0.05, 0.07) & (df.l_quantity < 24))  # fmt: skip
    rows = df[keep]
    return pd.DataFrame({"revenue": rows.l_extendedprice * rows.l_discount})


def build_q6(graph: TaskGraph, data_dir: str, parallelism: int = 2) -> Dataset:
    """Add Q6 to `graph`; the Dataset holds one row: revenue."""
    lineitem = graph.new_input_csv(f"{data_dir}/lineitem.tbl", names("lineitem"), parallelism, batch_func=q6_filter,
                                   sep="|", columns=COLUMNS, name="lineitem")  # fmt: skip
    return graph.new_blocking_node({0: lineitem}, HashAggregate([], {"revenue": ("sum", "revenue")}), 1, {0: None}, name="q6")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="directory holding lineitem.tbl (default: generate it)")
    parser.add_argument("--scale", type=float, default=0.1, help="TPC-H scale factor to generate (default 0.1)")
    parser.add_argument("--parallelism", type=int, default=2, help="reader tasks (default 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or str(generate(args.scale, tmp, ("lineitem",)))
        graph = TaskGraph()
        result = build_q6(graph, data, args.parallelism)
        start = time.perf_counter()
        stats = graph.run()
        print(result.to_pandas().to_string(index=False))
        print(f"{time.perf_counter() - start:.2f} s; batches read: {stats.batches_read}")


if __name__ == "__main__":
    main()
