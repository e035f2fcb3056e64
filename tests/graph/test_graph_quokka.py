"""Quokka's runtime API on Conveyor's TaskGraph, written as its users wrote it.

Written after its runtime documentation and its TPC-H apps of that time: bucket + key inputs with
`{'localhost': n}` placement, pandas executors on `StatelessExecutor` with `early_termination()`,
`new_task_node`, the five-argument node form, a two-stage graph through `new_input_from_dataset`,
and S3 through a local S3-compatible server (moto's, on 127.0.0.1). Answers are checked against
DuckDB.
"""

from __future__ import annotations

import pickle
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow.fs as pafs
import pytest
from examples.tpch import names
from pyspark.sql import SparkSession

from conveyor.graph import GraphError, StatelessExecutor, TaskGraph
from conveyor.graph.arguments import csv_args, node_args
from conveyor.graph.channels import to_table
from conveyor.graph.filesystems import bucket_path, read_here, s3_file_system
from conveyor.graph.readers import list_files
from tests.support.graph_helpers import assert_frames_close, duckdb_answer
from tests.support.servers import wait_for

pytestmark = pytest.mark.timeout(240)

LINEITEM = names("lineitem")


def lineitem_filter(df: pd.DataFrame) -> pd.DataFrame:
    """Q6's predicate pushed into the reader, as Quokka's apps did with batch_func (pandas in, pandas out)."""
    df = df[
        (df.l_shipdate >= pd.Timestamp("1994-01-01"))
        & (df.l_shipdate < pd.Timestamp("1995-01-01"))
        & (df.l_discount >= 0.05)
        & (df.l_discount <= 0.07)
        & (df.l_quantity < 24)
    ]
    return pd.DataFrame({"revenue": df.l_extendedprice * df.l_discount})


class AggExecutor(StatelessExecutor):
    """Sums every column of its batches; emits the sums when its input ends."""

    def __init__(self) -> None:
        self.state: pd.Series | None = None

    def execute(self, batch: pd.DataFrame, stream_id: int, executor_id: int) -> None:
        assert isinstance(batch, pd.DataFrame)  # Quokka's executors get pandas
        self.state = batch.sum() if self.state is None else self.state + batch.sum()

    def done(self, executor_id: int) -> pd.DataFrame:
        return pd.DataFrame([self.state if self.state is not None else {}])


class JoinExecutor(StatelessExecutor):
    """A symmetric hash join kept as sets of batches (Quokka's confluent join).

    It checks the documented partition rule: every row of its channel has `key % parallelism ==
    executor_id`.
    """

    def __init__(self, on: tuple[str, str], parallelism: int) -> None:
        self.on, self.parallelism = on, parallelism
        self.state: dict[int, list[pd.DataFrame]] = {0: [], 1: []}

    def execute(self, batch: pd.DataFrame, stream_id: int, executor_id: int) -> list[pd.DataFrame] | None:
        key = self.on[stream_id]
        assert (batch[key] % self.parallelism == executor_id).all(), "a row in the wrong channel"
        self.state[stream_id].append(batch)
        other = self.state[1 - stream_id]
        left, right = (batch, other) if stream_id == 0 else (other, batch)
        if stream_id == 0:
            out = [batch.merge(o, left_on=self.on[0], right_on=self.on[1]) for o in right]
        else:
            out = [o.merge(batch, left_on=self.on[0], right_on=self.on[1]) for o in left]
        return [o for o in out if len(o)] or None  # Quokka's executors return lists of batches


class GroupCountExecutor(StatelessExecutor):
    """Q12's aggregate as Quokka's stock one combined partial results: by the pandas index of a groupby."""

    def __init__(self) -> None:
        self.state: pd.DataFrame | None = None

    def execute(self, batch: pd.DataFrame, stream_id: int, executor_id: int) -> None:
        urgent = batch.o_orderpriority.isin(["1-URGENT", "2-HIGH"])
        part = (
            pd.DataFrame(
                {"l_shipmode": batch.l_shipmode, "high_line_count": urgent.astype(int), "low_line_count": (~urgent).astype(int)}
            )
            .groupby("l_shipmode")
            .sum()
        )
        self.state = part if self.state is None else self.state.add(part, fill_value=0)

    def done(self, executor_id: int) -> pd.DataFrame | None:
        return None if self.state is None else self.state.sort_index()


