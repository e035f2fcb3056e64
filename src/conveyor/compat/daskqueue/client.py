"""`Client` and `LocalCluster`: where daskqueue code reached a dask cluster, Conveyor queue servers.

daskqueue put its queues and consumers on the dask cluster a `distributed.Client` reached. Here the
queues live on Conveyor queue servers and the consumers are local consumer processes
(`conveyor.ConsumerPool`), so a client is only the servers: `Client()` starts local ones (as
`Client()` started a local dask cluster), `Client(address=...)` connects to running ones
(`conveyor serve`), and `Client(LocalCluster(...))` uses a cluster's without owning them. Dask's
own options (dashboard, workers, ...) have no counterpart here: they are accepted and ignored,
so that scripts run unchanged; anything else is a `TypeError`.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from conveyor.client.pool import QueuePool as ConveyorPool

# dask's Client / LocalCluster options with no meaning over Conveyor servers (accepted, ignored)
DASK_ONLY = frozenset(
    {
        "n_workers",
        "processes",
        "dashboard_address",
        "direct_to_workers",
        "set_as_default",
        "name",
        "timeout",
        "memory_limit",
        "silence_logs",
        "scheduler_port",
        "worker_class",
        "nthreads",
        "heartbeat_interval",
        "connection_limit",
        "serializers",
        "deserializers",
        "extensions",
        "security",
        "asynchronous_client",
        "scheduler_file",
        "local_directory",
        "protocol",
        "interface",
        "host",
        "resources",
        "loop",
    }
)


def check_dask_options(what: str, options: dict[str, object]) -> None:
    """Dask options are ignored; an unknown keyword is a mistake worth saying (a typo, say)."""
    unknown = sorted(set(options) - DASK_ONLY)
    if unknown:
        raise TypeError(
            f"{what}: unexpected keyword argument(s) {', '.join(unknown)} (dask options accepted and "
            f"ignored: {', '.join(sorted(DASK_ONLY))})"
        )
    if options.get("asynchronous_client") or options.get("asynchronous"):
        raise TypeError(f"{what}: asynchronous clients are not supported")


def _threads(threads_per_worker: int | None) -> int | None:
    if threads_per_worker is None:
        return None
    if isinstance(threads_per_worker, bool) or operator.index(threads_per_worker) < 1:
        raise ValueError(f"threads_per_worker must be an int >= 1, got {threads_per_worker!r}")
    return int(threads_per_worker)


class LocalCluster:
    """Local Conveyor queue servers, standing in for `distributed.LocalCluster`.

    Child processes, durable, data in temporary directories unless `data_dir` is given. `close()`
    stops them.
    """

    def __init__(
        self,
        n_workers: int | None = None,
        threads_per_worker: int | None = None,
        *,
        n_servers: int = 2,
        data_dir: str | Path | None = None,
        **dask_options: object,
    ) -> None:
        check_dask_options("LocalCluster", dask_options)
        self.threads_per_worker = _threads(threads_per_worker)
        self.pool = ConveyorPool.local(n_servers=n_servers, data_dir=data_dir)

    @property
    def scheduler_address(self) -> str:
        """The servers' addresses, comma-separated: what `Client(address=...)` takes."""
        return ",".join(self.pool.addresses)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalCluster({self.scheduler_address!r})"


class Client:
    """Conveyor queue servers for daskqueue's `QueuePool` and `ConsumerPool` (see the module docstring).

    `address`: None (start local servers, stopped by `close()`), a `LocalCluster`, or the address(es)
    of running servers (a list, or one comma-separated string) with their `token`.
    `threads_per_worker`: the most threads each consumer runs items in (dask ran an actor's items
    in its worker's threads); None: Conveyor's default.
    """

    def __init__(
        self,
        address: str | Sequence[str] | LocalCluster | None = None,
        *,
        token: str | None = None,
        threads_per_worker: int | None = None,
        n_servers: int = 2,
        data_dir: str | Path | None = None,
        **dask_options: object,
    ) -> None:
        check_dask_options("Client", dask_options)
        self.threads_per_worker = _threads(threads_per_worker)
        self._cluster: LocalCluster | None = None  # one this client started, and stops
        self._owns_pool = True  # not a LocalCluster's given: its owner closes that
        if address is None:
            self._cluster = LocalCluster(n_servers=n_servers, data_dir=data_dir)
            self.pool = self._cluster.pool
        elif isinstance(address, LocalCluster):
            self.pool, self._owns_pool = address.pool, False
            self.threads_per_worker = self.threads_per_worker or address.threads_per_worker
        elif isinstance(address, str) or (isinstance(address, Sequence) and all(isinstance(a, str) for a in address)):
            if not address:
                raise ValueError("Client: no server address given")
            self.pool = ConveyorPool.connect(address, token)
        else:
            raise TypeError(
                f"Client: address must be a server address, a list of them, a LocalCluster or None, got {type(address).__name__}"
            )
        self.closed = False

    @property
    def scheduler_address(self) -> str:
        return ",".join(self.pool.addresses)

    def close(self) -> None:
        """Close the connections, and stop the servers this client started. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._cluster is not None:
            self._cluster.close()
        elif self._owns_pool:
            self.pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client: Conveyor servers {self.pool.addresses}>"
