"""The library names the benchmarks use, from this layout or from the one before it.

The one before it is that of revision 07aed37 and earlier, so that `bench/compare.py --base <such a
revision>` runs this tree's scripts against both. Drop the fallback once no comparison needs that
old a base.
"""

from __future__ import annotations

try:
    from conveyor.cli.corpus import busy, documents
    from conveyor.client.pool import QueuePool
    from conveyor.client.queue_client import QueueClient
    from conveyor.protocol import requests as calls
    from conveyor.server.processes import spawn_server, stop_server
except ImportError:  # the flat layout: conveyor.pool, conveyor.client, conveyor.calls, conveyor.workloads
    from conveyor.workloads import busy, documents

    from conveyor import calls
    from conveyor.client import QueueClient
    from conveyor.pool import QueuePool, spawn_server, stop_server

__all__ = ["QueueClient", "QueuePool", "busy", "calls", "documents", "spawn_server", "stop_server"]
