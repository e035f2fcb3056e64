"""A worker's own connections to the servers: the consumer's, its settler's and its tasks'.

Those of the consumer and its settler (`own_connections`), and those of each of its task threads or
child processes.

A task's connections fetch the pickled functions of ad-hoc tasks, and are the backend a running task
may use (`conveyor.tasks.runner.worker_backend`): a `map` message split into rows puts the rows back
through them. Never the consumer's own connections, which its fetches and acks keep busy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from conveyor.client.backend import QueueBackend
from conveyor.client.transport import Transport
from conveyor.errors import ConveyorError

B = TypeVar("B", bound=QueueBackend)
# A consumer's and a settler's connections try once per request to connect: each retries a server out of
# reach on its own terms, serving the others meanwhile, and a stop never waits on a connection's backoff
ONE_ATTEMPT = 0.0


def own_connections(pool: B, connect_s: float | None = None) -> B:
    """A copy of `pool` on connections of its own (an in-process backend is itself).

    Its requests wait at most `connect_s` for a connection (None: as `pool`'s; ONE_ATTEMPT: one
    attempt each).
    """
    mine = pool.with_own_connections()
    for c in mine.clients:
        if isinstance(c, Transport) and connect_s is not None:
            c.connect_timeout = connect_s
    return mine


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
        return WorkerConnections(own_connections(self.pool))  # never the consumer's
