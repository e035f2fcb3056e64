"""A program whose consumer of async slots is stopped while a plain task of its hangs.

tests/worker/test_async_tasks.py runs it and waits, with a bound, for it to exit: the hung task's
thread must not keep the interpreter from exiting (a non-daemon thread is joined at exit, forever).

Usage: python tests/support/async_hung_exit.py MARK

A local pool, one plain task that writes MARK and then sleeps for an hour, a consumer with
pool="async" in a thread; once MARK exists, a hard stop. Prints "stopped" once the consumer has
returned; then the program ends.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

WAIT_S = 60.0  # for the task to start, and for the consumer to return: bounds for a loaded machine


def main(mark: str) -> None:
    from conveyor.client.pool import QueuePool
    from conveyor.worker import Consumer

    def hangs() -> None:
        Path(mark).touch()
        time.sleep(3600)

    with QueuePool.local() as pool:
        pool.submit(hangs, _queue="jobs")
        c = Consumer(pool.queues, ["jobs"], pool="async")
        t = threading.Thread(target=c.run, name="consumer")
        t.start()
        deadline = time.monotonic() + WAIT_S
        while not Path(mark).exists():  # polled: the task runs in another thread, and says so only in a file
            if time.monotonic() > deadline:
                sys.exit(f"the task did not start within {WAIT_S:g} s")
            time.sleep(0.05)
        c.stop(graceful=False)
        t.join(WAIT_S)
        if t.is_alive():
            sys.exit(f"the consumer did not return within {WAIT_S:g} s of a hard stop")
        print("stopped", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
