"""conveyor.compat.quokka: Quokka's programs of 2022, with only their imports changed, on Spark.

The TPC-H apps (examples/quokka_tpch.py: Q3, Q6, Q8 and Q12 as Quokka's apps wrote them, on CSV
and on Parquet) are checked against DuckDB at scale factor 0.1; the graph-API tutorials' shapes
(a reader of the user's own yielding numbers, a join counted, `TaskGraph(cluster)` with
`partition_key_supplied` and Quokka's default partition) and the word count app against plain
Python. Each program here is written anew after the apps in Quokka's repository.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import polars
import pyarrow as pa
import pyarrow.compute as compute
import pytest
from pyspark.sql import SparkSession

from conveyor.compat.quokka import LocalCluster, TaskGraph, ray
from conveyor.compat.quokka.dataset import InputDiskCSVDataset, InputMultiCSVDataset
from conveyor.compat.quokka.executors import (
    CountExecutor,
    Executor,
    GroupAsOfJoinExecutor,
    LimitExecutor,
    PolarJoinExecutor,
    StorageExecutor,
)
from conveyor.compat.quokka.frames import concat, received, to_transit
from conveyor.compat.quokka.partitions import ByColumn, ByRatio, PerTarget
from conveyor.compat.quokka.sql import AggExecutor
from conveyor.graph import GraphError
from tests.support.graph_helpers import assert_frames_close, example

pytestmark = pytest.mark.timeout(300)

quokka_tpch = example("quokka_tpch")  # loaded as the script runs: its functions travel to Spark by value


@pytest.fixture(scope="module")
def tpch_sf01(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("quokka-tpch-sf0.1")
    return Path(quokka_tpch.prepare(str(data), sorted(quokka_tpch.QUERIES), "parquet", 0.1))


def duckdb_of(query: str, data_dir: Path) -> pd.DataFrame:
    import duckdb
    from examples.tpch import TABLES, duckdb_columns

    con = duckdb.connect()
    for table in TABLES:
        path = data_dir / f"{table}.tbl"
        if path.exists():
            source = f"read_csv('{path}', delim='|', header=false, columns={duckdb_columns(table)})"
            con.execute(f"create view {table} as select * from {source}")
    frame: pd.DataFrame = con.execute(quokka_tpch.SQL[query]).df()
    return frame


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("query", ["q3", "q6", "q8", "q12"])
def test_quokkas_tpch_apps_give_duckdbs_answers(spark: SparkSession, tpch_sf01: Path, query: str, fmt: str) -> None:
    result = quokka_tpch.QUERIES[query](str(tpch_sf01), fmt, 2)
    expected = duckdb_of(query, tpch_sf01)
    ours = quokka_tpch.flat(query, result)
    assert len(expected) > 0
    if query == "q3":  # the app's groupby keys came back as the index, with their types
        ours["o_orderdate"] = pd.to_datetime(ours["o_orderdate"])
        expected["o_orderdate"] = pd.to_datetime(expected["o_orderdate"])
    assert_frames_close(ours, expected, rtol=1e-6)


class NumbersDataset:
    """The tutorial's reader of its own: the numbers below `limit`, channel c reading c, c + n, c + 2n, ..."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.num_channels: int | None = None

    def set_num_channels(self, num_channels: int) -> None:
        self.num_channels = num_channels

    def get_next_batch(self, channel: int, pos: Any = None) -> Iterator[tuple[None, int]]:
        assert self.num_channels is not None
        number = channel
        while number < self.limit:
            yield None, number
            number += self.num_channels


class AddExecutor(Executor):
    def __init__(self) -> None:
        self.sum = 0

    def execute(self, batches: list[Any], stream_id: int, channel: int) -> None:
        for batch in batches:
            assert type(batch) is int  # batches are whatever the reader yields
            self.sum += batch

    def done(self, channel: int) -> int:
        return self.sum


def test_a_reader_of_the_users_own_feeds_numbers_through_the_default_partition(spark: SparkSession) -> None:
    cluster = LocalCluster(cpu_count=4)
    task_graph = TaskGraph(cluster)
    numbers = task_graph.new_input_reader_node(NumbersDataset(80))  # cpu_count channels
    total = task_graph.new_blocking_node({0: numbers}, AddExecutor())  # one channel, Quokka's default partition
    task_graph.create()
    task_graph.run()
    assert total.to_list() == [sum(range(80))]
    assert total.to_dict() == {0: [sum(range(80))]}


