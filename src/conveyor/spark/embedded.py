"""`conveyor.local()`: the embedded default — a local Spark session and local durable queue servers.

Inside the `with` block, `conveyor.spark.map` (and anything else given no pool) uses them. On exit
the servers stop (SIGTERM: a clean stop) and, if the block started it, the Spark session too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.client.pool import QueuePool
from conveyor.spark.session import get_or_create_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# local[*, 4]: every core, and a failed task is retried (plain local mode fails the job at once)
DEFAULT_MASTER = "local[*,4]"


@dataclass(frozen=True)
class Embedded:
    """What `conveyor.local()` yields: the Spark session and the queue pool."""

    spark: SparkSession
    pool: QueuePool
    data_dir: Path | None


_stack: list[Embedded] = []
_lock = threading.Lock()


def current() -> Embedded | None:
    """The innermost active `conveyor.local()`, or None."""
    with _lock:
        return _stack[-1] if _stack else None


@contextmanager
def local(data_dir: str | Path | None = None, *, n_servers: int = 2, master: str | None = None,
          app_name: str = "conveyor", fsync: str = "batch") -> Iterator[Embedded]:  # fmt: skip
    """A local Spark session (`local[*,4]` unless one is active) and `n_servers` durable queue servers.

    data_dir: where the queues live (default: a temporary directory, removed on exit).
    """
    from pyspark.sql import SparkSession

    had_session = SparkSession.getActiveSession() is not None
    spark = get_or_create_session(master or DEFAULT_MASTER, app_name)
    try:
        with QueuePool.local(n_servers=n_servers, durable=True, data_dir=data_dir, fsync=fsync) as pool:
            env = Embedded(spark, pool, None if data_dir is None else Path(data_dir))
            with _lock:
                _stack.append(env)
            try:
                yield env
            finally:
                with _lock:
                    _stack.remove(env)
    finally:
        if not had_session:
            spark.stop()
