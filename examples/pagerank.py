"""PageRank on a generated graph, one TaskGraph per iteration (a multi-stage job over Datasets).

    python examples/pagerank.py [--nodes 2000] [--edges 20000] [--iterations 5] [--parallelism 2]

Stage 0 reads the edge list (Parquet) and weighs every edge by 1 / out-degree of its source (a
symmetric streaming join of the edges with their sources' degrees), and makes the initial ranks.
Each iteration is a new graph over the previous stage's Datasets: ranks join weighted edges on
the source node (the ranks are the build side), the contributions are summed per destination,
and the new rank is (1 - d) / N + d * sum. Every node has an out-edge (no dangling nodes).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from conveyor import Dataset, TaskGraph
from conveyor.graph import FilterProject, HashAggregate, HashJoin, Map

DAMPING = 0.85


def generate_graph(n_nodes: int, n_edges: int, out_dir: Path, seed: int = 7) -> tuple[Path, Path]:
    """A random directed graph with skewed in-degrees; every node has at least one out-edge."""
    rng = np.random.default_rng(seed)
    src = np.concatenate([np.arange(n_nodes), rng.integers(0, n_nodes, n_edges - n_nodes)])
    dst = (rng.zipf(1.6, n_edges) * 7919 + rng.integers(0, n_nodes, n_edges)) % n_nodes
    dst = np.where(dst == src, (dst + 1) % n_nodes, dst)  # no self loops
    edges, nodes = out_dir / "edges.parquet", out_dir / "nodes.parquet"
    pq.write_table(pa.table({"src": src, "dst": dst}), edges, row_group_size=max(1, n_edges // 4))
    pq.write_table(pa.table({"node": np.arange(n_nodes)}), nodes)
    return edges, nodes


def prepare(edges_path: Path, nodes_path: Path, n_nodes: int, parallelism: int) -> tuple[Dataset, Dataset]:
    """Stage 0: (src, dst, weight) edges and the initial ranks."""
    graph = TaskGraph()
    edges = graph.new_input_parquet(edges_path, parallelism, name="edges")
    degrees = graph.new_non_blocking_node({0: edges}, HashAggregate("src", {"degree": ("count", None)}), parallelism,
                                          {0: "src"}, name="degrees")  # fmt: skip
    renamed = graph.new_non_blocking_node({0: degrees}, FilterProject(columns={"node": "src", "degree": "degree"}), parallelism,
                                          {0: "src"}, name="renamed")  # fmt: skip
    weighted = graph.new_blocking_node(
        {0: edges, 1: renamed}, HashJoin("src", "node"), parallelism, {0: "src", 1: "node"}, name="weighted"
    )
    nodes = graph.new_input_parquet(nodes_path, parallelism, name="nodes")
    initial = Map(lambda t: t.append_column("rank", pa.array(np.full(t.num_rows, 1 / n_nodes))))
    ranks = graph.new_blocking_node({0: nodes}, initial, parallelism, {0: "node"}, name="ranks0")
    graph.run()
    return weighted, ranks


def contributions(table: pa.Table) -> pa.Table:
    """rank * 1/degree, sent to the destination."""
    share = pc.divide(table.column("rank"), pc.cast(table.column("degree"), pa.float64()))
    return pa.table({"dst": table.column("dst"), "contrib": share})


def iterate(ranks: Dataset, edges: Dataset, n_nodes: int, parallelism: int) -> Dataset:
    """One PageRank step as one graph; returns the new ranks."""
    graph = TaskGraph()
    r = graph.new_input_dataset(ranks, parallelism, name="ranks")
    e = graph.new_input_dataset(edges, parallelism, dependents=[r], name="edges")
    joined = graph.new_non_blocking_node({0: r, 1: e}, HashJoin("node", "src", build=0), parallelism,
                                         {0: "node", 1: "src"}, name="join")  # fmt: skip
    sent = graph.new_non_blocking_node({0: joined}, Map(contributions), parallelism, {0: "dst"}, name="send")
    # every node gets a zero contribution too, so nodes nobody links to keep the teleport share
    zeros = graph.new_non_blocking_node({0: r}, Map(lambda t: pa.table({"dst": t.column("node"), "contrib": pa.array(
        np.zeros(t.num_rows))})), parallelism, {0: "node"}, name="zeros")  # fmt: skip
    summed = graph.new_non_blocking_node({0: sent, 1: zeros}, HashAggregate("dst", {"total": ("sum", "contrib")}), parallelism,
                                         {0: "dst", 1: "dst"}, name="sum")  # fmt: skip

    def new_rank(t: pa.Table) -> pa.Table:
        rank = pc.add(pc.multiply(t.column("total"), DAMPING), (1 - DAMPING) / n_nodes)
        return pa.table({"node": t.column("dst"), "rank": rank})

    out = graph.new_blocking_node({0: summed}, Map(new_rank), parallelism, {0: "dst"}, name="new_ranks")
    graph.run()
    return out


def pagerank(edges_path: Path, nodes_path: Path, n_nodes: int, iterations: int, parallelism: int = 2) -> pd.DataFrame:
    """Ranks after `iterations` steps, as a DataFrame (node, rank) sorted by node."""
    edges, ranks = prepare(edges_path, nodes_path, n_nodes, parallelism)
    for _ in range(iterations):
        previous, ranks = ranks, iterate(ranks, edges, n_nodes, parallelism)
        previous.unpersist()
    return ranks.to_pandas().sort_values("node", ignore_index=True)


def numpy_pagerank(edges_path: Path, n_nodes: int, iterations: int) -> np.ndarray:
    """The same iteration as a dense power iteration."""
    table = pq.read_table(edges_path)
    src, dst = table.column("src").to_numpy(), table.column("dst").to_numpy()
    degree = np.bincount(src, minlength=n_nodes)
    ranks = np.full(n_nodes, 1 / n_nodes)
    for _ in range(iterations):
        ranks = (1 - DAMPING) / n_nodes + DAMPING * np.bincount(dst, weights=ranks[src] / degree[src], minlength=n_nodes)
    return ranks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--edges", type=int, default=20000)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        edges, nodes = generate_graph(args.nodes, args.edges, Path(tmp))
        start = time.perf_counter()
        ranks = pagerank(edges, nodes, args.nodes, args.iterations, args.parallelism)
        seconds = time.perf_counter() - start
        expected = numpy_pagerank(edges, args.nodes, args.iterations)
        error = float(np.abs(ranks["rank"].to_numpy() - expected).max())
        print(ranks.nlargest(10, "rank").to_string(index=False))
        print(f"{args.iterations} iterations in {seconds:.1f} s; max |difference| from numpy: {error:.2e}")


if __name__ == "__main__":
    main()
