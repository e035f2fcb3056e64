"""Conveyor: a durable distributed task queue and dataflow runtime on Apache Spark."""

from __future__ import annotations

from .errors import ConveyorError, CorruptStoreError
from .message import Message, Status
from .tasks import Task, task

__version__ = "0.1.0"
__all__ = ["ConveyorError", "CorruptStoreError", "Message", "Status", "Task", "__version__", "task"]
