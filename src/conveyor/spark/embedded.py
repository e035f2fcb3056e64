"""`conveyor.local()`: the embedded default — a local Spark session and local durable queue servers.

Inside the `with` block its pool is the default pool (`conveyor.set_default_pool`): `conveyor.spark.map`,
`task.publish()`, task handles and anything else given no pool use it. On exit
the servers stop (SIGTERM: a clean stop) and, if the block started it, the Spark session too. A
Ctrl-C does not reach the servers (they run in a session of their own): an interrupted `map` drops
its queue on them before they stop, and says that nothing is left behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.client.pool import QueuePool
from conveyor.errors import ConveyorError
from conveyor.spark.session import get_or_create_session
from conveyor.tasks.publish import default_pool

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


@contextmanager
def local(
    data_dir: str | Path | None = None,
    *,
    n_servers: int = 2,
    master: str | None = None,
    app_name: str = "conveyor",
    fsync: str = "batch",
) -> Iterator[Embedded]:
    """A local Spark session (`local[*,4]` unless one is active) and `n_servers` durable queue servers.

    data_dir: where the queues live (default: a temporary directory, removed on exit).
    Local masters only: given a cluster's master (or inside a session on one) it refuses, with what
    to do instead.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    _check_local(master if master is not None or active is None else active.conf.get("spark.master", ""))
    spark = get_or_create_session(master or DEFAULT_MASTER, app_name)
    try:
        # the one ambient pool: publish, spark.map and task handles given no pool use it
        with QueuePool.local(n_servers=n_servers, durable=True, data_dir=data_dir, fsync=fsync) as pool, default_pool(pool):
            yield Embedded(spark, pool, None if data_dir is None else Path(data_dir))
    finally:
        if active is None:
            spark.stop()


def _check_local(master: str | None) -> None:
    """`local()` is for one machine: its servers listen on 127.0.0.1, its session binds the driver to it.

    On a cluster the executors could reach neither (they would crash-loop trying), so refuse
    (`conveyor.cluster` is the cluster's counterpart).
    """
    if master is None or master.startswith("local"):
        return
    raise ConveyorError(
        f"conveyor.local() runs everything on this machine, but the Spark master is {master!r}: its "
        "executors could not reach servers or a driver on 127.0.0.1. On a cluster, create your own "
        "SparkSession and use conveyor.cluster(spark) (queue servers beside the driver, with a token "
        "and TLS), or servers of your own (conveyor serve --host ADDRESS --token-file FILE --tls-cert "
        "... on each server host) passed as queue_pool=QueuePool.connect([...]) (see docs/deploy.md)"
    )