def q12_lineitem(df: pd.DataFrame) -> pd.DataFrame:
    df = df[
        df.l_shipmode.isin(["MAIL", "SHIP"])
        & (df.l_commitdate < df.l_receiptdate)
        & (df.l_shipdate < df.l_commitdate)
        & (df.l_receiptdate >= pd.Timestamp("1994-01-01"))
        & (df.l_receiptdate < pd.Timestamp("1995-01-01"))
    ]
    return df[["l_orderkey", "l_shipmode"]]


def test_q6_with_bucket_key_and_machine_placement(spark: SparkSession, tpch_sf001: Path) -> None:
    task_graph = TaskGraph(spark)
    lineitem = task_graph.new_input_csv(
        str(tpch_sf001), "lineitem.tbl", LINEITEM, {"localhost": 2}, batch_func=lineitem_filter, sep="|"
    )
    agged = task_graph.new_blocking_node({0: lineitem}, None, AggExecutor(), {"localhost": 1}, {0: None})
    task_graph.initialize()
    task_graph.run()
    expected = duckdb_answer("q6", tpch_sf001)
    assert_frames_close(agged.to_pandas()[["revenue"]], expected)


def test_q12_pandas_join_and_index_keyed_aggregate(spark: SparkSession, tpch_sf001: Path) -> None:
    task_graph = TaskGraph(spark)
    orders = task_graph.new_input_csv(
        str(tpch_sf001),
        "orders.tbl",
        names("orders"),
        {"localhost": 2},
        sep="|",
        batch_func=lambda df: df[["o_orderkey", "o_orderpriority"]],
    )
    lineitem = task_graph.new_input_csv(
        str(tpch_sf001), "lineitem.tbl", LINEITEM, 2, ip="localhost", sep="|", batch_func=q12_lineitem
    )
    joined = task_graph.new_task_node(
        {0: orders, 1: lineitem},
        JoinExecutor(("o_orderkey", "l_orderkey"), 4),
        {"localhost": 4},
        {0: "o_orderkey", 1: "l_orderkey"},
    )
    counts = task_graph.new_blocking_node({0: joined}, None, GroupCountExecutor(), {"localhost": 1}, {0: None})
    task_graph.run()
    expected = duckdb_answer("q12", tpch_sf001)
    ours = counts.to_pandas()  # the groupby's index (l_shipmode) comes back as a column
    assert list(ours.l_shipmode) == ["MAIL", "SHIP"]
    assert_frames_close(ours[list(expected.columns)], expected)


class Revenue(StatelessExecutor):
    def execute(self, batch: pd.DataFrame, stream_id: int, executor_id: int) -> pd.DataFrame:
        return pd.DataFrame({"l_orderkey": batch.l_orderkey, "revenue": batch.l_extendedprice * (1 - batch.l_discount)})


class SumBy(StatelessExecutor):
    def __init__(self) -> None:
        self.parts: list[pd.DataFrame] = []

    def execute(self, batch: pd.DataFrame, stream_id: int, executor_id: int) -> None:
        self.parts.append(batch.groupby(batch.l_orderkey % 10).revenue.sum().rename_axis("bucket").to_frame())

    def done(self, executor_id: int) -> pd.DataFrame | None:
        return pd.concat(self.parts).groupby(level=0).sum() if self.parts else None


def test_a_two_stage_graph_through_new_input_from_dataset(spark: SparkSession, tpch_sf001: Path) -> None:
    first = TaskGraph(spark)
    lineitem = first.new_input_csv(str(tpch_sf001), "lineitem.tbl", LINEITEM, {"localhost": 2}, sep="|")
    per_row = first.new_blocking_node({0: lineitem}, Revenue(), 2, {0: "l_orderkey"})
    first.run()
    second = TaskGraph(spark)
    rows = second.new_input_from_dataset(per_row, {"localhost": 2})
    by_bucket = second.new_blocking_node({0: rows}, None, SumBy(), {"localhost": 2}, {0: "l_orderkey"})
    # and the Dataset as a task node's source directly, with Quokka's other reader name beside it
    third = TaskGraph(spark)
    with pytest.raises(GraphError, match="sources and partition_key must have the same stream ids"):
        third.new_blocking_node({0: per_row}, SumBy(), 1, {1: None})
    assert third.specs == {}  # the input node made for the Dataset went with the node that failed
    direct = third.new_blocking_node({0: per_row}, SumBy(), 1, {0: None})
    assert third.add_input_dataset is not None and third.new_input_redis is not None
    second.run()
    third.run()
    raw = pd.read_csv(tpch_sf001 / "lineitem.tbl", sep="|", header=None, usecols=[0, 5, 6])
    want = (raw[5] * (1 - raw[6])).groupby(raw[0] % 10).sum()
    for got in (by_bucket.to_pandas(), direct.to_pandas()):
        got = got.groupby("bucket").revenue.sum()  # two channels each emit their buckets' sums
        assert list(got.index) == list(range(10))
        assert got.to_numpy() == pytest.approx(want.to_numpy(), rel=1e-9)


