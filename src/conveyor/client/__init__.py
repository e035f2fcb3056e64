"""Clients of queue servers: `QueueClient` and `QueuePool`.

`QueueClient` is a client of one server, over one connection; `QueuePool` is sharded over several
servers, with task submission and gathering.
"""

from __future__ import annotations

from conveyor.client.pool import QueuePool
from conveyor.client.queue_client import QueueClient

__all__ = ["QueueClient", "QueuePool"]
