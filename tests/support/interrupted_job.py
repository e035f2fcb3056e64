"""A program interrupted by Ctrl-C while it works.

tests/test_interrupts.py sends SIGINT to its process group, as a terminal does.

Usage: python tests/support/interrupted_job.py join MARK | map MARK

`join`: a local pool (2 servers) and a `ConsumerPool` of 2 started (not in a `with` block: the
pool's close must stop them), 400 tasks of 1 s published, then `join()`. `map`: `conveyor.local()`
(local[2]) and `conveyor.spark.map` over 2,000 rows of 0.05 s each. Either writes MARK once a task
has run, so the test interrupts work under way.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main(mode: str, mark: str) -> None:
    import conveyor
    from conveyor.client.pool import QueuePool
    from conveyor.worker import ConsumerPool

    def task(x: int) -> int:
        Path(mark).touch()
        time.sleep(1.0)  # running when Ctrl-C comes: settled only if the servers outlive the consumers
        return x

    def row(r: dict[str, int]) -> dict[str, int]:
        Path(mark).touch()
        time.sleep(0.05)
        return {"i": r["id"]}

    if mode == "join":
        with QueuePool.local(n_servers=2) as pool:
            consumers = ConsumerPool(pool, 2, concurrency=2).start()
            pool.map(task, range(400))
            consumers.join(progress=False)
    else:
        import conveyor.spark as cs

        with conveyor.local(master="local[2]") as env:
            cs.map(env.spark.range(2000, numPartitions=2), row, schema="i long", progress=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