class FirstRows(StatelessExecutor):
    """Keeps `n` rows, then stops its input.

    It stops it by the method, or by the attribute Quokka's base class set; its done() writes how
    many batches still came after that (none should).
    """

    def __init__(self, n: int, by_attribute: bool, path: str) -> None:
        self.n, self.by_attribute, self.path, self.rows, self.after = n, by_attribute, path, 0, 0

    def execute(self, batch: pd.DataFrame, stream_id: int, executor_id: int) -> pd.DataFrame:
        if self.rows >= self.n:
            self.after += 1
        take = batch.head(self.n - self.rows)
        self.rows += len(take)
        if self.rows >= self.n:
            if self.by_attribute:
                self.early_termination = True
            else:
                self.early_termination()
        return take

    def done(self, executor_id: int) -> None:
        Path(self.path).write_text(str(self.after))


@pytest.mark.parametrize("by_attribute", [False, True])
def test_early_termination_stops_the_input(spark: SparkSession, tpch_sf001: Path, tmp_path: Path, by_attribute: bool) -> None:
    task_graph = TaskGraph(spark)
    # 64 kB splits: ~120 of them, each read as its own batch
    lineitem = task_graph.new_input_csv(str(tpch_sf001), "lineitem.tbl", LINEITEM, 1, sep="|", stride=64 * 1024)
    after = tmp_path / "after"
    first = task_graph.new_blocking_node({0: lineitem}, None, FirstRows(5, by_attribute, str(after)), {"localhost": 1}, {0: None})
    stats = task_graph.run()
    assert len(first.to_pandas()) == 5
    assert after.read_text() == "0"  # no batch was handed over once it had stopped
    assert sum(stats.batches_read.values()) < 5  # and the reading stopped (the input is read inside the node's task)


class WritesItsTotal(StatelessExecutor):
    """An output node as Quokka's Q6 example had: nothing reads it; its done() has the effect."""

    def __init__(self, path: str) -> None:
        self.path, self.total = path, 0.0

    def execute(self, batch: pd.DataFrame, stream_id: int, executor_id: int) -> None:
        self.total += float(batch.revenue.sum())

    def done(self, executor_id: int) -> None:
        Path(self.path).write_text(repr(self.total))


def test_a_task_node_nobody_reads_is_an_output_node(spark: SparkSession, tpch_sf001: Path, tmp_path: Path) -> None:
    task_graph = TaskGraph(spark)
    lineitem = task_graph.new_input_csv(str(tpch_sf001), "lineitem.tbl", LINEITEM, 2, batch_func=lineitem_filter, sep="|")
    task_graph.new_task_node({0: lineitem}, WritesItsTotal(str(tmp_path / "total")), 1, {0: None})
    task_graph.initialize()
    task_graph.run()
    expected = float(duckdb_answer("q6", tpch_sf001).revenue[0])
    assert float((tmp_path / "total").read_text()) == pytest.approx(expected, rel=1e-9)


def test_each_call_is_read_in_the_form_its_arguments_show(tmp_path: Path) -> None:
    """Quokka's argument forms and Conveyor's are told apart by the arguments alone (`conveyor.graph.arguments`)."""
    args, kwargs = csv_args((str(tmp_path), "lineitem.tbl", LINEITEM, 2), {})  # a string second: Quokka's key
    assert args == () and kwargs["path"] == bucket_path(str(tmp_path), "lineitem.tbl", "new_input_csv")
    assert kwargs["names"] == LINEITEM and kwargs["parallelism"] == 2 and kwargs["s3_here"]
    assert csv_args((tmp_path / "x.csv", LINEITEM, 2), {"sep": "|"}) == ((tmp_path / "x.csv", LINEITEM, 2), {"sep": "|"})
    sources, executor, placement, keys = {0: "node"}, object(), {"localhost": 2}, {0: None}  # read as given: checked later
    expected = (sources, executor, placement, keys, None, "localhost")
    assert node_args((sources, None, executor, placement, keys), {}) == expected  # five: Quokka's, datasets second
    assert node_args((sources, executor, placement, keys), {}) == expected
    assert node_args((sources, executor, placement, keys), {"name": "n", "ip": "h"}) == (*expected[:4], "n", "h")


