"""conveyor.compat.quokka in Quokka's 2023 graph-API form: its lessons' programs, checked against pandas.

Each program is written anew after a tutorial of Quokka's apps/graph_api/tutorials (lesson0,
lesson1, lesson2.1, lesson2.2, crypto against a local HTTP server; the TPC-H ones are in test_compat_quokka_2023_tpch.py), in its
2023 form: `QuokkaContext`, `TaskGraph(qc)`, `TargetInfo` with sqlglot predicates, projections
and batch functions, placement strategies, `stage=`, readers of the 2023 protocol and results read
with `qc.dataset_manager.to_df.remote(dataset)`. The parts (predicates, routes, placement, stage
order) are checked on their own too.
"""

from __future__ import annotations

import datetime
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars
import pyarrow as pa
import pytest
import sqlglot
from pyspark.sql import SparkSession

from conveyor.compat.quokka import QuokkaContext, ray
from conveyor.compat.quokka.dataset import (
    InputDiskCSVDataset,
    InputDiskJSONDataset,
    InputParquetDataset,
    InputRestGetAPIDataset,
    InputRestPostAPIDataset,
)
from conveyor.compat.quokka.executors import CountExecutor, Executor, JoinExecutor, SQLAggExecutor
from conveyor.compat.quokka.placement_strategy import (
    CustomChannelsStrategy,
    SingleChannelStrategy,
    TaggedCustomChannelsStrategy,
    channel_count,
)
from conveyor.compat.quokka.predicates import polars_filter
from conveyor.compat.quokka.quokka_runtime import TaskGraph
from conveyor.compat.quokka.target_info import (
    BroadcastPartitioner,
    FunctionPartitioner,
    HashPartitioner,
    PassThroughPartitioner,
    RangePartitioner,
    TargetInfo,
    route,
)
from conveyor.compat.quokka.utils import LocalCluster
from conveyor.graph import GraphError

pytestmark = pytest.mark.timeout(300)


def everything(partitioner: Any, projection: list[str] | None = None) -> TargetInfo:
    """A TargetInfo that keeps every row, as the tutorials' plain edges."""
    return TargetInfo(partitioner=partitioner, predicate=sqlglot.exp.TRUE, projection=projection, batch_funcs=[])


# --- lesson 0: a reader of the 2023 protocol, an executor on pyarrow batches ----------------------------------


class Numbers:
    """The numbers below `limit`, channel c getting c, c + n, ...: one state (and one batch) per number."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def get_own_state(self, num_channels: int) -> dict[int, list[int]]:
        return {channel: list(range(channel, self.limit, num_channels)) for channel in range(num_channels)}

    def execute(self, channel: int, state: int) -> tuple[None, polars.DataFrame]:
        return None, polars.DataFrame({"number": [state]})


class Adder(Executor):
    def __init__(self) -> None:
        self.total: polars.DataFrame | None = None
        self.kinds: set[type] = set()

    def execute(self, batches: list[Any], stream_id: int, channel: int) -> None:
        for batch in batches:
            self.kinds.add(type(batch))
            frame = polars.from_arrow(batch)
            self.total = frame if self.total is None else self.total + frame

    def done(self, channel: int) -> polars.DataFrame | None:
        assert self.kinds == {pa.Table}, self.kinds  # 2023's executors got pyarrow Tables
        return self.total


def test_lesson0_a_reader_of_the_2023_protocol_sums_into_one_channel(spark: SparkSession) -> None:
    qc = QuokkaContext(LocalCluster())
    task_graph = TaskGraph(qc)
    numbers = task_graph.new_input_reader_node(Numbers(80))  # io_per_node (2) channels
    total = task_graph.new_blocking_node(
        {0: numbers},
        Adder(),
        placement_strategy=SingleChannelStrategy(),
        source_target_info={0: everything(PassThroughPartitioner())},
    )
    task_graph.create()
    task_graph.run()
    result = ray.get(qc.dataset_manager.to_df.remote(total))
    assert isinstance(result, polars.DataFrame)
    assert result["number"].to_list() == [sum(range(80))]
    assert task_graph.channels[numbers] == 2


# --- lessons 1 and 2: a hash join counted, CSV with a header line and JSON --------------------------------


@pytest.fixture(scope="module")
def join_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tutorials' a and b tables (key, two values each), as CSV with a header line and as JSON lines."""
    where = tmp_path_factory.mktemp("quokka-lessons")
    rng = np.random.default_rng(7)
    for name, rows in (("a", 1000), ("b", 700)):
        frame = pd.DataFrame(
            {
                f"key_{name}": rng.integers(0, 100, rows),
                f"val1_{name}": rng.normal(size=rows),
                f"val2_{name}": rng.normal(size=rows),
            }
        )
        frame.to_csv(where / f"{name}.csv", index=False)
        (where / f"{name}.json").write_text("".join(json.dumps(r) + "\n" for r in frame.to_dict(orient="records")))
    return where


