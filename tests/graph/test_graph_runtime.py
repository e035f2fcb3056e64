"""How the runtime moves batches.

Routing to channels, dependency order, stream order, readers, early termination (a limit stops
reading its input), and batches of any type (a reader of the user's own, Routers, executors of
`batch_format = "object"`).

The runtime is `conveyor.graph.runtime`; what runs inside the Spark tasks, `conveyor.graph.stages`,
over the rows of `conveyor.graph.layout`.
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from examples.tpch import names
from pyspark.sql import SparkSession

from conveyor import Executor, TaskGraph
from conveyor.graph import Count, FilterProject, GraphError, HashJoin, Limit, Router, Sort
from conveyor.graph.channels import stable_hash
from conveyor.graph.readers import parquet_reader


class Recorder(Executor):
    """Emits, for every row it sees, the channel, stream, arrival number and the row's key."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.seen = 0

    def execute(self, batch: pa.Table, stream_id: Hashable, channel: int) -> pd.DataFrame:
        self.seen += 1
        keys = batch.column(self.key).to_pylist()
        return pd.DataFrame({"channel": channel, "stream": str(stream_id), "arrival": self.seen, "key": keys})


@pytest.fixture
def numbers(tmp_path: Path) -> Path:
    path = tmp_path / "numbers.csv"
    path.write_text("".join(f"{i},w{i % 11},{i * 0.5}\n" for i in range(5000)))
    return path


