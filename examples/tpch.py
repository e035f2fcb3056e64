"""TPC-H helpers shared by the examples, the tests and the benchmark: data generation with
`tpchgen-cli`, the table layouts of its `.tbl` files, and the standard SQL of the queries used.

The examples import it as `tpch` (a script has examples/ on `sys.path`); the tests import it as
`examples.tpch` (their Spark tasks import the test modules from the repository root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# column name -> SQL type, in file order (.tbl lines end with a trailing "|")
TABLES: dict[str, dict[str, str]] = {
    "lineitem": {
        "l_orderkey": "BIGINT", "l_partkey": "BIGINT", "l_suppkey": "BIGINT", "l_linenumber": "BIGINT",
        "l_quantity": "DOUBLE", "l_extendedprice": "DOUBLE", "l_discount": "DOUBLE", "l_tax": "DOUBLE",
        "l_returnflag": "VARCHAR", "l_linestatus": "VARCHAR", "l_shipdate": "DATE", "l_commitdate": "DATE",
        "l_receiptdate": "DATE", "l_shipinstruct": "VARCHAR", "l_shipmode": "VARCHAR", "l_comment": "VARCHAR",
    },
    "orders": {
        "o_orderkey": "BIGINT", "o_custkey": "BIGINT", "o_orderstatus": "VARCHAR", "o_totalprice": "DOUBLE",
        "o_orderdate": "DATE", "o_orderpriority": "VARCHAR", "o_clerk": "VARCHAR", "o_shippriority": "BIGINT",
        "o_comment": "VARCHAR",
    },
    "customer": {
        "c_custkey": "BIGINT", "c_name": "VARCHAR", "c_address": "VARCHAR", "c_nationkey": "BIGINT",
        "c_phone": "VARCHAR", "c_acctbal": "DOUBLE", "c_mktsegment": "VARCHAR", "c_comment": "VARCHAR",
    },
    "part": {
        "p_partkey": "BIGINT", "p_name": "VARCHAR", "p_mfgr": "VARCHAR", "p_brand": "VARCHAR", "p_type": "VARCHAR",
        "p_size": "BIGINT", "p_container": "VARCHAR", "p_retailprice": "DOUBLE", "p_comment": "VARCHAR",
    },
    "supplier": {
        "s_suppkey": "BIGINT", "s_name": "VARCHAR", "s_address": "VARCHAR", "s_nationkey": "BIGINT",
        "s_phone": "VARCHAR", "s_acctbal": "DOUBLE", "s_comment": "VARCHAR",
    },
    "nation": {"n_nationkey": "BIGINT", "n_name": "VARCHAR", "n_regionkey": "BIGINT", "n_comment": "VARCHAR"},
    "region": {"r_regionkey": "BIGINT", "r_name": "VARCHAR", "r_comment": "VARCHAR"},
}  # fmt: skip


def names(table: str) -> list[str | None]:
    """Column names for `new_input_csv`, ending with the placeholder for the trailing delimiter."""
    return [*TABLES[table], None]


def tpchgen() -> str:
    """The tpchgen-cli executable (installed beside this interpreter, or on PATH)."""
    here = Path(sys.executable).parent / "tpchgen-cli"
    found = str(here) if here.exists() else shutil.which("tpchgen-cli")
    if not found:
        raise FileNotFoundError("tpchgen-cli is not installed: pip install tpchgen-cli")
    return found


def generate(scale: float, out_dir: str | os.PathLike[str], tables: tuple[str, ...] = ("lineitem", "orders", "customer")) -> Path:
    """Generate `.tbl` files at `scale` into `out_dir` (kept when already complete); returns the dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for table in tables:
        target = out / f"{table}.tbl"
        if target.exists() and target.stat().st_size > 0:
            continue
        subprocess.run([tpchgen(), "-s", str(scale), "-o", str(out), "-T", table, "--no-progress", "--overwrite"],
                       check=True, capture_output=True)  # fmt: skip
    return out


def spark_ddl(table: str) -> str:
    """The Spark SQL schema of a .tbl file (with its trailing empty field)."""
    types = {"VARCHAR": "STRING"}
    cols = [f"{n} {types.get(t, t)}" for n, t in TABLES[table].items()]
    return ", ".join([*cols, "_trailing STRING"])


def duckdb_columns(table: str) -> str:
    """The `columns=` struct of DuckDB's read_csv for a .tbl file."""
    cols = [f"'{n}': '{t}'" for n, t in TABLES[table].items()]
    return "{" + ", ".join([*cols, "'_trailing': 'VARCHAR'"]) + "}"


def to_parquet(data_dir: str | os.PathLike[str], tables: tuple[str, ...]) -> Path:
    """`<table>.parquet` beside each `<table>.tbl` of `data_dir` (kept when already there), written by DuckDB."""
    import duckdb

    out = Path(data_dir)
    for table in tables:
        target = out / f"{table}.parquet"
        if target.exists() and target.stat().st_size > 0:
            continue
        source = f"read_csv('{out / f'{table}.tbl'}', delim='|', header=false, columns={duckdb_columns(table)})"
        duckdb.connect().execute(
            f"copy (select * exclude (_trailing) from {source}) to '{target}' (format parquet, row_group_size 122880)"
        )
    return out


QUERIES: dict[str, str] = {
    "q1": """
        select l_returnflag, l_linestatus, sum(l_quantity) as sum_qty, sum(l_extendedprice) as sum_base_price,
               sum(l_extendedprice * (1 - l_discount)) as sum_disc_price,
               sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge,
               avg(l_quantity) as avg_qty, avg(l_extendedprice) as avg_price, avg(l_discount) as avg_disc,
               count(*) as count_order
        from lineitem where l_shipdate <= date '1998-12-01' - interval '90' day
        group by l_returnflag, l_linestatus order by l_returnflag, l_linestatus""",
    "q3": """
        select l_orderkey, sum(l_extendedprice * (1 - l_discount)) as revenue, o_orderdate, o_shippriority
        from customer, orders, lineitem
        where c_mktsegment = 'BUILDING' and c_custkey = o_custkey and l_orderkey = o_orderkey
          and o_orderdate < date '1995-03-15' and l_shipdate > date '1995-03-15'
        group by l_orderkey, o_orderdate, o_shippriority
        order by revenue desc, o_orderdate limit 10""",
    "q6": """
        select sum(l_extendedprice * l_discount) as revenue from lineitem
        where l_shipdate >= date '1994-01-01' and l_shipdate < date '1995-01-01'
          and l_discount between 0.05 and 0.07 and l_quantity < 24""",
    "q12": """
        select l_shipmode,
               sum(case when o_orderpriority = '1-URGENT' or o_orderpriority = '2-HIGH' then 1 else 0 end) as high_line_count,
               sum(case when o_orderpriority <> '1-URGENT' and o_orderpriority <> '2-HIGH' then 1 else 0 end) as low_line_count
        from orders, lineitem
        where o_orderkey = l_orderkey and l_shipmode in ('MAIL', 'SHIP') and l_commitdate < l_receiptdate
          and l_shipdate < l_commitdate and l_receiptdate >= date '1994-01-01' and l_receiptdate < date '1995-01-01'
        group by l_shipmode order by l_shipmode""",
}  # fmt: skip