def joined_rows(where: Path) -> int:
    a, b = pd.read_csv(where / "a.csv"), pd.read_csv(where / "b.csv")
    return len(a.merge(b, left_on="key_a", right_on="key_b"))


def count_join(task_graph: TaskGraph, a: Any, b: Any) -> Any:
    """The lessons' graph: a hash join of a and b on their keys, each side cut to its key, then counted."""
    joined = task_graph.new_non_blocking_node(
        {0: a, 1: b},
        JoinExecutor(left_on="key_a", right_on="key_b"),
        source_target_info={
            0: everything(HashPartitioner("key_a"), ["key_a"]),
            1: everything(HashPartitioner("key_b"), ["key_b"]),
        },
    )
    return task_graph.new_blocking_node(
        {0: joined},
        CountExecutor(),
        placement_strategy=SingleChannelStrategy(),
        source_target_info={0: everything(PassThroughPartitioner())},
    )


def test_lesson1_a_join_of_csv_files_with_header_lines_counted(spark: SparkSession, join_inputs: Path) -> None:
    qc = QuokkaContext(LocalCluster(), exec_per_node=2)
    task_graph = TaskGraph(qc)
    a = task_graph.new_input_reader_node(InputDiskCSVDataset(str(join_inputs / "a.csv"), header=True, stride=1024))
    b = task_graph.new_input_reader_node(InputDiskCSVDataset(str(join_inputs / "b.csv"), header=True, stride=1024))
    count = count_join(task_graph, a, b)
    task_graph.create()
    task_graph.run()
    assert ray.get(count.to_df.remote())["column_0"].to_list() == [joined_rows(join_inputs)]


def test_lesson2_json_lines_with_a_schema_and_json_joined_with_csv(spark: SparkSession, join_inputs: Path) -> None:
    schemas = {n: pa.schema([(f"key_{n}", pa.int64()), (f"val1_{n}", pa.float64()), (f"val2_{n}", pa.float64())]) for n in "ab"}
    task_graph = TaskGraph(LocalCluster())  # lesson 2's form: the cluster itself, 2023's node arguments
    a = task_graph.new_input_reader_node(InputDiskJSONDataset(str(join_inputs / "a.json"), schema=schemas["a"], stride=4096))
    b = task_graph.new_input_reader_node(InputDiskJSONDataset(str(join_inputs / "b.json"), schema=schemas["b"]))
    both_json = count_join(task_graph, a, b)
    task_graph.create()
    task_graph.run()
    assert both_json.to_df()["column_0"].to_list() == [joined_rows(join_inputs)]

    task_graph = TaskGraph(LocalCluster())  # lesson 2.2: JSON (types inferred) joined with CSV
    a = task_graph.new_input_reader_node(InputDiskJSONDataset(str(join_inputs / "a.json"), stride=4096))
    b = task_graph.new_input_reader_node(InputDiskCSVDataset(str(join_inputs / "b.csv"), header=True, stride=1024))
    mixed = count_join(task_graph, a, b)
    task_graph.run()
    assert mixed.to_df()["column_0"].to_list() == [joined_rows(join_inputs)]


def test_json_runs_cover_every_line_once_whatever_the_stride(tmp_path: Path) -> None:
    lines = [{"k": i, "s": "x" * (i % 13)} for i in range(500)]
    (tmp_path / "k.json").write_text("".join(json.dumps(r) + "\n" for r in lines))
    for stride in (1, 100, 4096, 1 << 20):
        reader = InputDiskJSONDataset(str(tmp_path / "k.json"), stride=stride, keys=["k"])
        states = reader.get_own_state(3)
        assert set(states) <= {0, 1, 2}
        keys = [k for c in sorted(states) for s in states[c] for k in reader.execute(c, s)[1].column("k").to_pylist()]
        assert keys == list(range(500))


