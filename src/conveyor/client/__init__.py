"""Clients of queue servers: `QueueClient` (one server, one connection) and `QueuePool` (sharded
over several servers, with task submission and gathering)."""
