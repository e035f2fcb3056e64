"""Conveyor: a durable distributed task queue and dataflow runtime on Apache Spark."""

from __future__ import annotations

from .errors import ConveyorError, CorruptStoreError
from .lazy import lazy_attributes
from .message import Message, Status
from .tasks import Task, task

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
    "TaskGraph": "conveyor.graph",
    "Executor": "conveyor.graph",
    "Dataset": "conveyor.graph",
    "local": "conveyor.spark.embedded",
}


__getattr__ = lazy_attributes(__name__, _LAZY)
