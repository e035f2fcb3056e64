"""Conveyor: a durable distributed task queue and dataflow runtime on Apache Spark."""

from __future__ import annotations

from conveyor.errors import ConveyorError, CorruptStoreError
from conveyor.lazy import lazy_attributes
from conveyor.protocol.message import Message, Status
from conveyor.tasks.definition import Task, task

__version__ = "0.1.0"
__all__ = [
    "ConveyorError",
    "CorruptStoreError",
    "Dataset",
    "Executor",
    "Message",
    "Status",
    "Task",
    "TaskGraph",
    "__version__",
    "local",
    "task",
]

# The TaskGraph API lives in conveyor.spark and imports pyarrow and pandas (and pyspark when it
# runs): load it on first use so that `import conveyor` stays light.
_LAZY = {
    "TaskGraph": "conveyor.spark.graph",
    "Executor": "conveyor.spark.executors",
    "Dataset": "conveyor.spark.dataset",
    "local": "conveyor.spark.embedded",
}


__getattr__ = lazy_attributes(__name__, _LAZY)
