"""Clients of queue servers: `QueueClient` (one server, one connection) and `QueuePool` (sharded
over several servers, with task submission and gathering)."""

from __future__ import annotations

from conveyor.client.pool import QueuePool
from conveyor.client.queue_client import QueueClient

__all__ = ["QueueClient", "QueuePool"]