def test_a_join_counted_and_a_limit_in_the_later_forms(spark: SparkSession, tmp_path: Path) -> None:
    a = pd.DataFrame({"key": [i % 50 for i in range(400)], "val1": range(400), "val2": range(400)})
    b = pd.DataFrame({"key": [i % 70 for i in range(300)], "val1": range(300), "val2": range(300)})
    a.to_csv(tmp_path / "a.csv", header=False, index=False)
    b.to_csv(tmp_path / "b.csv", header=False, index=False)
    cluster = LocalCluster()
    task_graph = TaskGraph(cluster)
    left = task_graph.new_input_reader_node(
        InputDiskCSVDataset(str(tmp_path / "a.csv"), ["key", "val1", "val2"], stride=1024), {"localhost": 3}
    )
    right = task_graph.new_input_reader_node(
        InputDiskCSVDataset(str(tmp_path / "b.csv"), ["key", "val1", "val2"], stride=1024), {"localhost": 3}
    )
    join = PolarJoinExecutor(on="key")
    joined = task_graph.new_non_blocking_node(
        {0: left, 1: right}, join, ip_to_num_channel={"localhost": 3}, partition_key_supplied={0: "key", 1: "key"}
    )
    count = task_graph.new_blocking_node(
        {0: joined}, CountExecutor(), ip_to_num_channel={cluster.leader_private_ip: 1}, partition_key_supplied={0: None}
    )
    first = task_graph.new_blocking_node({0: left}, LimitExecutor(5), partition_key_supplied={0: None})
    task_graph.create()
    task_graph.run()
    counted = count.to_list()
    assert len(counted) == 1 and counted[0].item() == len(a.merge(b, on="key"))
    assert len(first.to_pandas()) == 5


def test_the_word_count_app_adds_partial_counts_by_their_index(spark: SparkSession, tmp_path: Path) -> None:
    text = ["the quick brown fox", "jumps over the lazy dog", "the dog sleeps", "a fox and a dog"] * 50
    (tmp_path / "in").mkdir()
    for i in range(4):
        (tmp_path / "in" / f"part-{i}.txt").write_text("\n".join(text[i::4]) + "\n")

    def udf2(x: pa.Table) -> pd.DataFrame:
        words = compute.list_flatten(compute.ascii_split_whitespace(x["text"]))
        counts = words.value_counts().flatten()
        return pa.Table.from_arrays([counts[0], counts[1]], names=["word", "count"]).to_pandas().set_index("word")

    def partition_key1(data: Any, source_channel: int, target_channel: int) -> Any:
        return data if source_channel // 4 == target_channel else None

    task_graph = TaskGraph()
    reader = InputMultiCSVDataset(str(tmp_path / "in"), None, ["text"], sep="|", stride=1024)
    words = task_graph.new_input_reader_node(reader, {"localhost": 4, "10.0.0.2": 4}, batch_func=udf2)
    agg = AggExecutor(fill_value=0)
    intermediate = task_graph.new_non_blocking_node({0: words}, None, agg, {"localhost": 1, "10.0.0.2": 1}, {0: partition_key1})
    result = task_graph.new_blocking_node({0: intermediate}, None, agg, {"localhost": 1}, {0: None})
    task_graph.create()
    task_graph.run_with_fault_tolerance()
    counts = ray.get(result.to_pandas.remote())
    expected = Counter(w for line in text for w in line.split())
    assert {w: int(n) for w, n in counts["count"].items()} == dict(expected)


