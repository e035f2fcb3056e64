"""Every TaskGraph error: clear, raised at initialize() or when first detected, naming the node.

The checks are made as the graph is recorded (`conveyor.graph.nodes`) and planned
(`conveyor.graph.plan`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from conveyor import Executor, TaskGraph
from conveyor.graph import Count, FilterProject, GraphError, HashJoin


@pytest.fixture
def csv(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("".join(f"{i},{i % 3},name{i}\n" for i in range(100)))
    return path


def test_unknown_source_is_named_at_initialize(csv: Path) -> None:
    g = TaskGraph()
    src = g.new_input_csv(csv, ["a", "b", "c"], 1)
    g.new_blocking_node({0: src, 1: 42}, Count(), 1, {0: None, 1: None}, name="counter")
    with pytest.raises(GraphError, match=r"node 'counter': source of stream 1: unknown node 42"):
        g.initialize()
    g2 = TaskGraph()
    g2.new_input_csv(csv, ["a", "b", "c"], 1, name="mine")
    g3 = TaskGraph()
    g3.new_blocking_node({0: "nosuch"}, Count(), 1, {0: None}, name="sink")
    with pytest.raises(GraphError, match=r"node 'sink': source of stream 0: unknown node 'nosuch'"):
        g3.initialize()
    with pytest.raises(GraphError, match="is a node of another graph"):
        g.new_blocking_node({0: g2.specs[0].node}, Count(), 1, {0: None})


def test_sources_and_partition_keys_must_match(csv: Path) -> None:
    g = TaskGraph()
    src = g.new_input_csv(csv, ["a", "b", "c"], 1)
    with pytest.raises(GraphError, match=r"node 'join'.*streams without a key: '1'; keys without a stream: '2'"):
        g.new_blocking_node({0: src, "1": src}, Count(), 1, {0: None, "2": None}, name="join")
    with pytest.raises(GraphError, match=r"partition key of stream 0 must be None, a column name or a callable"):
        g.new_blocking_node({0: src}, Count(), 1, {0: 3})
    with pytest.raises(GraphError, match="parallelism must be an integer >= 1"):
        g.new_blocking_node({0: src}, Count(), 0, {0: None})


def test_partition_key_missing_from_known_columns_fails_initialize(csv: Path) -> None:
    g = TaskGraph()
    src = g.new_input_csv(csv, ["a", "b", "c"], 1, name="input")
    g.new_blocking_node({0: src}, Count(), 2, {0: "zz"}, name="count")
    with pytest.raises(GraphError, match=r"edge 'input' -> 'count' \(stream 0\): partition key column 'zz' is not among"):
        g.initialize()


def test_partition_key_missing_from_a_batch_fails_the_run(spark: SparkSession, csv: Path) -> None:
    g = TaskGraph(spark)
    src = g.new_input_csv(csv, ["a", "b", "c"], 1, batch_func=lambda df: df[["a"]], name="input")
    g.new_blocking_node({0: src}, Count(), 2, {0: "b"}, name="count")
    with pytest.raises(GraphError, match=r"edge 'input' -> 'count' \(stream 0\): partition key column 'b' is missing from"):
        g.run()


def test_a_graph_runs_once(spark: SparkSession, csv: Path) -> None:
    g = TaskGraph(spark)
    src = g.new_input_csv(csv, ["a", "b", "c"], 1)
    out = g.new_blocking_node({0: src}, Count, 1, {0: None})  # an Executor class: one instance per channel
    g.run()
    assert out.to_pandas()["count"].tolist() == [100]
    with pytest.raises(GraphError, match="has already run; a graph runs once"):
        g.run()
    with pytest.raises(GraphError, match="has already run"):
        g.initialize()
    with pytest.raises(GraphError, match="cannot be added after initialize"):
        g.new_input_csv(csv, ["a", "b", "c"], 1)


def test_cycles_are_named(csv: Path) -> None:
    g = TaskGraph()
    src = g.new_input_csv(csv, ["a", "b", "c"], 1)
    g.new_non_blocking_node({0: src, 1: 2}, HashJoin("a"), 1, {0: None, 1: None}, name="x")  # id 1, reads id 2
    g.new_non_blocking_node({0: 1}, FilterProject(), 1, {0: None}, name="y")  # id 2, reads x
    g.new_blocking_node({0: "y"}, Count(), 1, {0: None}, name="sink")
    with pytest.raises(GraphError, match=r"cycle through sources/dependents: 'x' -> 'y' -> 'x'|x -> y -> x"):
        g.initialize()
    g2 = TaskGraph()
    a = g2.new_input_csv(csv, ["a", "b", "c"], 1, dependents=[1], name="a")
    b = g2.new_input_csv(csv, ["a", "b", "c"], 1, dependents=[a], name="b")
    g2.new_blocking_node({0: a, 1: b}, Count(), 1, {0: None, 1: None})
    with pytest.raises(GraphError, match="cycle through sources/dependents: a -> b -> a"):
        g2.initialize()
    g3 = TaskGraph()
    g3.new_input_csv(csv, ["a", "b", "c"], 1, dependents=["self"], name="self")
    with pytest.raises(GraphError, match="node 'self': cycle: the node lists itself"):
        g3.initialize()


def test_structural_errors(csv: Path) -> None:
    g = TaskGraph()
    src = g.new_input_csv(csv, ["a", "b", "c"], 1, name="input")
    g.new_non_blocking_node({0: src}, FilterProject(), 1, {0: None}, name="dangling")
    with pytest.raises(GraphError, match="node 'dangling' has no consumer"):
        g.initialize()
    g = TaskGraph()
    src = g.new_input_csv(csv, ["a", "b", "c"], 1, name="input")
    first = g.new_blocking_node({0: src}, Count(), 1, {0: None}, name="first")
    g.new_blocking_node({0: "first"}, Count(), 1, {0: None}, name="second")
    with pytest.raises(GraphError, match=r"node 'second': stream 0 reads blocking node 'first'.*new_input_dataset"):
        g.initialize()
    with pytest.raises(GraphError, match=r"stream 0: Dataset 'first' is not materialised yet.*read by a graph after"):
        g.new_blocking_node({0: first}, Count(), 1, {0: None})
    with pytest.raises(GraphError, match="is not materialised yet: run its graph first"):
        TaskGraph().new_input_dataset(first, 1)
        g4 = TaskGraph()
        g4.new_blocking_node({0: g4.new_input_dataset(first, 1)}, Count(), 1, {0: None})
        g4.initialize()
    g = TaskGraph()
    g.new_input_csv(csv, ["a", "b", "c"], 1, dependents=["c1"], name="b1")
    g.new_blocking_node({0: "b1"}, Count(), 1, {0: None}, name="c1")
    with pytest.raises(GraphError, match="node 'b1': dependents must be input nodes, 'c1' is a task node"):
        g.initialize()
    with pytest.raises(GraphError, match="a node is already named 'b1'"):
        g.new_input_csv(csv, ["a"], 1, name="b1")


def test_executor_and_batch_func_errors_name_the_node(spark: SparkSession, csv: Path) -> None:
    class Broken(Executor):
        def execute(self, batch: pa.Table, stream_id: object, channel: int) -> None:
            raise ZeroDivisionError("boom")

    g = TaskGraph(spark)
    src = g.new_input_csv(csv, ["a", "b", "c"], 2, name="input")
    g.new_blocking_node({0: src}, Broken(), 2, {0: "a"}, name="broken")
    with pytest.raises(GraphError, match=r"node 'broken': Broken.execute \(channel \d, stream 0\) raised ZeroDivisionError"):
        g.run()
    g = TaskGraph(spark)
    src = g.new_input_csv(csv, ["a", "b", "c"], 2, batch_func=lambda df: df.nosuch, name="input")
    g.new_blocking_node({0: src}, Count(), 1, {0: None})
    with pytest.raises(GraphError, match=r"node 'input': batch_func raised AttributeError"):
        g.run()
    g = TaskGraph(spark)
    src = g.new_input_csv(csv, ["a", "b", "c"], 1, batch_func=lambda df: [1, 2], name="input")
    g.new_blocking_node({0: src}, Count(), 1, {0: None})
    with pytest.raises(GraphError, match=r"node 'input': batch_func returned a list; expected a pyarrow Table"):
        g.run()


def test_bad_input_files(spark: SparkSession, tmp_path: Path, csv: Path) -> None:
    g = TaskGraph(spark)
    g.new_blocking_node({0: g.new_input_csv(tmp_path / "none.csv", ["a"], 1, name="gone")}, Count(), 1, {0: None})
    with pytest.raises(GraphError, match="no such file or directory"):
        g.run()
    g = TaskGraph(spark)
    g.new_blocking_node({0: g.new_input_csv(csv, ["a", "b"], 1, name="narrow")}, Count(), 1, {0: None})
    with pytest.raises(GraphError, match="node 'narrow': the first line has 3 fields but 2 names were given"):
        g.run()
    bad = tmp_path / "bad.csv"  # a value that does not parse as the inferred type, far from the sample
    bad.write_text("".join(f"{i},x\n" for i in range(200_000)) + "oops,x\n")
    g = TaskGraph(spark)
    g.new_blocking_node({0: g.new_input_csv(bad, ["n", "s"], 1, name="typed")}, Count(), 1, {0: None})
    with pytest.raises(GraphError, match=r"node 'typed': .*bad.csv bytes .*inferred from the start of the first file"):
        g.run()
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "p.parquet")
    g = TaskGraph()
    with pytest.raises(GraphError, match="file_reader must be"):
        TaskGraph(file_reader="pyarrow")
    g.new_blocking_node({0: g.new_input_parquet(tmp_path / "p.parquet", 1, columns=["b"], name="pq")}, Count(), 1, {0: None})
    with pytest.raises(GraphError, match=r"node 'pq': columns \['b'\] are not in"):
        g.run()
