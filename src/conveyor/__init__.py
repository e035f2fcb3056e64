"""Conveyor: a durable distributed task queue and dataflow runtime on Apache Spark.

The public API is what this package exports (see docs/architecture.md for the packages behind it):

- tasks: `task`, `Task`, `TaskHandle` (`handle.result(timeout=...)`, `handle.status()`, `handle.cancel()`), `Args`;
- queues: `QueuePool` (servers used as one; `submit`, `map`, `gather`), `QueueClient` (one server);
- workers: `ConsumerPool`, `ConsumerOptions` (how each consumer runs tasks, for every way to start one);
- the ambient pool: `local()` (an embedded Spark session and local servers), `cluster()` (servers
  beside a cluster's Spark driver), `set_default_pool`,
  `default_pool`, `get_default_pool`: every API that takes an optional pool uses it;
- dataflow: `TaskGraph`, `Executor`, `Dataset` (after Quokka's runtime API);
- the errors a user catches, all `ConveyorError`s.

`conveyor.spark.map` maps a DataFrame through the queue. Everything but the task API loads on first
use, so `import conveyor` stays light.
"""

from __future__ import annotations

from conveyor.errors import (
    AuthError,
    ConfigError,
    ConnectionLostError,
    ConveyorError,
    DiskFullError,
    NoPublisherError,
    NoSlotsError,
    PreflightError,
    ProtocolError,
    RequestError,
    SerializationError,
    ServerBusyError,
    ServerUnreachableError,
    StoreError,
    TaskArgumentError,
    TaskError,
    TaskFailedError,
    TaskOptionError,
    UnknownTaskError,
)
from conveyor.lazy import lazy_attributes
from conveyor.tasks import Args, Task, TaskHandle, default_pool, get_default_pool, set_default_pool, task

__version__ = "0.1.0"

_LAZY = {
    "QueuePool": "conveyor.client.pool",
    "QueueClient": "conveyor.client.queue_client",
    "ConsumerPool": "conveyor.worker.consumer_pool",
    "ConsumerOptions": "conveyor.worker.options",
    "local": "conveyor.spark.embedded",
    "cluster": "conveyor.spark.cluster",
    "TaskGraph": "conveyor.graph",
    "Executor": "conveyor.graph",
    "Dataset": "conveyor.graph",
    "GraphError": "conveyor.graph",
}

__all__ = [
    "Args",
    "AuthError",
    "ConfigError",
    "ConnectionLostError",
    "ConveyorError",
    "DiskFullError",
    "NoPublisherError",
    "NoSlotsError",
    "PreflightError",
    "ProtocolError",
    "RequestError",
    "SerializationError",
    "ServerBusyError",
    "ServerUnreachableError",
    "StoreError",
    "Task",
    "TaskArgumentError",
    "TaskError",
    "TaskFailedError",
    "TaskHandle",
    "TaskOptionError",
    "UnknownTaskError",
    "__version__",
    "default_pool",
    "get_default_pool",
    "set_default_pool",
    "task",
    *_LAZY,
]

__getattr__ = lazy_attributes(__name__, _LAZY)