def test_quokka_arguments_that_are_wrong_get_clear_errors(tpch_sf001: Path) -> None:
    g = TaskGraph()
    for parallelism, match in (
        ({"localhost": 0}, "machine 'localhost' must get an integer >= 1"),
        ({"": 2}, "must map machine addresses"),
        ({}, "maps no machine"),
        ("8", "parallelism must be an integer >= 1 or a mapping"),
    ):
        with pytest.raises(GraphError, match=match):
            g.new_input_csv(str(tpch_sf001), "lineitem.tbl", LINEITEM, parallelism, sep="|")
    with pytest.raises(GraphError, match="ip must be a machine's address"):
        g.new_input_csv(str(tpch_sf001), "lineitem.tbl", LINEITEM, 2, ip=5, sep="|")
    with pytest.raises(GraphError, match="key must be a non-empty string"):
        g.new_input_csv(str(tpch_sf001), "", LINEITEM, 2, sep="|")
    src = g.new_input_csv(str(tpch_sf001), "lineitem.tbl", LINEITEM, {"10.0.0.1": 2, "10.0.0.2": 3}, sep="|")
    assert g.specs[src.id].parallelism == 5  # channels per machine add up: Spark places them
    # Conveyor's own node form keeps its keywords (ip= among them); a misspelt one is a TypeError naming it
    node = g.new_blocking_node({0: src}, AggExecutor(), {"localhost": 1}, {0: None}, ip="localhost", name="agg")
    assert g.specs[len(g.specs) - 1].node.name == "agg" and node.n_channels == 1
    with pytest.raises(TypeError, match="nme"):
        g.new_blocking_node({0: src}, AggExecutor(), 1, {0: None}, nme="x")
    # Quokka's form with partition_key by keyword; new_task_node given that form is told which takes it
    g.new_blocking_node({0: src}, None, AggExecutor(), {"localhost": 1}, partition_key={0: None})
    with pytest.raises(GraphError, match="new_task_node takes"):
        g.new_task_node({0: src}, None, AggExecutor(), {"localhost": 1}, {0: None})
    with pytest.raises(GraphError, match="datasets argument is not supported"):
        g.new_blocking_node({0: src}, ["a dataset"], AggExecutor(), {"localhost": 1}, {0: None})
    with pytest.raises(GraphError, match="policy must be 'default'"):
        g.new_input_redis(None, 1, policy="random")
    # an unread new_task_node is an output node, worked out again at each initialize()
    h = TaskGraph()
    csv = h.new_input_csv(tpch_sf001, Path("lineitem.tbl"), LINEITEM, 1, sep="|")  # a path as the key
    out = h.new_task_node({0: csv}, AggExecutor(), 1, {0: None}, name="out")
    h.new_non_blocking_node({0: csv}, AggExecutor(), 1, {0: None}, name="dangling")
    with pytest.raises(GraphError, match="node 'dangling' has no consumer"):
        h.initialize()
    h.new_blocking_node({0: out, 1: "dangling"}, AggExecutor(), 1, {0: None, 1: None})
    h.initialize()
    assert not h.specs[out.id].blocking  # read now: a stream again
    missing = TaskGraph()
    sink = missing.new_input_csv(str(tpch_sf001), "no-such-table.tbl", LINEITEM, 1, sep="|")
    missing.new_blocking_node({0: sink}, AggExecutor(), 1, {0: None})
    with pytest.raises(GraphError, match="no such file or directory"):
        missing.run()


