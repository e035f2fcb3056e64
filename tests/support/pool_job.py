"""A process that starts a local pool and consumer processes, then waits to be killed.

For tests/worker/test_worker.py: what it started must not outlive it.

Usage: python tests/support/pool_job.py DATA_DIR LOG TASKS [fork]

It starts 2 durable servers under DATA_DIR (`-`: temporary directories) and 2 consumers, publishes
TASKS `slow_once` tasks (1 s each, noted in LOG as they finish), and once two are running prints a
JSON line with the servers' and consumers' pids and the temporary directories. With `fork`, it first
forks a child that sleeps (holding every descriptor it inherited, so pipe ends the servers and
consumers watch stay open), and adds its pid.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(data_dir: str, log: str, tasks: int, fork: bool) -> None:
    from conveyor.client.pool import QueuePool
    from conveyor.worker import ConsumerPool
    from tests.support import worker_tasks

    pool = QueuePool.local(2, data_dir=None if data_dir == "-" else data_dir)
    cp = ConsumerPool(pool, 2, queues=["jobs"], concurrency=2, task_modules=["tests.support.worker_tasks"]).start()
    worker_tasks.slow_once.publish_many([(log, 1.0)] * tasks, _pool=pool)
    deadline = time.monotonic() + 60
    while pool.stats("jobs")["jobs"].delivered < 2:
        if time.monotonic() > deadline:
            raise SystemExit("no task started within 60 s")
        time.sleep(0.01)
    forked = 0
    if fork and (forked := os.fork()) == 0:
        time.sleep(60)
        os._exit(0)
    print(
        json.dumps(
            {
                "servers": [p.pid for p in pool.servers.processes],
                "consumers": [p.pid for p in cp.processes],
                "temporary": [str(d) for d in pool.servers.temporary_dirs],
                "forked": forked,
            }
        ),
        flush=True,
    )
    time.sleep(600)


if __name__ == "__main__":  # consumer processes import this module too (forkserver): start nothing then
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["fork"])
