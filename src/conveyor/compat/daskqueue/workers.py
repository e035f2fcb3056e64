"""daskqueue's `ConsumerPool`: `n_consumers` Conveyor consumer processes, each holding one consumer object.

daskqueue's options map onto Conveyor's: `batch_size` is the messages a fetch asks for,
`max_concurrency` the threads an item runs in (bounded by the client's `threads_per_worker`),
`retries` a cap on the attempts of a failing item (`CapRetries`, before Conveyor's backoff), and
`early_ack` Conveyor's ack on delivery. `join` waits on the servers, not in a sleep loop.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import cloudpickle

from conveyor.compat.daskqueue.client import Client
from conveyor.compat.daskqueue.consumers import CapRetries, ConsumerBaseClass, GeneralConsumer, Hooks
from conveyor.compat.daskqueue.pools import QueuePool, check_seconds, count_arg
from conveyor.worker.consumer_pool import ConsumerPool as ConveyorConsumerPool
from conveyor.worker.middleware import Retries, TimeLimits
from conveyor.worker.stats import ConsumerStats

log = logging.getLogger("conveyor.compat.daskqueue")

# daskqueue's max_concurrency (default 10,000) bounded the items in flight on a worker's thread pool,
# not threads: above this many, each consumer runs Conveyor's default number of threads
MAX_THREADS = 256


class ConsumerRef:
    """One consumer of a pool (what `consumer_pool[i]` gives): its name and what it sent back when it stopped."""

    def __init__(self, pool: ConsumerPool, index: int, name: str) -> None:
        self._pool, self.index, self.name = pool, index, name

    def _said(self) -> list[tuple[int, bytes | None]]:
        return [s for s in self._pool._pool.farewells.get(self.index, []) if isinstance(s, tuple)]

    def len_items(self) -> int:
        """Items it received (counted as each of its processes stops: 0 before the first stops)."""
        return sum(n for n, _ in self._said())

    def get_results(self) -> Any:
        """What its `get_results()` returned when it stopped.

        Over several processes (a restart after a crash, a `start` after a `join`), dicts merged and
        lists joined in order, else the last. {} for a `GeneralConsumer` that has not stopped yet,
        None for another class.
        """
        got = [cloudpickle.loads(r) for _, r in self._said() if r is not None]
        if not got:
            return {} if issubclass(self._pool.consumer_class, GeneralConsumer) else None
        if all(isinstance(g, dict) for g in got):
            return {k: v for g in got for k, v in g.items()}
        if all(isinstance(g, list) for g in got):
            return [v for g in got for v in g]
        return got[-1]

    def __repr__(self) -> str:
        return f"ConsumerRef({self.name!r})"


class ConsumerPool:
    """`n_consumers` consumer processes on this machine serving `queue_pool` (daskqueue's `ConsumerPool`).

    `early_ack=True` (daskqueue's default): an item is acked as it is delivered, before it runs; an
    item whose consumer dies meanwhile is lost, and a failing one is not retried (at most once).
    `early_ack=False`: acked once processed; a failing item is retried `retries` times (with
    Conveyor's backoff) then becomes a dead letter (`queue_pool.dead_letters()`), and the item of a
    consumer that dies comes back to the queue at once (at least once).
    """

    def __init__(
        self,
        client: Client,
        queue_pool: QueuePool,
        ConsumerClass: type[ConsumerBaseClass] = GeneralConsumer,
        n_consumers: int = 1,
        batch_size: int = 1,
        retries: int = 1,
        early_ack: bool = True,
        max_concurrency: int = 10000,
    ) -> None:
        if not isinstance(client, Client):
            raise TypeError(f"ConsumerPool: client must be a conveyor.compat.daskqueue.Client, got {type(client).__name__}")
        if not isinstance(queue_pool, QueuePool):
            raise TypeError(
                f"ConsumerPool: queue_pool must be a conveyor.compat.daskqueue.QueuePool, got {type(queue_pool).__name__}"
            )
        if not (isinstance(ConsumerClass, type) and issubclass(ConsumerClass, ConsumerBaseClass)):
            raise TypeError(f"ConsumerClass passed should be a subclass of ConsumerBaseClass, got {ConsumerClass!r}")
        if inspect.isabstract(ConsumerClass):  # said here, not by every consumer process failing to make one
            raise TypeError(f"{ConsumerClass.__name__} does not implement process_item")
        if not isinstance(early_ack, bool):
            raise TypeError(f"early_ack must be True or False, got {early_ack!r}")
        self.n_consumers = count_arg("n_consumers", n_consumers, 1)
        self.batch_size = count_arg("batch_size", batch_size, 1)
        retries = count_arg("retries", retries, 0)
        max_concurrency = count_arg("max_concurrency", max_concurrency, 1)
        threads = max_concurrency if client.threads_per_worker is None else min(max_concurrency, client.threads_per_worker)
        self.queue_pool, self.consumer_class, self.early_ack = queue_pool, ConsumerClass, early_ack
        hooks = Hooks(cloudpickle.dumps(ConsumerClass), queue_pool, self.batch_size, max_concurrency, retries, early_ack)
        self._pool = ConveyorConsumerPool(
            client.pool,
            self.n_consumers,
            queues=queue_pool.queue_names,
            batch_size=self.batch_size,
            concurrency=None if threads > MAX_THREADS else threads,
            pool="thread",
            early_ack=early_ack,
            hooks=hooks,
            middleware=[TimeLimits(), CapRetries(retries), Retries()],
        )
        names = [f"{ConsumerClass.__name__}-{i}" for i in range(self.n_consumers)]
        self.consumers = {name: ConsumerRef(self, i, name) for i, name in enumerate(names)}

    @property
    def stats(self) -> ConsumerStats:
        """Conveyor's counts (processed, failed, dead, ...) summed over the consumers that have stopped."""
        return self._pool.stats

    def start(self, timeout: float = 1) -> None:
        """Start the consumer processes (again after a `cancel`; no-op while they run).

        `timeout`: daskqueue's fetch poll, accepted (Conveyor long-polls the servers instead).
        """
        check_seconds("timeout", timeout)
        if not self._pool.processes:
            log.info("Starting %d consumers", self.n_consumers)
            self._pool.start()

    def join(self, timestep: float = 0.1, print_timestep: float = 2, progress: bool = False) -> None:
        """Wait until every item of the queue pool is processed, then stop the consumers.

        With early acks, "processed" includes the items still running (acked, so no longer pending
        on the servers): join waits for them, as daskqueue's did, rather than stop their consumers.

        `timestep` is how long each look at the servers may wait for the end (they answer as soon as
        it comes); `progress` shows Conveyor's progress bar (`print_timestep`: accepted, the bar
        refreshes itself). Started consumers are not required: `join` starts them if none run.
        """
        check_seconds("timestep", timestep)
        check_seconds("print_timestep", print_timestep)
        log.info("Waiting for the %d consumers to process all items in queue_pool...", self.n_consumers)
        self._pool.join(progress=bool(progress), poll_s=max(float(timestep), 0.01))
        log.info("All consumers are done ! %d items processed.", self.nb_consumed())

    def cancel(self) -> None:
        """Stop the consumers: running items finish (and are acked), fetched ones not started go back."""
        log.info("Cancelling %d consumers.", self.n_consumers)
        self._pool.cancel()

    def nb_consumed(self) -> int:
        """Items this pool's consumers received.

        As daskqueue: their `len_items()`, counted as each consumer process stops; not those of
        other pools on the same queue pool.
        """
        return sum(c.len_items() for c in self.consumers.values())

    def results(self) -> dict[str, Any]:
        """{consumer name: what its `get_results()` returned when it stopped} (after `join` or `cancel`)."""
        if not hasattr(self.consumer_class, "get_results"):
            raise NotImplementedError("Please Implement a .get_results method in your ConsumerClass")
        return {name: ref.get_results() for name, ref in self.consumers.items()}

    def __repr__(self) -> str:
        st = self.queue_pool._pool.stats()
        mine = [s for q, s in st.items() if q in self.queue_pool.queue_names]
        received = self.nb_consumed()
        return (
            f"Consumers : \n\t{self.n_consumers} Consumers(s), \n\t{received} received "
            f"\n\t{sum(s.delivered for s in mine)} pending "
        )

    def __getitem__(self, idx: int) -> ConsumerRef:
        return list(self.consumers.values())[idx]

    def __len__(self) -> int:
        return len(self.consumers)

    def __enter__(self) -> ConsumerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