# --- predicates, projections, batch functions, partitioners ----------------------------------------------


def test_predicates_translate_to_polars_as_sql_reads_them() -> None:
    frame = polars.DataFrame(
        {
            "d": [datetime.date(1994, 1, 1), datetime.date(1995, 6, 1), datetime.date(1998, 9, 3), None],
            "x": [0.05, 0.06, 0.08, 0.07],
            "n": [1, 24, 30, -2],
            "s": ["MAIL", "SHIP", "AIR", "special big requests"],
        }
    )

    def rows(sql: str) -> list[int]:
        kept = frame.with_row_index("i").filter(polars_filter(sqlglot.parse_one(sql)))
        return kept["i"].to_list()

    assert rows("d <= date '1998-09-02'") == [0, 1]
    assert rows("d between date '1994-01-01' and date '1994-12-31' and x between 0.05 and 0.07") == [0]
    assert rows("s in ('MAIL', 'SHIP') or n < -1") == [0, 1, 3]
    assert rows("s not in ('MAIL', 'SHIP')") == [2, 3]
    assert rows("not s::text like '%special%requests%'") == [0, 1, 2]
    assert rows("s like 'S_IP'") == [1]
    assert rows("s ilike 'mail'") == [0]
    assert rows("n * 2 + 1 > 40 / 2") == [1, 2]
    assert rows("(n % 2 = 0) and not n = 24") == [2, 3]
    assert rows("n = 1 and x = 0.05 or n = 30 and x = 0.08") == [0, 2]  # AND before OR (sqlglot < 25 parsed it left to right)
    assert rows("n = 1 and (x = 0.05 or n = 30) and x = 0.08") == []
    assert rows("d is null") == [3]
    assert rows("d is not null and d < date '1998-12-01' - interval '90' day") == [0, 1]
    assert rows("n <= -(-2)") == [0, 3]
    assert frame.filter(polars_filter(sqlglot.exp.TRUE)).height == 4
    assert frame.filter(polars_filter(None)).height == 4


def test_a_predicate_form_not_translated_is_an_error_naming_it_before_any_work(spark: SparkSession) -> None:
    with pytest.raises(GraphError, match=r"Exists .* is not supported"):
        polars_filter(sqlglot.parse_one("exists (select 1 from t)"))
    with pytest.raises(GraphError, match="must be a sqlglot expression"):
        polars_filter("x > 1")
    task_graph = TaskGraph(QuokkaContext())
    numbers = task_graph.new_input_reader_node(Numbers(10))
    bad = TargetInfo(PassThroughPartitioner(), sqlglot.parse_one("upper(s) = 'A'"), None, [])
    with pytest.raises(GraphError, match=r"new_blocking_node: stream 0: predicate .*Upper \(UPPER\(s\)\) is not supported"):
        task_graph.new_blocking_node({0: numbers}, Adder(), source_target_info={0: bad})
    with pytest.raises(GraphError, match="source_target_info must give a TargetInfo for each stream"):
        task_graph.new_blocking_node({0: numbers}, Adder(), source_target_info={})
    with pytest.raises(GraphError, match="is not a partitioner"):
        task_graph.new_blocking_node({0: numbers}, Adder(), source_target_info={0: TargetInfo("k", None, None, [])})


