"""TaskGraph: the dataflow API (input nodes, task nodes, Datasets) and its validation.

Building a graph only records nodes. `initialize()` resolves references, checks the graph and
plans it (`plan.py`); `run()` executes it on Spark (`runtime.py`) and fills the Datasets of the
blocking nodes. A graph runs once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from ..spark.session import get_or_create_session
from .arguments import csv_args, node_args
from .channels import PartitionKey
from .dataset import Dataset
from .errors import GraphError
from .executors import Executor
from .layout import CSV_STRIDE_BYTES
from .nodes import BatchFunc, ExecutorSource, InputSpec, Node, NodeKind, NodeRef, Spec, TaskSpec, resolve
from .placement import LOCALHOST, Parallelism, channel_count
from .plan import Plan, make_plan
from .readers import SourceReader
from .runtime import Runner, RunStats

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_GRAPH_IDS = itertools.count(1)


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
    _quokka_tasks: set[int] = field(default_factory=set, init=False)  # the nodes new_task_node made

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

    @overload
    def new_input_csv(
        self,
        path: str | os.PathLike[str],
        names: Sequence[str | None],
        parallelism: Parallelism,
        batch_func: BatchFunc | None = None,
        sep: str = ",",
        dependents: Sequence[NodeRef] = (),
        stride: int = CSV_STRIDE_BYTES,
        *,
        ip: str = LOCALHOST,
        columns: Sequence[str] | None = None,
        name: str | None = None,
        batch_format: str = "pandas",
        header: bool = False,
    ) -> Node: ...
    @overload
    def new_input_csv(
        self,
        bucket: str,
        key: str,
        names: Sequence[str | None],
        parallelism: Parallelism,
        ip: str = LOCALHOST,
        batch_func: BatchFunc | None = None,
        sep: str = ",",
        dependents: Sequence[NodeRef] = (),
        stride: int = CSV_STRIDE_BYTES,
        *,
        columns: Sequence[str] | None = None,
        name: str | None = None,
        batch_format: str = "pandas",
        header: bool = False,
    ) -> Node: ...
    def new_input_csv(self, *args: Any, **kwargs: Any) -> Node:
        """A CSV input: a file or directory Conveyor or Spark can read.

        Arguments `(path, names, parallelism, ...)`; or Quokka's
        `(bucket, key, names, parallelism, ip, ...)` (see `bucket_path`). `names` may end with a
        placeholder (None or "") for the empty field after a trailing delimiter. `columns` keeps only
        those columns (parsing fewer columns is much faster); `stride` is the bytes per read split;
        `parallelism` is a count or {machine: channels} (see `placement`). `batch_format="object"`
        hands `batch_func` the pyarrow Table read and lets it return any picklable value (the
        default "pandas": a DataFrame in, a table-like batch out). `header=True`: each file starts
        with a line of column names, which is skipped (`names` still names the columns).
        """
        args, kwargs = csv_args(args, kwargs)
        return self._input_csv(*args, **kwargs)

    def _input_csv(
        self,
        path: str | os.PathLike[str],
        names: Sequence[str | None],
        parallelism: Parallelism,
        batch_func: BatchFunc | None = None,
        sep: str = ",",
        dependents: Sequence[NodeRef] = (),
        stride: int = CSV_STRIDE_BYTES,
        *,
        ip: str = LOCALHOST,
        columns: Sequence[str] | None = None,
        name: str | None = None,
        s3_here: bool = False,
        batch_format: str = "pandas",
        header: bool = False,
    ) -> Node:
        node = self._new_node(name, "csv")
        parallelism = channel_count(parallelism, ip, f"node {node}")
        if not names:
            raise GraphError(f"node {node}: names must list the CSV columns")
        if not isinstance(stride, int) or stride < 1024:
            raise GraphError(f"node {node}: stride must be an integer >= 1024 bytes, got {stride!r}")
        if len(sep) != 1:
            raise GraphError(f"node {node}: sep must be one character, got {sep!r}")
        self.specs[node.id] = InputSpec(
            node,
            NodeKind.CSV,
            parallelism,
            batch_func,
            tuple(dependents),
            path=os.fspath(path),
            names=tuple(names),
            sep=sep,
            stride=stride,
            s3_here=s3_here,
            columns=tuple(columns) if columns is not None else None,
            batch_format=_batch_format(batch_format, node),
            header=bool(header),
        )
        return node

    def new_input_parquet(
        self,
        path: str | os.PathLike[str],
        parallelism: Parallelism,
        columns: Sequence[str] | None = None,
        filters: Any = None,
        batch_func: BatchFunc | None = None,
        dependents: Sequence[NodeRef] = (),
        *,
        ip: str = LOCALHOST,
        name: str | None = None,
        batch_format: str = "pandas",
    ) -> Node:
        """A Parquet input (a file or directory); `filters` is a pyarrow Expression or DNF tuples."""
        node = self._new_node(name, "parquet")
        parallelism = channel_count(parallelism, ip, f"node {node}")
        self.specs[node.id] = InputSpec(
            node,
            NodeKind.PARQUET,
            parallelism,
            batch_func,
            tuple(dependents),
            path=os.fspath(path),
            columns=tuple(columns) if columns is not None else None,
            filters=filters,
            batch_format=_batch_format(batch_format, node),
        )
        return node

    def new_input_dataset(
        self,
        dataset: Dataset,
        parallelism: Parallelism,
        batch_func: BatchFunc | None = None,
        dependents: Sequence[NodeRef] = (),
        *,
        ip: str = LOCALHOST,
        name: str | None = None,
        batch_format: str = "pandas",
    ) -> Node:
        """The batches of a Dataset an earlier graph made, as a stream of this graph."""
        node = self._new_node(name, "dataset")
        parallelism = channel_count(parallelism, ip, f"node {node}")
        if not isinstance(dataset, Dataset):
            raise GraphError(f"node {node}: expected a Dataset, got {type(dataset).__name__}")
        self.specs[node.id] = InputSpec(
            node,
            NodeKind.DATASET,
            parallelism,
            batch_func,
            tuple(dependents),
            dataset=dataset,
            batch_format=_batch_format(batch_format, node),
        )
        return node

    def new_input_reader(
        self,
        reader: SourceReader,
        parallelism: Parallelism,
        batch_func: BatchFunc | None = None,
        dependents: Sequence[NodeRef] = (),
        *,
        ip: str = LOCALHOST,
        name: str | None = None,
        batch_format: str = "object",
    ) -> Node:
        """An input of the user's own: `reader.read(channel, n_channels)` yields each channel's batches.

        Each channel reads in a Spark task of its own, from a copy of `reader`. Batches may be of
        any picklable type (`batch_format="object"`: `batch_func` gets them as they are).
        """
        node = self._new_node(name, "reader")
        parallelism = channel_count(parallelism, ip, f"node {node}")
        if not isinstance(reader, SourceReader):
            raise GraphError(f"node {node}: a reader needs a read(channel, n_channels) method, got {type(reader).__name__}")
        self.specs[node.id] = InputSpec(
            node,
            NodeKind.READER,
            parallelism,
            batch_func,
            tuple(dependents),
            reader=reader,
            batch_format=_batch_format(batch_format, node),
        )
        return node

    # Quokka's names for it: new_input_from_dataset, add_input_dataset, and new_input_redis (its Dataset reader)
    new_input_from_dataset = add_input_dataset = new_input_dataset

    def new_input_redis(
        self,
        dataset: Dataset,
        ip_to_num_channel: Parallelism,
        policy: str = "default",
        batch_func: BatchFunc | None = None,
        dependents: Sequence[NodeRef] = (),
        *,
        name: str | None = None,
    ) -> Node:
        """Quokka's reader of a Dataset (its objects were in Redis): `new_input_dataset` by another name."""
        if policy != "default":
            raise GraphError(f"new_input_redis: policy must be 'default' (the only one Quokka had), got {policy!r}")
        return self.new_input_dataset(dataset, ip_to_num_channel, batch_func, dependents, name=name)

    def _task(
        self,
        sources: Mapping[Hashable, NodeRef | Dataset],
        executor: ExecutorSource,
        parallelism: Parallelism,
        partition_key: Mapping[Hashable, PartitionKey],
        blocking: bool,
        name: str | None,
        ip: str = LOCALHOST,
    ) -> TaskSpec:
        before = set(self.specs)
        try:
            return self._checked_task(sources, executor, parallelism, partition_key, blocking, name, ip)
        except GraphError:
            for nid in set(self.specs) - before:  # the Dataset inputs made for it: a node that failed adds nothing
                del self.specs[nid]
            raise

    def _checked_task(
        self,
        sources: Mapping[Hashable, NodeRef | Dataset],
        executor: ExecutorSource,
        parallelism: Parallelism,
        partition_key: Mapping[Hashable, PartitionKey],
        blocking: bool,
        name: str | None,
        ip: str,
    ) -> TaskSpec:
        refs: dict[Hashable, NodeRef] = {}
        if isinstance(sources, Mapping):  # a Dataset as a source: read by an input node of its own (made first: ids)
            refs = {k: self._dataset_input(v, k) if isinstance(v, Dataset) else v for k, v in sources.items()}
        node = self._new_node(name, "task")
        parallelism = channel_count(parallelism, ip, f"node {node}")
        if not isinstance(sources, Mapping) or not sources:
            raise GraphError(f"node {node}: sources must be a non-empty mapping of stream id -> node")
        if not isinstance(partition_key, Mapping):
            raise GraphError(f"node {node}: partition_key must map each stream id of sources to None, a column or a callable")
        if set(sources) != set(partition_key):
            only_s = ", ".join(sorted(map(repr, set(sources) - set(partition_key)))) or "none"
            only_k = ", ".join(sorted(map(repr, set(partition_key) - set(sources)))) or "none"
            raise GraphError(
                f"node {node}: sources and partition_key must have the same stream ids: "
                f"streams without a key: {only_s}; keys without a stream: {only_k}"
            )
        for stream, key in partition_key.items():
            if key is not None and not isinstance(key, str) and not callable(key):
                raise GraphError(
                    f"node {node}: partition key of stream {stream!r} must be None, a column name or a "
                    f"callable, got {type(key).__name__}"
                )
        if not (isinstance(executor, Executor) or callable(executor)):
            raise GraphError(
                f"node {node}: executor must be an Executor, an Executor class or a factory, got {type(executor).__name__}"
            )
        for stream, ref in refs.items():
            if isinstance(ref, Node) and ref.graph != self._id:
                raise GraphError(f"node {node}: source {ref} of stream {stream!r} is a node of another graph")
        if getattr(executor, "batch_format", "arrow") not in ("arrow", "pandas", "object"):
            raise GraphError(
                f"node {node}: the executor's batch_format must be 'arrow', 'pandas' or 'object', "
                f"got {getattr(executor, 'batch_format', None)!r}"
            )
        spec = TaskSpec(node, refs, executor, parallelism, dict(partition_key), blocking)
        self.specs[node.id] = spec
        return spec

    def _dataset_input(self, dataset: Dataset, stream: Hashable) -> Node:
        """The input node that reads a Dataset given as a task node's source, one channel per Dataset channel."""
        if not dataset.materialized:
            raise GraphError(
                f"stream {stream!r}: {dataset.unreadable_reason()} (a Dataset is read by a graph after the one that makes it)"
            )
        return self.new_input_dataset(dataset, dataset.n_channels)

    def new_task_node(
        self,
        sources: Mapping[Hashable, NodeRef | Dataset],
        functionObject: ExecutorSource,
        parallelism: Parallelism,
        partition_key: Mapping[Hashable, PartitionKey],
        ip: str = LOCALHOST,
        *,
        name: str | None = None,
    ) -> Node:
        """Quokka's task node: `new_non_blocking_node` with its argument names and `ip`.

        As in Quokka, one that no node reads is an output node: it runs (its executors' effects
        happen) and its output is dropped, where a `new_non_blocking_node` nobody reads is an error.
        """
        if functionObject is None or isinstance(functionObject, list | tuple):
            raise GraphError(
                "new_task_node takes (sources, functionObject, parallelism, partition_key, ip); Quokka's "
                "(streams, datasets, functionObject, ip_to_num_channel, partition_key) form is "
                "new_non_blocking_node's or new_blocking_node's"
            )
        spec = self._task(sources, functionObject, parallelism, partition_key, False, name, ip)
        self._quokka_tasks.add(spec.node.id)
        return spec.node

    def _sinks(self) -> None:
        """Make the task nodes of new_task_node that no node reads output nodes (blocking, output dropped)."""
        read = set()
        for ref in (r for spec in self.specs.values() if isinstance(spec, TaskSpec) for r in spec.sources.values()):
            with contextlib.suppress(GraphError):  # an unknown node: the planner says so, naming the reader
                read.add(resolve(self.specs, self._id, ref, "").node.id)
        for nid in self._quokka_tasks:  # worked out anew at each initialize(): nodes may have been added since
            spec = self.specs[nid]
            assert isinstance(spec, TaskSpec)
            unread = nid not in read
            spec.blocking = spec.sink = unread
            spec.output = Dataset(spec.node.name, spec.parallelism) if unread else None

    def new_non_blocking_node(self, *args: Any, **kwargs: Any) -> Node:
        """A task node whose output is a stream other task nodes can consume.

        Arguments `(sources, executor, parallelism, partition_key, *, name=None)`, or Quokka's
        `(streams, datasets, functionObject, ip_to_num_channel, partition_key)`. A source may be a
        node or a materialised Dataset.
        """
        sources, executor, parallelism, partition_key, name, ip = node_args(args, kwargs)
        return self._task(sources, executor, parallelism, partition_key, False, name, ip).node

    def new_blocking_node(self, *args: Any, **kwargs: Any) -> Dataset:
        """A task node whose output is materialised as a Dataset when the graph runs.

        Its arguments as `new_non_blocking_node`'s.
        """
        sources, executor, parallelism, partition_key, name, ip = node_args(args, kwargs)
        spec = self._task(sources, executor, parallelism, partition_key, True, name, ip)
        spec.output = Dataset(spec.node.name, spec.parallelism)
        return spec.output

    # --- checking and running -------------------------------------------------------------------
    def initialize(self) -> Plan:
        """Check the graph and plan its execution; errors name the node at fault."""
        if self._ran:
            raise GraphError(f"graph {self._id} has already run; a graph runs once (build a new one)")
        if self.plan is None:
            self._sinks()
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


def _batch_format(fmt: str, node: Node) -> str:
    """An input's batch_format, checked."""
    if fmt not in ("pandas", "object"):
        raise GraphError(f"node {node}: batch_format must be 'pandas' or 'object', got {fmt!r}")
    return fmt
