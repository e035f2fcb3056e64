"""TaskGraph: the dataflow API (input nodes, task nodes, Datasets) and its validation.

Building a graph only records nodes. `initialize()` resolves references, checks the graph and
plans it (`plan.py`); `run()` executes it on Spark (`runtime.py`) and fills the Datasets of the
blocking nodes. A graph runs once.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..spark.session import get_or_create_session
from .channels import PartitionKey
from .dataset import Dataset
from .errors import GraphError
from .executors import Executor
from .layout import CSV_STRIDE_BYTES
from .nodes import BatchFunc, ExecutorSource, InputSpec, Node, NodeKind, NodeRef, Spec, TaskSpec
from .plan import Plan, make_plan
from .runtime import Runner, RunStats

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_GRAPH_IDS = itertools.count(1)


def _check_parallelism(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GraphError(f"{what}: parallelism must be an integer >= 1, got {value!r}")
    return value


@dataclass
class TaskGraph:
    """A dataflow graph executed by Spark; see docs/graph.md.

    `spark`: the session to run on (default: the embedded local session). `checkpoint_dir`: when
    given, Datasets are written there as Parquet (and read back) instead of being kept as local
    checkpoints in the executors; Parquet survives the loss of an executor.
    `file_reader`: "auto" reads local files with pyarrow inside Spark tasks and anything else with
    Spark's readers; "spark" uses Spark's readers for every file input.
    """

    spark: SparkSession | None = None
    checkpoint_dir: str | None = None
    file_reader: str = "auto"
    specs: dict[int, Spec] = field(default_factory=dict, init=False)
    plan: Plan | None = field(default=None, init=False, repr=False)
    stats: RunStats | None = field(default=None, init=False)
    _id: int = field(default_factory=lambda: next(_GRAPH_IDS), init=False)
    _ran: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.file_reader not in ("auto", "spark"):
            raise GraphError(f"file_reader must be 'auto' or 'spark', got {self.file_reader!r}")

    # --- building --------------------------------------------------------------------------------
    def _new_node(self, name: str | None, kind: str) -> Node:
        if self.plan is not None or self._ran:
            raise GraphError(f"graph {self._id}: nodes cannot be added after initialize()")
        node_id = len(self.specs)
        name = name if name is not None else f"{kind}{node_id}"
        if any(s.node.name == name for s in self.specs.values()):
            raise GraphError(f"graph {self._id}: a node is already named {name!r}")
        return Node(self._id, node_id, name)

    def new_input_csv(self, path: str | os.PathLike[str], names: Sequence[str | None], parallelism: int,
                      batch_func: BatchFunc | None = None, sep: str = ",", dependents: Sequence[NodeRef] = (),
                      stride: int = CSV_STRIDE_BYTES, *, columns: Sequence[str] | None = None,
                      name: str | None = None) -> Node:  # fmt: skip
        """A CSV input: a file or directory Spark can read; `names` may end with a placeholder
        (None or "") for the empty field after a trailing delimiter. `columns` keeps only those
        columns (parsing fewer columns is much faster); `stride` is the bytes per read split."""
        node = self._new_node(name, "csv")
        _check_parallelism(parallelism, f"node {node}")
        if not names:
            raise GraphError(f"node {node}: names must list the CSV columns")
        if not isinstance(stride, int) or stride < 1024:
            raise GraphError(f"node {node}: stride must be an integer >= 1024 bytes, got {stride!r}")
        if len(sep) != 1:
            raise GraphError(f"node {node}: sep must be one character, got {sep!r}")
        self.specs[node.id] = InputSpec(node, NodeKind.CSV, parallelism, batch_func, tuple(dependents), path=os.fspath(path),
                                        names=tuple(names), sep=sep, stride=stride,
                                        columns=tuple(columns) if columns is not None else None)  # fmt: skip
        return node

    def new_input_parquet(self, path: str | os.PathLike[str], parallelism: int, columns: Sequence[str] | None = None,
                          filters: Any = None, batch_func: BatchFunc | None = None, dependents: Sequence[NodeRef] = (),
                          *, name: str | None = None) -> Node:  # fmt: skip
        """A Parquet input (a file or directory); `filters` is a pyarrow Expression or DNF tuples."""
        node = self._new_node(name, "parquet")
        _check_parallelism(parallelism, f"node {node}")
        self.specs[node.id] = InputSpec(node, NodeKind.PARQUET, parallelism, batch_func, tuple(dependents), path=os.fspath(path),
                                        columns=tuple(columns) if columns is not None else None, filters=filters)  # fmt: skip
        return node

    def new_input_dataset(self, dataset: Dataset, parallelism: int, batch_func: BatchFunc | None = None,
                          dependents: Sequence[NodeRef] = (), *, name: str | None = None) -> Node:  # fmt: skip
        """The batches of a Dataset an earlier graph made, as a stream of this graph."""
        node = self._new_node(name, "dataset")
        _check_parallelism(parallelism, f"node {node}")
        if not isinstance(dataset, Dataset):
            raise GraphError(f"node {node}: expected a Dataset, got {type(dataset).__name__}")
        self.specs[node.id] = InputSpec(node, NodeKind.DATASET, parallelism, batch_func, tuple(dependents), dataset=dataset)
        return node

    def _task(self, sources: Mapping[Hashable, NodeRef], executor: ExecutorSource, parallelism: int,
              partition_key: Mapping[Hashable, PartitionKey], blocking: bool, name: str | None) -> TaskSpec:  # fmt: skip
        node = self._new_node(name, "task")
        _check_parallelism(parallelism, f"node {node}")
        if not isinstance(sources, Mapping) or not sources:
            raise GraphError(f"node {node}: sources must be a non-empty mapping of stream id -> node")
        if not isinstance(partition_key, Mapping):
            raise GraphError(f"node {node}: partition_key must map each stream id of sources to None, a column or a callable")
        if set(sources) != set(partition_key):
            only_s = ", ".join(sorted(map(repr, set(sources) - set(partition_key)))) or "none"
            only_k = ", ".join(sorted(map(repr, set(partition_key) - set(sources)))) or "none"
            raise GraphError(f"node {node}: sources and partition_key must have the same stream ids: "
                             f"streams without a key: {only_s}; keys without a stream: {only_k}")  # fmt: skip
        for stream, key in partition_key.items():
            if key is not None and not isinstance(key, str) and not callable(key):
                raise GraphError(f"node {node}: partition key of stream {stream!r} must be None, a column name or a "
                                 f"callable, got {type(key).__name__}")  # fmt: skip
        if not (isinstance(executor, Executor) or callable(executor)):
            raise GraphError(f"node {node}: executor must be an Executor, an Executor class or a factory, "
                             f"got {type(executor).__name__}")  # fmt: skip
        for stream, ref in sources.items():
            if isinstance(ref, Node) and ref.graph != self._id:
                raise GraphError(f"node {node}: source {ref} of stream {stream!r} is a node of another graph")
            if isinstance(ref, Dataset):
                raise GraphError(f"node {node}: stream {stream!r} is a Dataset; read it with new_input_dataset()")
        spec = TaskSpec(node, dict(sources), executor, parallelism, dict(partition_key), blocking)
        self.specs[node.id] = spec
        return spec

    def new_non_blocking_node(self, sources: Mapping[Hashable, NodeRef], executor: ExecutorSource, parallelism: int,
                              partition_key: Mapping[Hashable, PartitionKey], *, name: str | None = None) -> Node:  # fmt: skip
        """A task node whose output is a stream other task nodes can consume."""
        return self._task(sources, executor, parallelism, partition_key, False, name).node

    def new_blocking_node(self, sources: Mapping[Hashable, NodeRef], executor: ExecutorSource, parallelism: int,
                          partition_key: Mapping[Hashable, PartitionKey], *, name: str | None = None) -> Dataset:  # fmt: skip
        """A task node whose output is materialised as a Dataset when the graph runs."""
        spec = self._task(sources, executor, parallelism, partition_key, True, name)
        spec.output = Dataset(spec.node.name, parallelism)
        return spec.output

    # --- checking and running -------------------------------------------------------------------
    def initialize(self) -> Plan:
        """Check the graph and plan its execution; errors name the node at fault."""
        if self._ran:
            raise GraphError(f"graph {self._id} has already run; a graph runs once (build a new one)")
        if self.plan is None:
            self.plan = make_plan(self.specs, self._id, self.file_reader)
        return self.plan

    def run(self) -> RunStats:
        """Run the graph on Spark; fills the Datasets of the blocking nodes. Returns the run's figures."""
        if self._ran:
            raise GraphError(f"graph {self._id} has already run; a graph runs once (build a new one)")
        plan = self.initialize()
        self._ran = True
        spark = self.spark if self.spark is not None else get_or_create_session()
        self.stats = Runner(self.specs, plan, spark, f"graph{self._id}", self.checkpoint_dir, self.file_reader).run()
        return self.stats
