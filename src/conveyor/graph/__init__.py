"""The TaskGraph runtime: a dataflow of Arrow batches between per-channel executors, run on Spark.

The API follows Quokka's runtime: a `TaskGraph` gets input nodes (CSV, Parquet, or a `Dataset` of an
earlier graph) and task nodes, each running one `Executor` per channel; the output of a blocking node
is a `Dataset`. `run()` executes the graph as Spark DataFrames (see docs/graph.md).

Modules, in the order a graph passes through them:
- `taskgraph`: the builder (`TaskGraph`) and its checks of each node as it is added;
- `nodes`: the recorded nodes (handles and specs) that the planner and the runtime read;
- `plan`: the checked graph: edges, dependency levels, inputs read inside their consumer;
- `runtime`: the planned graph as Spark DataFrames, one Spark job per blocking node;
- `stages`: what runs inside the Spark tasks (input readers, task-node channels);
- `readers`: CSV and Parquet read with pyarrow, from the file systems of `filesystems` (local, S3);
- `channels`: batches, their encoding and routing; `placement`: Quokka's `{machine: channels}`;
- `executors` and `join`: the executor API and the stock executors; `dataset`: `Dataset`;
- `layout`: the rows that carry batches in Spark, and their sizes; `errors`: `GraphError`.

Importing this package loads pandas and pyarrow, not pyspark (it is imported when a graph runs). It
needs the `spark` extra (`pip install 'conveyor[spark]'`): without it, importing says so.
"""

from __future__ import annotations

from conveyor.extras import SPARK, require

require(SPARK, "conveyor.graph (the TaskGraph)")

from .channels import Router
from .dataset import Dataset
from .errors import GraphError
from .executors import Count, Executor, FilterProject, HashAggregate, HashJoin, Limit, Map, Sort, StatelessExecutor
from .nodes import Node
from .readers import SourceReader
from .runtime import RunStats
from .taskgraph import TaskGraph

__all__ = [
    "Count",
    "Dataset",
    "Executor",
    "FilterProject",
    "GraphError",
    "HashAggregate",
    "HashJoin",
    "Limit",
    "Map",
    "Node",
    "Router",
    "RunStats",
    "Sort",
    "SourceReader",
    "StatelessExecutor",
    "TaskGraph",
]
