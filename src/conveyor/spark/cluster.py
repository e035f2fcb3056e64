"""Queue servers beside the Spark driver: a cluster with nothing to deploy.

Given no pool on a cluster, `conveyor.spark.map` and `SparkConsumerPool` start queue servers on
the driver's host for the call (`driver_pool`); `conveyor.cluster(spark)` keeps them for several
calls and makes them the default pool, as `conveyor.local()` does on one machine. They listen on
the address the executors already use to reach the driver (`spark.driver.host`, or the address of
a network interface the user names), with a generated token and TLS (a self-signed certificate,
pinned by fingerprint): the pool pickled to the executors carries both. Their data lives in a
temporary directory under the driver's local directory (`spark.local.dir`) and goes with them.
Before any work the executors are checked (`conveyor.spark.preflight`).

What is lost when: the servers live in the driver's process tree, so losing the driver's host
loses the queues, as it loses the Spark application anyway; losing an executor loses nothing
(its messages come back when their leases end). For queues that must outlive the driver, run
`conveyor serve` on hosts of their own and pass `queue_pool=` (see docs/deploy.md).

Under Spark Connect the Python client is not the driver, and there is no `spark.driver.host` to
follow: the servers start where the client runs, on the address given by `host=` (or
`interface=`), which the executors must reach. Without one, `cluster` refuses rather than guess.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conveyor.client.pool import QueuePool
from conveyor.errors import ConveyorError
from conveyor.protocol.auth import is_loopback
from conveyor.server.runtime import interface_address
from conveyor.spark.preflight import preflight
from conveyor.spark.session import conf
from conveyor.tasks.publish import default_pool

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("conveyor.spark")

DRIVER_SERVERS = 2


def is_local(spark: SparkSession) -> bool:
    """Whether Spark runs on this machine only (a local master)."""
    return conf(spark, "spark.master").startswith("local")


def driver_host(spark: SparkSession, host: str | None = None, interface: str | None = None) -> str:
    """The address for servers beside the driver.

    `host`, the address of `interface`, or the one the executors use to reach the driver
    (`spark.driver.host`).
    """
    if host is not None and interface is not None:
        raise ValueError("give host= or interface=, not both")
    if host is not None:
        return host
    if interface is not None:
        return interface_address(interface)
    try:
        spark.sparkContext  # noqa: B018 - Spark Connect has none: its driver is elsewhere
    except Exception:
        raise ConveyorError(
            "under Spark Connect the queue servers cannot start beside the driver, which runs "
            "elsewhere: pass host= (or interface=) naming an address of this machine that the "
            "executors reach, or queue_pool=QueuePool.connect([...]) with servers of your own"
        ) from None
    found = conf(spark, "spark.driver.host")
    if not found or (is_loopback(found) and not is_local(spark)):
        shown = repr(found) if found else "unset"
        raise ConveyorError(
            f"spark.driver.host is {shown}: executors on other hosts could not reach queue servers "
            "there. Set spark.driver.host to an address they reach, or pass host= or interface="
        )
    return found


def _local_dir(spark: SparkSession) -> str | None:
    """The driver's scratch directory (`spark.local.dir`: the first of a list), or None: the system's."""
    return conf(spark, "spark.local.dir").split(",")[0].strip() or None


def driver_pool(
    spark: SparkSession,
    n_servers: int | None = None,
    *,
    host: str | None = None,
    interface: str | None = None,
    ports: Sequence[int] | None = None,
) -> QueuePool:
    """Start durable queue servers beside the driver (see the module docstring).

    On free ports or on `ports`; close the pool to stop them and remove their data. `n_servers`:
    default DRIVER_SERVERS, or one per port of `ports`.
    """
    if n_servers is None:
        n_servers = DRIVER_SERVERS if ports is None else len(ports)
    address = driver_host(spark, host, interface)
    pool = QueuePool.local(
        n_servers, durable=True, host=address, temp_dir=_local_dir(spark) or tempfile.gettempdir(), ports=ports
    )
    log.info(
        "conveyor: %d queue server(s) beside the driver at %s%s",
        n_servers,
        ", ".join(pool.addresses),
        "" if pool.queues.clients[0].tls is None else " (TLS, token)",
    )
    return pool


@dataclass(frozen=True)
class Cluster:
    """What `conveyor.cluster()` yields: the Spark session and the pool of servers beside the driver."""

    spark: SparkSession
    pool: QueuePool


@contextmanager
def cluster(
    spark: SparkSession | None = None,
    *,
    n_servers: int | None = None,
    host: str | None = None,
    interface: str | None = None,
    ports: Sequence[int] | None = None,
    task_modules: Sequence[str] = (),
    check: bool = True,
) -> Iterator[Cluster]:
    """Queue servers beside the driver of `spark` for the `with` block, as its default pool.

    `spark`: default the active session. `conveyor.spark.map`, `SparkConsumerPool`, `publish` and
    task handles given no pool use them. `n_servers` and `ports` as for `driver_pool` (`ports` for a
    firewall that opens only those; default: free ports). `check`: run the pre-flight (with
    `task_modules`) first.
    """
    from pyspark.sql import SparkSession

    spark = spark or SparkSession.getActiveSession()
    if spark is None:
        raise ConveyorError("conveyor.cluster(): no active Spark session: create yours (SparkSession.builder...) first")
    with driver_pool(spark, n_servers, host=host, interface=interface, ports=ports) as pool, default_pool(pool):
        if check and not is_local(spark):
            preflight(spark, pool.queues, task_modules)
        yield Cluster(spark, pool)