# --- S3, through a local S3-compatible server ------------------------------------------------------------------------------


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (stopped by PID), and the driver's environment pointing at it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "moto.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(port) or proc.poll() is not None, 30, "moto's S3 server to listen")
        assert proc.poll() is None, (tmp_path / "moto.log").read_text()
        for key, value in {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(key, value)
        yield endpoint
    finally:
        proc.kill()
        proc.wait(10)
        log.close()


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _upload(fs: pafs.FileSystem, local: Path, key: str) -> None:
    with fs.open_output_stream(key) as out, open(local, "rb") as f:
        while chunk := f.read(1 << 20):
            out.write(chunk)


def test_q6_from_s3_by_bucket_name_and_by_url_and_prefix(spark: SparkSession, tpch_sf001: Path, s3: str) -> None:
    fs = pafs.S3FileSystem(
        endpoint_override=s3.split("://")[1],
        scheme="http",
        access_key="test",
        secret_key="test",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    fs.create_dir("tpch")  # a bucket
    _upload(fs, tpch_sf001 / "lineitem.tbl", "tpch/lineitem/part-0.tbl")
    expected = duckdb_answer("q6", tpch_sf001)
    # Quokka's form: a bare bucket name and a key; then an s3:// URL with a key prefix
    for bucket, key in (("tpch", "lineitem/part-0.tbl"), ("s3://tpch", "lineitem/part")):
        task_graph = TaskGraph(spark)
        lineitem = task_graph.new_input_csv(
            bucket, key, LINEITEM, {"localhost": 2}, batch_func=lineitem_filter, sep="|", stride=256 * 1024
        )
        agged = task_graph.new_blocking_node({0: lineitem}, None, AggExecutor(), {"localhost": 1}, {0: None})
        task_graph.run()
        assert_frames_close(agged.to_pandas()[["revenue"]], expected)
    bad = TaskGraph(spark)
    node = bad.new_input_csv("tpch", "orders/none", LINEITEM, 1, sep="|")
    bad.new_blocking_node({0: node}, AggExecutor(), 1, {0: None})
    with pytest.raises(GraphError, match="no such file or directory: tpch/orders/none"):
        bad.run()


def test_the_driver_environment_configures_s3_and_travels_with_the_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The S3 file system is pickled into the Spark tasks with the driver's settings: executors need no AWS environment."""
    for key, value in {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_REGION": "eu-west-1",
    }.items():
        monkeypatch.setenv(key, value)
    fs = pickle.loads(pickle.dumps(s3_file_system()))
    options = fs.__reduce__()[1][0]
    assert (options["endpoint_override"], options["scheme"], options["region"]) == ("127.0.0.1:9", "http", "eu-west-1")
    assert (options["access_key"], options["secret_key"]) == ("k", "s")
    assert options["connect_timeout"] > 0 and options["request_timeout"] > 0  # every wait has a bound


def test_local_listing_follows_no_directory_link_and_takes_no_prefix(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.csv").write_text("1\n")
    (data / "up").symlink_to(tmp_path, target_is_directory=True)  # a loop, were links followed
    (tmp_path / "orders_old.csv").write_text("2\n")
    assert list_files(pafs.LocalFileSystem(), str(data)) == [str(data / "a.csv")]
    with pytest.raises(GraphError, match="no such file or directory"):  # a local typo is not read as a prefix
        list_files(pafs.LocalFileSystem(), str(tmp_path / "orders"))
    assert bucket_path(str(tmp_path), "/data/a.csv", "t") == str(data / "a.csv")  # a key stays inside its bucket
    with pytest.raises(GraphError, match="leaves its bucket"):
        bucket_path(str(data), "../orders_old.csv", "t")
    # an s3:// path is Conveyor's to read only in Quokka's bucket + key form; otherwise Spark's, as configured
    assert not read_here("s3://b/k") and read_here("s3://b/k", s3=True) and read_here(str(data))


def test_a_pandas_executors_named_index_becomes_columns_without_clashing() -> None:
    df = pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]})
    by_key = to_table(df.groupby("k").sum(), "t", keep_index=True)
    assert by_key is not None and by_key.column_names == ["k", "v"]
    for same in (df.set_index("k", drop=False), df.groupby("k")[["k", "v"]].sum(), df.rename_axis("row")):
        table = to_table(same, "t", keep_index=True)  # a name that is a column already, or a RangeIndex: kept as it is
        assert table is not None and table.column_names == list(same.columns)
    plain = to_table(df.groupby("k").sum(), "t")  # an Arrow executor's DataFrame: its index is dropped, as always
    assert plain is not None and plain.column_names == ["v"]
