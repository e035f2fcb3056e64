"""The queue server: an asyncio process hosting named queues (each a store) behind the protocol.

`queue_server` accepts connections and runs requests; `handlers` holds one handler per operation;
`queues` hosts the named queues, their settings and blobs; `idempotency` remembers idempotency
keys; `processes` starts and stops server processes.
"""