class ForeignExecutor:
    """An executor of no base class of ours (as one loaded from Quokka's own module would be)."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def execute(self, batches: list[Any], stream_id: int, executor_id: int) -> Any:
        assert isinstance(batches, list)
        for batch in batches:
            self.seen.append(len(batch))
        return polars.concat(batches)

    def done(self, executor_id: int) -> None:
        assert self.seen, f"channel {executor_id} got no batch"


def test_any_object_with_quokkas_methods_is_an_executor_and_others_are_refused(spark: SparkSession, tmp_path: Path) -> None:
    pd.DataFrame({"k": range(100)}).to_csv(tmp_path / "k.csv", header=False, index=False)
    task_graph = TaskGraph()
    source = task_graph.new_input_reader_node(InputDiskCSVDataset(str(tmp_path / "k.csv"), ["k"], stride=1024), {"localhost": 2})
    passed = task_graph.new_non_blocking_node({0: source}, None, ForeignExecutor(), {"localhost": 2}, {0: "k"})
    stored = task_graph.new_blocking_node({0: passed}, None, StorageExecutor(), {"localhost": 1}, {0: None})
    with pytest.raises(GraphError, match="not an executor"):
        task_graph.new_blocking_node({0: source}, None, object(), {"localhost": 1}, {0: None})
    with pytest.raises(GraphError, match="no partition key"):
        task_graph.new_blocking_node({0: source}, None, StorageExecutor(), {"localhost": 1}, {})
    with pytest.raises(GraphError, match="multiple"):
        task_graph.new_blocking_node({0: source}, StorageExecutor(), ip_to_num_channel={"localhost": 3})
    task_graph.create()
    task_graph.run()
    frame = stored.to_pandas()
    assert sorted(frame["k"].to_list()) == list(range(100))  # every row once, through both channels


def test_a_missing_partition_column_is_an_error_naming_the_edge(spark: SparkSession, tmp_path: Path) -> None:
    pd.DataFrame({"k": range(10)}).to_csv(tmp_path / "k.csv", header=False, index=False)
    task_graph = TaskGraph()
    source = task_graph.new_input_reader_node(InputDiskCSVDataset(str(tmp_path / "k.csv"), ["k"]), {"localhost": 1})
    task_graph.new_blocking_node({0: source}, None, StorageExecutor(), {"localhost": 2}, {0: "nope"})
    with pytest.raises(Exception, match=r"->.*: the partition function raised KeyError: .*'nope' is not in the batch"):
        task_graph.run()


def test_a_column_routes_rows_of_every_frame_kind_alike_and_the_default_partition_follows_quokka() -> None:
    frame = pd.DataFrame({"k": [0, 1, 2, 3, 4, 5, -1], "s": list("abcdefg")}, index=pd.Index(range(10, 17), name="i"))
    by_k = ByColumn("k")
    parts = dict(by_k(frame, 0, 3))
    assert {c: p["k"].tolist() for c, p in parts.items()} == {0: [0, 3], 1: [1, 4], 2: [2, 5, -1]}
    assert parts[0].index.tolist() == [10, 13]  # pandas rows keep their index
    as_polars = {c: p["k"].to_list() for c, p in by_k(polars.from_pandas(frame), 0, 3)}
    as_arrow = {c: p.column("k").to_pylist() for c, p in by_k(pa.Table.from_pandas(frame), 0, 3)}
    assert as_polars == as_arrow == {c: p["k"].tolist() for c, p in parts.items()}
    by_s = ByColumn("s")  # strings: a stable hash, the same for every frame kind
    assert {c: sorted(p["s"]) for c, p in by_s(frame, 0, 4)} == {
        c: sorted(p["s"].to_list()) for c, p in by_s(polars.from_pandas(frame.reset_index()), 0, 4)
    }
    with pytest.raises(TypeError, match="give a partition function"):
        list(by_k(42, 0, 2))
    assert list(PerTarget(lambda d, s, t: d if t == s // 2 else None)("x", 3, 4)) == [(1, "x")]
    assert list(ByRatio(4, 2)("x", 3, 2)) == [(1, "x")]  # source // ratio
    spread = ByRatio(2, 4)
    assert [next(iter(spread("x", 1, 4)))[0] for _ in range(4)] == [3, 2, 3, 2]  # channels 2..3 in turn
    with pytest.raises(GraphError, match="multiple"):
        ByRatio(3, 2)


def test_polars_travels_as_arrow_and_arrives_as_polars_and_batches_concatenate_by_kind() -> None:
    pushed = received(to_transit(polars.DataFrame({"a": [1, 2]})))
    assert isinstance(pushed, polars.DataFrame) and pushed["a"].to_list() == [1, 2]
    assert isinstance(received(pa.table({"a": [1]})), polars.DataFrame)  # a Table pushed arrives as polars, as in Quokka
    assert to_transit(7) == received(7) == 7
    assert concat([pd.DataFrame({"a": [1]}), pd.DataFrame({"a": [2]})])["a"].tolist() == [1, 2]
    assert concat([pushed, pushed])["a"].to_list() == [1, 2, 1, 2]


def test_the_as_of_join_tutorial_reads_files_with_a_header_and_matches_polars(spark: SparkSession, tmp_path: Path) -> None:
    symbols = ["AAPL", "MSFT", "IBM"]
    quotes = pd.DataFrame(
        {
            "time": range(0, 3000, 3),
            "symbol": [symbols[i % 3] for i in range(1000)],
            "bid": [i * 0.5 for i in range(1000)],
            "ask": [i * 0.5 + 1 for i in range(1000)],
        }
    )
    trades = pd.DataFrame({"time": range(1, 3001, 5), "symbol": [symbols[i % 2] for i in range(600)], "size": range(600)})
    quotes.to_csv(tmp_path / "quotes.csv", index=False)  # with their header lines, as the tutorial's files
    trades.to_csv(tmp_path / "trades.csv", index=False)
    task_graph = TaskGraph(LocalCluster())
    quote_reader = InputDiskCSVDataset(
        str(tmp_path / "quotes.csv"), ["time", "symbol", "bid", "ask"], stride=1024 * 5, header=True
    )
    trades_reader = InputDiskCSVDataset(str(tmp_path / "trades.csv"), ["time", "symbol", "size"], stride=1024 * 5, header=True)
    quotes_node = task_graph.new_input_reader_node(quote_reader)
    trades_node = task_graph.new_input_reader_node(trades_reader)
    join_executor = GroupAsOfJoinExecutor(group_on="symbol", on="time")
    output = task_graph.new_blocking_node(
        {0: trades_node, 1: quotes_node}, join_executor, partition_key_supplied={0: "symbol", 1: "symbol"}
    )
    task_graph.create()
    task_graph.run()
    result = output.to_pandas()
    reference = polars.from_pandas(trades).join_asof(polars.from_pandas(quotes), by="symbol", on="time").drop_nulls()
    assert len(result) == len(reference) > 0
    assert int(result["size"].sum()) == int(reference["size"].sum())
    assert float(result["bid"].sum()) == float(reference["bid"].sum())
