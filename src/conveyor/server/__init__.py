"""The queue server: an asyncio process hosting named queues (each a store) behind the protocol.

- `queue_server`: `QueueServer`, accepting connections and running their requests;
- `handlers`: one handler per operation declared in `conveyor.protocol.declarations`;
- `queues`: the hosted queues (`QueueHost`, `HostedQueue`), their settings and descriptor budget;
- `signals`: waking waiters, and group commit (one fsync for many writes);
- `idempotency`: the idempotency keys of a queue;
- `blobs`: content-addressed bytes beside the queues (pickled functions);
- `runtime`: the event loop, the descriptor limit, watching the parent process;
- `processes`: starting and stopping `conveyor serve` as a child process.
"""