def test_a_target_info_filters_then_runs_batch_funcs_then_splits_and_projects_in_name_order() -> None:
    frame = pa.table({"k": [1, 2, 3, 4, 5, 6], "v": [10, 20, 30, 40, 50, 60], "b": ["x"] * 6})
    seen: list[list[str]] = []

    def add_w(df: polars.DataFrame) -> polars.DataFrame:
        seen.append(df.columns)
        return df.with_columns((df["v"] * 2).alias("w"))

    info = TargetInfo(HashPartitioner("k"), sqlglot.parse_one("v > 15"), ["w", "k"], [add_w])
    parts = dict(route(info, 1, 2, "edge")(frame, 0, 2))
    assert seen == [["k", "v", "b"]]  # the batch function sees the rows kept, every column
    assert {c: polars.from_arrow(p).to_dict(as_series=False) for c, p in parts.items()} == {
        0: {"k": [2, 4, 6], "w": [40, 80, 120]},
        1: {"k": [3, 5], "w": [60, 100]},
    }
    nothing = TargetInfo(BroadcastPartitioner(), sqlglot.parse_one("v > 100"), None, [])
    assert list(route(nothing, 1, 3, "edge")(frame, 0, 3)) == []  # empty batches are not sent
    every = dict(route(TargetInfo(BroadcastPartitioner(), None, None, []), 1, 3, "edge")(frame, 0, 3))
    assert sorted(every) == [0, 1, 2] and all(p.column_names == ["b", "k", "v"] for p in every.values())
    ranged = dict(route(TargetInfo(RangePartitioner("k", 6), None, ["k"], []), 1, 3, "edge")(frame, 0, 3))
    assert {c: p.column("k").to_pylist() for c, p in ranged.items()} == {0: [1, 2], 1: [3, 4], 2: [5, 6]}

    def odd_even(df: polars.DataFrame, source: int, n: int) -> dict[int, polars.DataFrame]:
        return {0: df.filter(polars.col("k") % 2 == 0), 1: df.filter(polars.col("k") % 2 == 1)}

    by_function = dict(route(TargetInfo(FunctionPartitioner(odd_even), None, ["k"], []), 1, 2, "edge")(frame, 0, 2))
    assert {c: p.column("k").to_pylist() for c, p in by_function.items()} == {0: [2, 4, 6], 1: [1, 3, 5]}
    passed = list(route(everything(PassThroughPartitioner()), 4, 2, "edge")(frame, 3, 2))
    assert [c for c, _ in passed] == [1]  # Quokka's default partition: source channel // ratio


def test_placement_strategies_count_channels_as_quokka_did() -> None:
    cluster = LocalCluster()
    qc = QuokkaContext(cluster, io_per_node=3, exec_per_node=2)
    assert channel_count(SingleChannelStrategy(), cluster, qc.io_per_node, "x") == 1
    assert channel_count(CustomChannelsStrategy(2), cluster, qc.io_per_node, "x") == 6
    assert channel_count(CustomChannelsStrategy(2), cluster, qc.exec_per_node, "x") == 4
    with pytest.raises(GraphError, match="no machine is tagged 'A'"):
        channel_count(TaggedCustomChannelsStrategy(1, "A"), cluster, 2, "x")
    cluster.tag_instance("localhost", "A")
    assert channel_count(TaggedCustomChannelsStrategy(1, "A"), cluster, 2, "x") == 2
    with pytest.raises(GraphError, match="not a placement strategy"):
        channel_count(3, cluster, 2, "x")
    qc.set_config("memory_limit", 0.01)
    assert qc.get_config("memory_limit") == 0.01
    with pytest.raises(GraphError, match="unknown key 'memory_limt'"):
        qc.set_config("memory_limt", 1)


# --- stage: lower stages are read to their end first -------------------------------------------------------


class StreamOrder(Executor):
    """Records the stream of each batch, in the order they arrive."""

    def __init__(self) -> None:
        self.order: list[int] = []

    def execute(self, batches: list[Any], stream_id: int, channel: int) -> None:
        self.order.extend(stream_id for _ in batches)

    def done(self, channel: int) -> polars.DataFrame:
        return polars.DataFrame({"stream": self.order, "seq": list(range(len(self.order)))})


def test_stage_orders_a_nodes_sources_lower_stages_first(spark: SparkSession) -> None:
    qc = QuokkaContext()
    task_graph = TaskGraph(qc)
    late = task_graph.new_input_reader_node(Numbers(30))  # stage 0, added first
    early = task_graph.new_input_reader_node(Numbers(20), stage=-1)
    middle = task_graph.new_input_reader_node(Numbers(10), stage=-1)
    order = task_graph.new_blocking_node(
        {0: late, 1: early, 2: middle},
        StreamOrder(),
        placement_strategy=SingleChannelStrategy(),
        source_target_info={s: everything(PassThroughPartitioner()) for s in range(3)},
    )
    task_graph.run()
    streams = order.to_df().sort("seq")["stream"].to_list()
    assert len(streams) == 60
    assert set(streams[:30]) == {1, 2} and set(streams[30:]) == {0}  # stage -1 to its end, then stage 0


