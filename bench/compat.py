"""The library names the benchmarks use, from this layout or from the ones before it.

The layout before this one is that of revision 07aed37 and earlier, so that `bench/compare.py
--base <such a revision>` runs this tree's scripts against both. The consumer options are
ConsumerOptions' names, or those before it (`max_concurrency`, and `concurrency` for thread or
process). Drop a fallback once no comparison needs that old a base.
"""

from __future__ import annotations

from typing import Any

try:
    from conveyor.cli.corpus import busy, documents
    from conveyor.client.pool import QueuePool
    from conveyor.client.queue_client import QueueClient
    from conveyor.protocol import requests as calls
    from conveyor.server.processes import spawn_server, stop_server
except ImportError:  # the flat layout: conveyor.pool, conveyor.client, conveyor.calls, conveyor.workloads
    from conveyor.pool import QueuePool, spawn_server, stop_server
    from conveyor.workloads import busy, documents

    from conveyor import calls
    from conveyor.client import QueueClient

try:
    from conveyor.worker.options import ConsumerOptions
except ImportError:  # before ConsumerOptions: the count was max_concurrency, and thread or process was concurrency
    ConsumerOptions = None  # type: ignore[assignment, misc]


def sharded(pool: Any) -> Any:
    """A pool's sharded client (queue operations such as `workers()`): `pool.queues`, or the pool itself before it held one."""
    return getattr(pool, "queues", pool)


def consumer_keywords(options: dict[str, Any]) -> dict[str, Any]:
    """Consumer options (`concurrency` a count, `pool` thread or process) under the names this tree's ConsumerPool takes."""
    if ConsumerOptions is not None:
        return options
    old = {"concurrency": "max_concurrency", "pool": "concurrency"}
    return {old.get(k, k): v for k, v in options.items()}


__all__ = [
    "QueueClient",
    "QueuePool",
    "busy",
    "calls",
    "consumer_keywords",
    "documents",
    "sharded",
    "spawn_server",
    "stop_server",
]
