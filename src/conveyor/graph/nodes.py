"""The nodes of a TaskGraph as recorded while it is built: handles, and the specs of input and task nodes.

The builder (`taskgraph`), the planner (`plan`) and the runtime (`runtime`) all read these.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import pandas as pd

from .channels import PartitionKey
from .dataset import Dataset
from .errors import GraphError
from .executors import Executor
from .layout import CSV_STRIDE_BYTES
from .readers import SourceReader


class NodeKind(Enum):
    CSV = "csv"
    PARQUET = "parquet"
    DATASET = "dataset"
    READER = "reader"  # a SourceReader of the user's own


@dataclass(frozen=True)
class Node:
    """A handle on a node of a TaskGraph (what the `new_*` methods return, except blocking nodes)."""

    graph: int
    id: int
    name: str

    def __str__(self) -> str:
        return repr(self.name)


NodeRef = Node | int | str
BatchFunc = Callable[[pd.DataFrame], Any] | Callable[[Any], Any]
ExecutorSource = Executor | type | Callable[[], Executor]


@dataclass
class InputSpec:
    """An input node: where its batches come from and how they are read."""

    node: Node
    kind: NodeKind
    parallelism: int
    batch_func: BatchFunc | None
    dependents: tuple[NodeRef, ...]
    path: str | None = None
    names: tuple[str | None, ...] = ()
    sep: str = ","
    header: bool = False  # CSV: each file starts with a line of column names
    stride: int = CSV_STRIDE_BYTES
    columns: tuple[str, ...] | None = None
    filters: Any = None
    dataset: Dataset | None = None
    s3_here: bool = False  # given in Quokka's bucket + key form: an s3:// path is read by Conveyor (filesystems)
    reader: SourceReader | None = None
    batch_format: str = "pandas"  # what batch_func gets and gives (stages.InputTask)


@dataclass
class TaskSpec:
    """A task node: its sources (stream id -> node), executor, channels and partition keys."""

    node: Node
    sources: dict[Hashable, NodeRef]
    executor: ExecutorSource
    parallelism: int
    partition_key: dict[Hashable, PartitionKey]
    blocking: bool
    output: Dataset | None = None
    sink: bool = False  # an output node (Quokka's unread task node): run as a blocking node, its output dropped


Spec = InputSpec | TaskSpec


def resolve(specs: Mapping[int, Spec], graph: int, ref: NodeRef, what: str) -> Spec:
    """The spec a node reference (handle, id or name) of graph `graph` stands for; an unknown one is an error."""
    if isinstance(ref, Node):
        if ref.graph == graph and ref.id in specs:
            return specs[ref.id]
    elif isinstance(ref, int) and not isinstance(ref, bool):
        if ref in specs:
            return specs[ref]
    elif isinstance(ref, str):
        for spec in specs.values():
            if spec.node.name == ref:
                return spec
    raise GraphError(f"{what}: unknown node {ref!r} (not a node of this graph)")