def test_a_stage_order_the_levels_cannot_keep_is_an_error_naming_the_node(spark: SparkSession) -> None:
    task_graph = TaskGraph(QuokkaContext())
    first = task_graph.new_input_reader_node(Numbers(4), stage=5)
    second = task_graph.new_input_reader_node(Numbers(4), stage=1)
    relayed = task_graph.new_non_blocking_node(
        {0: first}, StreamOrder(), stage=0, source_target_info={0: everything(PassThroughPartitioner())}
    )
    task_graph.new_blocking_node(
        {0: relayed, 1: second},
        StreamOrder(),
        source_target_info={0: everything(PassThroughPartitioner()), 1: everything(PassThroughPartitioner())},
    )
    with pytest.raises(GraphError, match=r"stage 0 of source .* cannot be read to its end before stage 1"):
        task_graph.create()


# --- crypto.py: REST inputs, one request per argument ------------------------------------------------------


class ItemsAPI(BaseHTTPRequestHandler):
    """Items as JSON objects (`GET /item/<n>.json`; every seventh one missing), and rows by `POST /rpc`."""

    def do_GET(self) -> None:
        n = int(self.path.rsplit("/", 1)[-1].removesuffix(".json"))
        if n % 10 == 7:
            self.send_error(404)
            return
        item = {"by": f"user{n % 5}", "id": n, "title": f"story {n}", "score": n * 3, "time": 1_700_000_000 + n}
        if n % 2:
            item["url"] = f"https://example.com/{n}"
        self.reply(item)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.reply({"result": [{"block": body["block"], "tx": i} for i in range(3)]})

    def reply(self, value: Any) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Backlogged(ThreadingHTTPServer):
    request_queue_size = 256  # the requests of a run arrive at once


