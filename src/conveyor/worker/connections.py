"""A worker's own connections to the servers, in each of its task threads or child processes.

They fetch the pickled functions of ad-hoc tasks, and are the backend a running task may use
(`conveyor.tasks.runner.worker_backend`): a `map` message split into rows puts the rows back
through them. Never the consumer's own connections, which its fetches and acks keep busy.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

from conveyor.client.backend import QueueBackend
from conveyor.errors import ConveyorError


@dataclass(frozen=True)
class WorkerConnections:
    """`fetch(digest)` (call it) for function bytes; `pool` for the tasks."""

    pool: QueueBackend

    def __call__(self, digest: str) -> bytes:
        for shard in range(len(self.pool)):
            data = self.pool.get_blob(digest, shard)
            if data is not None:
                return data
        raise ConveyorError(f"function {digest[:12]}... is on none of the servers {self.pool.addresses}")


@dataclass(frozen=True)
class BlobFetcher:
    """Picklable: in a worker (thread or child process) it gives `WorkerConnections` of its own."""

    pool: QueueBackend

    def __call__(self) -> WorkerConnections:
        return WorkerConnections(pickle.loads(pickle.dumps(self.pool)))  # connections of its own, never the consumer's