def test_routing_by_integer_string_callable_and_broadcast(spark: SparkSession, numbers: Path) -> None:
    g = TaskGraph(spark)
    src = g.new_input_csv(numbers, ["n", "word", "half"], 2, stride=16 * 1024, name="numbers")
    by_int = g.new_blocking_node({0: src}, Recorder("n"), 3, {0: "n"})
    by_str = g.new_blocking_node({0: src}, Recorder("word"), 3, {0: "word"})
    by_fn = g.new_blocking_node({0: src}, Recorder("n"), 4, {0: lambda batch, n: np.asarray(batch.column("n")) // 10 % n})
    everywhere = g.new_blocking_node({0: src}, Recorder("n"), 3, {0: None})
    g.run()
    ints = by_int.to_pandas()
    assert sorted(ints.key) == list(range(5000)) and (ints.key % 3 == ints.channel).all()
    words = by_str.to_pandas()
    expected = stable_hash(pa.array(words.key)) % np.uint64(3)  # hashed here, in another process than the tasks
    assert (expected.astype(np.int64) == words.channel.to_numpy()).all() and words.channel.nunique() > 1
    fn = by_fn.to_pandas()
    assert (fn.key // 10 % 4 == fn.channel).all() and len(fn) == 5000
    wide = everywhere.to_pandas()
    assert len(wide) == 3 * 5000 and all(sorted(g_.key) == list(range(5000)) for _, g_ in wide.groupby("channel"))


def test_stable_hash_is_pinned() -> None:
    # the documented hash (pandas.util.hash_array, SipHash-2-4, fixed key): a change here re-routes data
    assert stable_hash(pa.array(["a", "b", None])).tolist() == [
        int(pd.util.hash_array(np.array(["a"], dtype=object))[0]),
        int(pd.util.hash_array(np.array(["b"], dtype=object))[0]),
        0,
    ]
    assert int(pd.util.hash_array(np.array(["MAIL"], dtype=object))[0]) == 5726641970519379524


def test_dependents_order_build_before_probe_and_keep_stream_order(spark: SparkSession, tmp_path: Path) -> None:
    left = tmp_path / "left.csv"
    right = tmp_path / "right.csv"
    left.write_text("".join(f"{i}\n" for i in range(3000)))
    right.write_text("".join(f"{i}\n" for i in range(3000, 9000)))
    g = TaskGraph(spark)
    a = g.new_input_csv(left, ["k"], 2, stride=4096, name="build")
    b = g.new_input_csv(right, ["k"], 2, stride=4096, dependents=[a], name="probe")
    out = g.new_blocking_node({"a": a, "b": b}, lambda: Recorder("k"), 2, {"a": "k", "b": "k"})  # a factory
    g.run()
    seen = out.to_pandas()
    for _, rows in seen.groupby("channel"):
        rows = rows.sort_values(["arrival"], kind="stable")
        streams = rows.stream.tolist()
        assert streams == sorted(streams)  # every "a" batch before any "b" batch
        for _, part in rows.groupby("stream"):
            assert part.key.is_monotonic_increasing  # each stream arrives in file order


def test_parquet_and_spark_readers_agree(spark: SparkSession, tmp_path: Path, tpch_sf001: Path) -> None:
    table = pa.table({"k": np.arange(20000), "v": np.arange(20000) % 7, "s": [f"x{i % 5}" for i in range(20000)]})
    (tmp_path / "t").mkdir()  # a directory of two files, and a marker file both readers skip
    pq.write_table(table.slice(0, 12000), tmp_path / "t" / "part-0.parquet", row_group_size=3000)
    pq.write_table(table.slice(12000), tmp_path / "t" / "part-1.parquet", row_group_size=3000)
    (tmp_path / "t" / "_SUCCESS").write_text("")
    results = {}
    for reader in ("auto", "spark"):
        g = TaskGraph(spark, file_reader=reader)
        pqin = g.new_input_parquet(tmp_path / "t", 2, columns=["k", "v"], filters=[("v", "=", 3)])
        pq_out = g.new_blocking_node({0: pqin}, FilterProject(), 2, {0: "k"})
        csvin = g.new_input_csv(tpch_sf001 / "orders.tbl", names("orders"), 2, sep="|", columns=["o_orderkey", "o_orderdate"])
        csv_out = g.new_blocking_node({0: csvin}, Count(), 1, {0: None})
        stats = g.run()
        results[reader] = (pq_out.to_pandas().sort_values("k", ignore_index=True), csv_out.to_pandas(), stats)
        assert pq_out.to_arrow().schema.names == ["k", "v"]
    assert results["auto"][0].equals(results["spark"][0])
    assert results["auto"][0].k.tolist() == list(range(3, 20000, 7))
    assert results["auto"][1]["count"].tolist() == results["spark"][1]["count"].tolist() == [15000]


def test_parquet_strings_of_few_values_are_read_as_dictionaries_and_come_decoded(spark: SparkSession, tmp_path: Path) -> None:
    n = 30000
    modes = pa.array(np.random.default_rng(5).choice(np.array(["AIR", "MAIL", "SHIP", None]), n), pa.string())
    comments = pa.array([f"comment number {i}" for i in range(n)], pa.large_string())  # all distinct: no small dictionary
    table = pa.table({"k": np.arange(n), "mode": modes, "comment": comments})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=4000)
    reader = parquet_reader("t", pafs.LocalFileSystem(), [str(tmp_path / "t.parquet")], None, None)
    assert reader.dictionary == {"mode"}
    g = TaskGraph(spark)
    src = g.new_input_parquet(tmp_path / "t.parquet", 2, filters=pc.field("mode").isin(["AIR", "SHIP"]) | (pc.field("k") < 5))
    out = g.new_blocking_node({0: src}, FilterProject(), 2, {0: "k"})
    g.run()
    got = out.to_arrow().sort_by("k")
    want = pq.read_table(tmp_path / "t.parquet", filters=pc.field("mode").isin(["AIR", "SHIP"]) | (pc.field("k") < 5))
    # the columns keep the file's types (no dictionary reaches a node) and the rows the plain read's values
    assert got.schema.field("mode").type == pa.string() and got.schema.field("comment").type == pa.large_string()
    assert got.select(["k", "mode", "comment"]).equals(want.select(["k", "mode", "comment"]))


def test_parquet_without_batch_func_is_read_in_its_one_channel_consumer(spark: SparkSession, tmp_path: Path) -> None:
    table = pa.table({"k": np.arange(20000), "v": np.arange(20000) % 7})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=3000)
    answers = {}
    for name, func in (("plain", None), ("with_func", lambda df: df)):
        g = TaskGraph(spark)
        src = g.new_input_parquet(tmp_path / "t.parquet", 2, columns=["k"], filters=[("v", "=", 3)], batch_func=func, name=name)
        out = g.new_blocking_node({0: src}, FilterProject(), 1, {0: "k"})
        stats = g.run()
        # without a batch function its rows would only be moved: they are read where they are consumed
        assert stats.fused_inputs == ([name] if func is None else [])
        answers[name] = out.to_pandas().k.tolist()
    assert answers["plain"] == answers["with_func"] == list(range(3, 20000, 7))


def test_file_inputs_read_in_one_stage_route_by_their_own_channels(spark: SparkSession, tmp_path: Path) -> None:
    # two inputs of 4 row groups each, read by 2 channels each (row groups 0-1 and 2-3) in the one
    # Spark stage that feeds their consumer: each must see its own channel, not its task's place in the stage
    for name, first in (("a", 0), ("b", 10000)):
        pq.write_table(pa.table({"k": np.arange(first, first + 4000)}), tmp_path / f"{name}.parquet", row_group_size=1000)
    g = TaskGraph(spark)
    a = g.new_input_parquet(tmp_path / "a.parquet", 2, name="a")
    b = g.new_input_parquet(tmp_path / "b.parquet", 2, name="b")
    same_channel = Router(lambda value, source, n: [(source, value)])
    out = g.new_blocking_node({"a": a, "b": b}, Recorder("k"), 2, {"a": same_channel, "b": same_channel})
    stats = g.run()
    seen = out.to_pandas()
    assert stats.fused_inputs == [] and len(seen) == 8000
    assert (seen.channel == seen.key % 10000 // 2000).all()


def test_parquet_row_groups_a_channel_reads_arrive_merged_in_order(spark: SparkSession, tmp_path: Path) -> None:
    pq.write_table(pa.table({"k": np.arange(40000)}), tmp_path / "t.parquet", row_group_size=1000)
    g = TaskGraph(spark)
    src = g.new_input_parquet(tmp_path / "t.parquet", 2, batch_func=lambda df: df)  # read by 2 tasks, not fused
    out = g.new_blocking_node({0: src}, Recorder("k"), 1, {0: None})
    g.run()
    seen = out.to_pandas()
    # each channel's 20 row groups come as one batch (the work downstream is per batch), in file order
    assert seen.arrival.nunique() == 2 and seen.key.tolist() == list(range(40000))


def test_one_channel_nodes_run_in_their_one_channel_consumers_task_in_level_order(spark: SparkSession, tmp_path: Path) -> None:
    pq.write_table(pa.table({"k": np.arange(3000), "v": np.arange(3000) % 7}), tmp_path / "build.parquet", row_group_size=500)
    pq.write_table(pa.table({"k": np.arange(0, 6000, 2)}), tmp_path / "probe.parquet", row_group_size=500)
    g = TaskGraph(spark)
    build = g.new_input_parquet(tmp_path / "build.parquet", 2, batch_func=lambda df: df, name="build")
    probe = g.new_input_parquet(tmp_path / "probe.parquet", 2, batch_func=lambda df: df, dependents=[build], name="probe")
    kept = g.new_non_blocking_node({0: build}, FilterProject(pc.field("v") != 3), 1, {0: None}, name="kept")
    # emits everything at its end: its done() must come before the probe side (of a higher level) arrives
    ordered = g.new_non_blocking_node({0: kept}, Sort("k"), 1, {0: None}, name="ordered")
    joined = g.new_non_blocking_node({0: ordered, 1: probe}, HashJoin("k", build=0), 1, {0: "k", 1: "k"}, name="joined")
    out = g.new_blocking_node({0: joined}, Count(), 1, {0: None})
    stats = g.run()
    assert stats.chained_nodes == ["kept", "ordered", "joined"]  # one Spark task runs them all
    assert out.to_pandas()["count"].tolist() == [len([k for k in range(0, 3000, 2) if k % 7 != 3])]


class Pids(Executor):
    """Passes its batches on with a column of the process id of the Python worker that ran it."""

    def execute(self, batch: pa.Table, stream_id: Hashable, channel: int) -> pa.Table:
        return batch.append_column(f"pid{batch.num_columns}", pa.array([os.getpid()] * batch.num_rows, pa.int64()))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states in /proc")
def test_a_task_that_reads_all_its_inputs_keeps_its_python_worker(spark: SparkSession, tmp_path: Path) -> None:
    pq.write_table(pa.table({"k": np.arange(1000)}), tmp_path / "t.parquet", row_group_size=100)
    g = TaskGraph(spark)
    src = g.new_input_parquet(tmp_path / "t.parquet", 1)
    first = g.new_non_blocking_node({0: src}, Pids(), 1, {0: None})  # its input is read in its task
    last = g.new_blocking_node({0: first}, Pids(), 1, {0: None})
    stats = g.run()
    out = last.to_pandas()
    assert stats.fused_inputs == ["parquet0"] and sorted(out.k) == list(range(1000))
    # Spark stops a Python worker whose task left input unread (the placeholder row) when the task
    # ends, and starts another (~0.5 s) for the next stage; one that read it all waits for more work
    (pid,) = set(out.pid1)
    state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    assert state != "Z"


def test_limit_stops_reading_early(spark: SparkSession, tpch_sf001: Path) -> None:
    path = tpch_sf001 / "lineitem.tbl"
    stride = 128 * 1024  # ~57 splits of one batch each
    g = TaskGraph(spark)
    everything = g.new_input_csv(path, names("lineitem"), 2, sep="|", stride=stride, name="all")
    total = g.new_blocking_node({0: everything}, Count(), 1, {0: None})
    read_all = g.run().batches_read["all"]
    g = TaskGraph(spark)
    few = g.new_input_csv(path, names("lineitem"), 2, sep="|", stride=stride, name="few")
    first = g.new_blocking_node({0: few}, Limit(5), 1, {0: None})
    stats = g.run()
    assert total.to_pandas()["count"].tolist() == [60175]
    assert read_all >= 50 and stats.batches_read["few"] == 1 and stats.fused_inputs == ["few"]
    rows = first.to_pandas()
    with open(path) as f:
        head = [next(f).split("|") for _ in range(5)]
    assert rows.l_orderkey.tolist() == [int(r[0]) for r in head] and rows.l_comment.tolist() == [r[15] for r in head]


class Countdown:
    """A SourceReader: channel c yields the numbers c, c + n, ... below `limit`, as plain ints."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def read(self, channel: int, n_channels: int) -> range:
        return range(channel, self.limit, n_channels)


class Collect(Executor):
    """An executor of any batches: keeps the ints it gets, emits their sum and the channel's list at the end."""

    batch_format = "object"

    def __init__(self) -> None:
        self.got: list[int] = []

    def execute(self, batch: object, stream_id: Hashable, channel: int) -> None:
        assert type(batch) is int
        self.got.append(batch)

    def done(self, channel: int) -> object:
        return {"channel": channel, "numbers": sorted(self.got)}


def test_batches_of_any_type_travel_by_routers_and_come_back_as_they_were(spark: SparkSession) -> None:
    g = TaskGraph(spark)
    numbers = g.new_input_reader(Countdown(30), 3)
    odd_even = Router(lambda value, source, n: [(value % n, value)])
    out = g.new_blocking_node({0: numbers}, Collect(), 2, {0: odd_even})
    g.run()
    values = out.values()
    assert [c for c, _ in values] == [0, 1]
    assert [v["numbers"] for _, v in values] == [list(range(0, 30, 2)), list(range(1, 30, 2))]
    with pytest.raises(GraphError, match="not tables"):
        out.to_arrow()
    with pytest.raises(GraphError, match="read\\(channel, n_channels\\)"):
        g2 = TaskGraph(spark)
        g2.new_input_reader(object(), 1)  # type: ignore[arg-type]


def test_a_csv_header_line_is_skipped_in_every_file(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    for i in range(3):
        (tmp_path / "in" / f"{i}.csv").write_text("k,v\n" + "".join(f"{i * 100 + j},{j}\n" for j in range(100)))
    for reader in ("auto", "spark"):
        g = TaskGraph(spark, file_reader=reader)
        src = g.new_input_csv(str(tmp_path / "in"), ["k", "v"], 2, header=True, stride=1024)
        out = g.new_blocking_node({0: src}, Count(), 1, {0: None})
        g.run()
        assert out.to_pandas()["count"].tolist() == [300], reader
