"""The queue server: an asyncio process hosting named queues (each a store) behind the protocol.

- `queue_server`: `QueueServer`, accepting connections and running their requests;
- `handlers`: one handler per operation declared in `conveyor.protocol.declarations`;
- `queues`: the hosted queues (`QueueHost`, `HostedQueue`), their settings and descriptor budget;
- `wakeups`: waking waiters (a queue may have new work, messages were settled);
- `group_commit`: writes answered once durable, one fsync for many writes;
- `connection_leases`: the leases a connection took with `tie`, ended when its peer closes it;
- `idempotency`: the idempotency keys of a queue;
- `blobs`: content-addressed bytes beside the queues (pickled functions);
- `runtime`: the event loop, the descriptor limit, watching the parent process;
- `processes`: starting and stopping `conveyor serve` as a child process.
"""