@pytest.fixture
def items_api() -> Iterator[str]:
    server = Backlogged(("127.0.0.1", 0), ItemsAPI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class Stack(Executor):
    """crypto.py's executor: every batch stacked."""

    def __init__(self) -> None:
        self.state: polars.DataFrame | None = None

    def execute(self, batches: list[Any], stream_id: int, channel: int) -> None:
        for batch in batches:
            frame = polars.from_arrow(batch)
            self.state = frame if self.state is None else self.state.vstack(frame)

    def done(self, channel: int) -> polars.DataFrame | None:
        return self.state


def test_crypto_rest_answers_read_by_channels_and_stacked(spark: SparkSession, items_api: str) -> None:
    columns = ["by", "id", "title", "url", "score", "time"]
    arguments = [f"{i}.json" for i in range(100)]
    for reader in (
        InputRestGetAPIDataset(items_api + "/item/", arguments, columns),  # the tutorial's call: the columns third
        InputRestGetAPIDataset(items_api + "/item/", arguments, projection=columns, batch_size=16),
    ):
        task_graph = TaskGraph(LocalCluster())
        items = task_graph.new_input_reader_node(reader)
        stacked = task_graph.new_blocking_node(
            {0: items},
            Stack(),
            placement_strategy=SingleChannelStrategy(),
            source_target_info={0: everything(PassThroughPartitioner())},
        )
        task_graph.create()
        task_graph.run()
        result = stacked.to_df().sort("id")
        assert result["id"].to_list() == [i for i in range(100) if i % 10 != 7]  # the missing ones left out
        assert sorted(result.columns) == sorted(columns)
        assert result.filter(polars.col("url").is_null())["id"].to_list() == [i for i in range(0, 100, 2) if i % 10 != 7]
    posted = InputRestPostAPIDataset(
        items_api + "/rpc", [{"block": b} for b in range(5)], projection=["block", "tx"], batch_size=2
    )
    states = posted.get_own_state(2)
    assert states == {0: [(0, 2), (4, 5)], 1: [(2, 4)]}
    frames = [posted.execute(c, s)[1] for c in sorted(states) for s in states[c]]
    assert sorted(polars.concat(frames).rows()) == [(b, t) for b in range(5) for t in range(3)]


def test_two_file_inputs_pass_through_to_one_channel(spark: SparkSession, join_inputs: Path) -> None:
    task_graph = TaskGraph(QuokkaContext())
    a = task_graph.new_input_reader_node(InputDiskCSVDataset(str(join_inputs / "a.csv"), header=True, stride=1024))
    b = task_graph.new_input_reader_node(InputDiskCSVDataset(str(join_inputs / "b.csv"), header=True, stride=1024))
    counted = task_graph.new_blocking_node(
        {0: a, 1: b},
        CountExecutor(),
        placement_strategy=SingleChannelStrategy(),
        source_target_info={0: everything(PassThroughPartitioner()), 1: everything(PassThroughPartitioner())},
    )
    task_graph.run()
    assert counted.to_df()["column_0"].to_list() == [1000 + 700]


def test_a_dataset_of_an_earlier_graph_is_an_input_of_a_later_one(spark: SparkSession) -> None:
    qc = QuokkaContext()
    first = TaskGraph(qc)
    numbers = first.new_input_reader_node(Numbers(50), placement_strategy=CustomChannelsStrategy(2))  # 4 channels
    kept = first.new_blocking_node(
        {0: numbers},
        Stack(),
        placement_strategy=CustomChannelsStrategy(3),  # 3 channels
        source_target_info={0: everything(HashPartitioner("number"))},
    )
    first.run()
    second = TaskGraph(qc)
    again = second.new_input_dataset_node(kept)
    total = second.new_blocking_node(
        {0: again},
        SQLAggExecutor([], None, "sum(number) as number"),
        placement_strategy=SingleChannelStrategy(),
        source_target_info={0: TargetInfo(PassThroughPartitioner(), sqlglot.parse_one("number % 2 = 0"), None, [])},
    )
    second.run()
    assert second.channels[again] == 3
    assert qc.dataset_manager.to_df(total)["number"].to_list() == [sum(range(0, 50, 2))]
    with pytest.raises(GraphError, match="expected what new_blocking_node of an earlier graph returned"):
        second.new_input_dataset_node(numbers)


class Kept:
    """Passes each batch on (a blocking node's output: every row the edge let through)."""

    def execute(self, batches: list[Any], stream_id: int, executor_id: int) -> Any:
        frames = [b if isinstance(b, polars.DataFrame) else polars.from_arrow(b) for b in batches]
        return polars.concat(frames) if frames else None

    def done(self, executor_id: int) -> None:
        return None


@pytest.mark.parametrize(
    "where",
    [
        "mode > 'MAIL'",  # in order: as strings, not as the dictionary's codes
        "mode in ('AIR', 'SHIP') or k < 10",
        "mode like 'A%'",  # a string function: decoded before the filter
        "mode = 'RAIL' and k between 100 and 20000",
    ],
)
def test_parquet_strings_read_as_dictionaries_filter_as_strings_and_arrive_as_strings(
    spark: SparkSession, tmp_path: Path, where: str
) -> None:
    rng = np.random.default_rng(7)
    n = 30000
    modes = rng.choice(np.array(["AIR", "MAIL", "RAIL", "SHIP", "TRUCK", None], dtype=object), n)
    frame = pd.DataFrame({"k": np.arange(n), "mode": modes, "note": [f"note {i}" for i in range(n)]})
    frame.to_parquet(tmp_path / "t.parquet", row_group_size=4000)

    def typed(df: polars.DataFrame) -> polars.DataFrame:  # what a batch function sees
        return df.with_columns(polars.lit(str(df.schema["mode"])).alias("mode_type"))

    task_graph = TaskGraph(QuokkaContext(exec_per_node=2))
    rows = task_graph.new_input_reader_node(InputParquetDataset(str(tmp_path / "t.parquet")))
    kept = task_graph.new_blocking_node(
        {0: rows},
        Kept(),
        placement_strategy=CustomChannelsStrategy(1),
        source_target_info={
            0: TargetInfo(HashPartitioner("k"), predicate=sqlglot.parse_one(where), projection=None, batch_funcs=[typed])
        },
    )
    task_graph.run()
    got = kept.to_df().to_pandas().sort_values("k", ignore_index=True)
    want = duckdb_rows(frame, where)
    assert set(got.mode_type) == {"String"}
    assert got.k.tolist() == want.k.tolist() and got["mode"].tolist() == want["mode"].tolist()


def duckdb_rows(frame: pd.DataFrame, where: str) -> pd.DataFrame:
    """The rows of `frame` that DuckDB's SQL keeps for `where`, by k."""
    import duckdb

    with duckdb.connect() as con:
        con.register("t", frame)
        return con.execute(f"select k, mode from t where {where} order by k").df()
