"""Datasets: reading them every way, outliving their graph, feeding later graphs (PageRank), checkpoints."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from conveyor import Dataset, TaskGraph
from conveyor.graph import FilterProject, GraphError, HashAggregate, Map
from tests.support.graph_helpers import example


def squares(spark: SparkSession, path: Path, checkpoint_dir: Path | None = None) -> Dataset:
    path.write_text("".join(f"{i},{i % 4}\n" for i in range(1000)))
    g = TaskGraph(spark, checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None)
    src = g.new_input_csv(path, ["n", "g"], 2, stride=2048)
    out = g.new_blocking_node(
        {0: src}, Map(lambda t: t.append_column("sq", pa.compute.multiply(t.column("n"), t.column("n")))), 3, {0: "n"}
    )
    g.run()
    return out


def test_dataset_reads_as_arrow_pandas_spark_and_batches_after_its_graph_is_gone(spark: SparkSession, tmp_path: Path) -> None:
    data = squares(spark, tmp_path / "n.csv")
    gc.collect()  # the graph is unreachable now: the Dataset must not need it
    table = data.to_arrow()
    assert table.schema.names == ["n", "g", "sq"] and table.num_rows == 1000
    assert sorted(table.column("n").to_pylist()) == list(range(1000))
    df = data.to_pandas()
    assert (df.sq == df.n * df.n).all()
    frame = data.to_spark()
    assert [f.name for f in frame.schema.fields] == ["n", "g", "sq"]
    assert frame.where("g = 1").count() == 250 and frame.agg({"sq": "sum"}).collect()[0][0] == sum(i * i for i in range(1000))
    batches = list(data)
    assert len(batches) > 3 and sum(b.num_rows for b in batches) == 1000
    assert data.schema == table.schema


def test_dataset_feeds_a_later_graph_and_checkpoints_as_parquet(spark: SparkSession, tmp_path: Path) -> None:
    data = squares(spark, tmp_path / "n.csv", checkpoint_dir=tmp_path / "ckpt")
    assert data.path is not None and list(Path(data.path).glob("*.parquet"))
    g = TaskGraph(spark)
    again = g.new_input_dataset(data, 2)
    big = g.new_non_blocking_node({0: again}, FilterProject(pa.compute.field("sq") >= 250_000), 2, {0: "g"})
    per_group = g.new_blocking_node({0: big}, HashAggregate("g", {"rows": ("count", None), "top": ("max", "n")}), 2, {0: "g"})
    g.run()
    result = per_group.to_pandas().sort_values("g", ignore_index=True)
    assert result.rows.tolist() == [125, 125, 125, 125] and result.top.tolist() == [996, 997, 998, 999]


def test_a_chain_of_graphs_keeps_a_plan_of_one_graph(spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # each graph reads the Dataset of the one before on two edges, as PageRank's iterations do: a
    # Dataset that kept its lineage doubled the plan per graph (and its description, which prints
    # every cached plan, grew ~8x) until the driver ran out of heap
    data = squares(spark, tmp_path / "n.csv")
    for _ in range(3):
        g = TaskGraph(spark)
        src = g.new_input_dataset(data, 2)
        none = g.new_non_blocking_node({0: src}, FilterProject(pa.compute.field("n") < 0), 2, {0: "n"})
        out = g.new_blocking_node({0: src, 1: none}, Map(lambda t: t), 2, {0: "n", 1: "n"})
        g.run()
        data.unpersist()
        data = out
    assert sorted(data.to_pandas().n) == list(range(1000))
    data.encoded.explain()
    assert "MapInArrow" not in capsys.readouterr().out  # nothing of the graphs that made the rows
    data.unpersist()  # frees the rows: reading fails and says why
    with pytest.raises(GraphError, match="was unpersisted"):
        data.to_arrow()
    g = TaskGraph(spark)
    g.new_blocking_node({0: g.new_input_dataset(data, 1)}, Map(lambda t: t), 1, {0: None})
    with pytest.raises(GraphError, match="was unpersisted"):
        g.initialize()


def test_empty_outputs_keep_their_columns(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "e.csv").write_text("1,2\n3,4\n")
    g = TaskGraph(spark)
    src = g.new_input_csv(tmp_path / "e.csv", ["a", "b"], 1)
    none = g.new_blocking_node({0: src}, FilterProject(pa.compute.field("a") > 100), 2, {0: "a"})
    g.run()
    assert none.to_arrow().num_rows == 0 and none.to_arrow().schema.names == ["a", "b"]
    assert none.to_spark().count() == 0


def test_pagerank_matches_numpy_power_iteration(spark: SparkSession, tmp_path: Path) -> None:
    pagerank = example("pagerank")
    n_nodes, iterations = 300, 3
    edges, nodes = pagerank.generate_graph(n_nodes, 2400, tmp_path)
    ranks = pagerank.pagerank(edges, nodes, n_nodes, iterations, parallelism=2)
    expected = pagerank.numpy_pagerank(edges, n_nodes, iterations)
    assert ranks.node.tolist() == list(range(n_nodes))
    np.testing.assert_allclose(ranks["rank"].to_numpy(), expected, rtol=1e-9, atol=1e-15)
    assert abs(ranks["rank"].sum() - 1.0) < 1e-9
