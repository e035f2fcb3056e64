"""QueuePool: queue servers used as one, with tasks on top; what users of tasks call.

A pool is a `Publisher` (`@task` functions publish through it), runs ad-hoc callables (`submit`,
`map`) and waits for results (`gather`, or a `TaskHandle`'s `result()`) and for queues to drain
(`join`). It holds the sharded client every queue operation goes through (`pool.queues`, a
`ShardedQueues`: the backend the workers use), the server processes it started (`pool.servers`,
`LocalServers`; None when it connected to running ones) and the consumer pools working on it from
this process (`pool.attached`). An ad-hoc callable is cloudpickled once per function object and
stored on every shard as a blob keyed by its sha256; its messages carry only the digest, and workers
fetch and cache the function.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from conveyor.client.attached import Attachments
from conveyor.client.progress import JoinProgress, Stall
from conveyor.client.sharded import ShardedQueues
from conveyor.constants import DEFAULT_MAX_RETRIES, DEFAULT_QUEUE
from conveyor.message import DeadLetter, Message, Status
from conveyor.protocol.requests import CancelOutcome, QueueInfo, QueueStats
from conveyor.server.local_servers import LocalServers
from conveyor.tasks.envelope import FunctionRef
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.policy import Backoff, BackoffSpec
from conveyor.tasks.publish import TaskHandle, outcome, publish_adhoc
from conveyor.tasks.queue_config import QueueConfig

QUIET_POLL_S = 5.0  # join without a progress bar: the longest wait of one request (the servers answer at the end)
QUEUE_INFO_TTL_S = 5.0  # how long a pool trusts what the servers said about a queue's settings
ATTACHED_POLL_S = 1.0  # a join looks after the consumer pools attached at least this often


class QueuePool:
    """Queue servers used as one, where tasks are published and their results read.

    `queues`: the sharded client over the servers (every queue operation: `put`, `get`, `ack`,
    ...). `servers`: the server processes this pool started, stopped by `close()` (None: servers
    running elsewhere). `queue_configs`: queue configurations (from the queue YAML) that publishing
    checks time limits against; a queue without one is checked against its lease on the servers.
    """

    def __init__(
        self,
        queues: ShardedQueues,
        *,
        servers: LocalServers | None = None,
        queue_configs: Iterable[QueueConfig] = (),
    ) -> None:
        self.queues = queues
        self.servers = servers
        self.attached = Attachments()  # the consumer pools on it: its waits look after them, `close` stops them first
        self._queue_configs = {c.name: c for c in queue_configs}
        self._queue_info: tuple[float, dict[str, QueueInfo]] = (0.0, {})
        self._blobs_sent: set[str] = set()

    @classmethod
    def connect(
        cls,
        addresses: str | Sequence[str],
        token: str | bytes | None = None,
        *,
        batch_size: int = 1000,
        queue_configs: Iterable[QueueConfig] = (),
        **client_options: Any,
    ) -> QueuePool:
        """A pool over running servers: a list, or one string of comma-separated addresses.

        `client_options` are `QueueClient`'s (timeouts, TLS); `batch_size`: messages per put request.
        """
        queues = ShardedQueues.connect(addresses, token, batch_size=batch_size, **client_options)
        return cls(queues, queue_configs=queue_configs)

    @classmethod
    def local(
        cls,
        n_servers: int = 2,
        durable: bool = True,
        data_dir: str | Path | None = None,
        *,
        host: str = "127.0.0.1",
        token: str | None = None,
        tls: bool | None = None,
        fsync: str = "batch",
        batch_size: int = 1000,
        temp_dir: str | Path | None = None,
        ports: Iterable[int] | None = None,
    ) -> QueuePool:
        """Start `n_servers` queue servers as child processes.

        They listen on free ports of `host` (loopback by default), or on `ports`, one per server
        (for a firewall that opens only those).

        Durable servers keep their queues under `data_dir/shard-<i>`; without a `data_dir`, each in a
        temporary directory of its own (under `temp_dir`, default the system's), which the server removes
        when it stops (on `close()`, or when this process ends however it ends). `close()` or leaving
        the `with` block stops the consumer pools attached to the pool (`attached`), then the servers,
        cleanly. The servers run in a session of their own: a terminal's Ctrl-C reaches this program
        and its consumers, not them, so the consumers settle their running tasks before they stop.

        On an address other hosts reach (`host` not loopback) the servers are secured by default: a
        token is generated when none is given, and they serve TLS with a new self-signed certificate
        that the pool pins by fingerprint (`tls=None`: TLS off loopback only; True or False to choose).
        Token and fingerprint travel with the pool when it is pickled (to Spark executors). The
        servers are `pool.servers` (`LocalServers`).
        """
        servers = LocalServers.start(
            n_servers, durable, data_dir, host=host, token=token, tls=tls, fsync=fsync, temp_dir=temp_dir, ports=ports
        )
        try:
            queues = ShardedQueues.connect(
                servers.addresses, servers.token, batch_size=batch_size, fingerprint=servers.fingerprint
            )
        except BaseException:
            servers.stop()
            raise
        return cls(queues, servers=servers)

    @property
    def addresses(self) -> list[str]:
        """The servers' addresses, in shard order."""
        return self.queues.addresses

    # --- publishing (the `Publisher` protocol of `@task`) ------------------------------------
    def put(self, queue: str, messages: Sequence[Message]) -> list[int]:
        """Put messages on `queue`, spread over the servers; returns their pool-wide ids, in order."""
        return self.queues.put(queue, messages)

    def queue_config(self, queue: str) -> QueueConfig | None:
        """The queue's configuration: from `queue_configs`, else its lease on the servers as the visibility timeout."""
        if queue in self._queue_configs:
            return self._queue_configs[queue]
        when, infos = self._queue_info
        if time.monotonic() - when > QUEUE_INFO_TTL_S:
            infos = {i.name: i for c in self.queues.clients for i in c.queues()}
            self._queue_info = (time.monotonic(), infos)
        info = infos.get(queue)
        return None if info is None else QueueConfig(name=queue, visibility_timeout_sec=info.lease_s)

    # --- ad-hoc callables: publish options start with an underscore, as `@task`'s `publish` ----
    def submit(
        self,
        func: Callable[..., Any],
        /,
        *args: Any,
        _queue: str = DEFAULT_QUEUE,
        _priority: int | None = None,
        _delay: float | None = None,
        _key: str | None = None,
        _time_limit: float | None = None,
        _max_retries: int = DEFAULT_MAX_RETRIES,
        _retry_backoff: BackoffSpec | None = None,
        **kwargs: Any,
    ) -> TaskHandle:
        """Run `func(*args, **kwargs)` on a worker; returns the handle of its message.

        The function is cloudpickled once (per function object) and stored on the servers; the
        message carries its sha256 only. Keyword arguments with a leading underscore are the
        publish options, never passed to `func`.
        """
        options = _options(_queue, _time_limit, _max_retries, _retry_backoff)
        return publish_adhoc(func, [(args, kwargs)], options, _delay, _priority, _key, self, self._store_function)[0]

    def map(
        self,
        func: Callable[..., Any],
        items: Iterable[Any],
        *,
        _queue: str = DEFAULT_QUEUE,
        _priority: int | None = None,
        _delay: float | None = None,
        _key: str | None = None,
        _time_limit: float | None = None,
        _max_retries: int = DEFAULT_MAX_RETRIES,
        _retry_backoff: BackoffSpec | None = None,
    ) -> list[TaskHandle]:
        """Run `func(item)` on the workers for every item; the publish options are `submit`'s.

        Returns the handles in item order; `gather(handles)` waits for the results.
        """
        options = _options(_queue, _time_limit, _max_retries, _retry_backoff)
        calls: Iterable[tuple[tuple[Any, ...], dict[str, Any]]] = (((item,), {}) for item in items)
        return publish_adhoc(func, calls, options, _delay, _priority, _key, self, self._store_function)

    def _store_function(self, ref: FunctionRef) -> None:
        """An ad-hoc task's function, on every server: once per function and pool."""
        if ref.digest not in self._blobs_sent:
            self.queues.put_function(ref)
            self._blobs_sent.add(ref.digest)

    # --- results and waits (the `ResultReader` protocol of `TaskHandle`) --------------------
    def gather(self, handles: Sequence[TaskHandle], timeout: float | None = None, poll_s: float = 0.05) -> list[Any]:
        """The results of published tasks, in order, once all have finished.

        Raises TaskFailedError for the first that ended in the dead letters (with its error),
        TimeoutError after `timeout` seconds, and the error of a `ConsumerPool` on this pool and their
        queues whose consumers cannot start; warns while no live consumer serves a queue it waits
        on (`Stall`).
        """
        stall = Stall("gather", self.queues.workers, timeout=timeout)
        out: list[Any] = [None] * len(handles)
        todo = list(range(len(handles)))
        deadline = None if timeout is None else time.monotonic() + timeout
        while todo:
            by_queue: dict[str, list[int]] = {}
            for k in todo:
                by_queue.setdefault(handles[k].queue, []).append(k)
            left = []
            for queue, ks in by_queue.items():
                ids = [handles[k].id for k in ks]
                for k, r, st in zip(ks, self.queues.result(queue, ids), self.queues.status(queue, ids), strict=True):
                    done, out[k] = outcome(handles[k], r, st, functools.partial(self._dead_error, queue, handles[k].id))
                    if not done:
                        left.append(k)
            todo = left
            if todo:
                stall.check(Counter(handles[k].queue for k in todo))
                self.attached.check({handles[k].queue for k in todo})
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"gather: {len(todo)} of {len(handles)} tasks unfinished after {timeout} s")
                time.sleep(poll_s)
        return out

    def task_status(self, handle: TaskHandle) -> Status | None:
        """Where a published task's message is (None: no such message on these servers)."""
        return self.queues.status(handle.queue, [handle.id])[0]

    def cancel(self, handles: Sequence[TaskHandle]) -> list[CancelOutcome]:
        """Take published tasks off their queues if they have not started; what became of each, in order.

        Each ready or delayed one becomes a dead letter with the error "cancelled before it ran"
        (`requeue_dead_letters` puts it back; its `result()` raises TaskFailedError). One delivered to
        a consumer is left to it (its task is not stopped): CancelOutcome says so, as it says a task
        finished, failed or unknown.
        """
        out: list[CancelOutcome] = [CancelOutcome.UNKNOWN] * len(handles)
        by_queue: dict[str, list[int]] = {}
        for k, h in enumerate(handles):
            by_queue.setdefault(h.queue, []).append(k)
        for queue, ks in by_queue.items():
            for k, got in zip(ks, self.queues.cancel(queue, [handles[k].id for k in ks]), strict=True):
                out[k] = got
        return out

    def _dead_error(self, queue: str, msg_id: int) -> str | None:
        shard, local = self.queues.split_id(msg_id)
        page = self.queues.clients[shard].dead_letters(queue, after=local - 1, limit=1)
        return page[0].error if page and page[0].message.id == local else None

    def join(
        self,
        queues: str | Sequence[str] | None = None,
        *,
        timeout: float | None = None,
        poll_s: float = 0.2,
        progress: bool | None = None,
    ) -> dict[str, QueueStats]:
        """Wait until the queues (default: all) have nothing ready, delayed or delivered on any shard.

        The servers answer as soon as their share is drained, so the end is seen at once; `poll_s`
        is how often the counts are refreshed meanwhile for the progress bar, shown on a terminal
        (`progress=None`: when stderr is one). Without a bar the servers are asked far less often
        (every QUIET_POLL_S): each request costs them CPU the work could use. Raises TimeoutError
        after `timeout` seconds, and the error of a `ConsumerPool` on this pool and these queues
        whose consumers cannot start; warns while no live consumer serves a queue it waits on
        (`Stall`). Returns the final stats.
        """
        names = [queues] if isinstance(queues, str) else None if queues is None else list(queues)
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = 0.0  # the first look answers at once; then each server answers when drained or after poll_s
        # connections of its own: a waiting request would hold up other threads' calls on ours
        own = self.queues.with_own_connections()
        stall = Stall("join", own.workers, timeout=timeout)
        with JoinProgress(enabled=progress) as bar, own:
            if not bar.enabled:
                poll_s = max(poll_s, QUIET_POLL_S)
            while True:
                mine = own.wait_drained(names, wait)
                bar.update(mine)
                if all(s.pending == 0 for s in mine.values()):
                    return mine
                stall.check({q: s.pending for q, s in mine.items()})
                self.attached.check(names)
                if deadline is not None and (left := deadline - time.monotonic()) <= 0:
                    pending = sum(s.pending for s in mine.values())
                    raise TimeoutError(f"join: {pending:,} messages still pending after {timeout} s")
                if self.attached:  # each look also looks after them: often enough to say at once that they fail
                    poll_s = min(poll_s, ATTACHED_POLL_S)
                wait = poll_s if deadline is None else max(min(poll_s, left), 0.001)

    # --- queues ------------------------------------------------------------------------------
    def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        """Stats per queue (of `queue` only, if given), summed over the servers."""
        return self.queues.stats(queue)

    def dead_letters(self, queue: str) -> list[DeadLetter]:
        """Every dead letter of `queue`, with pool-wide ids and its last error."""
        return self.queues.dead_letters(queue)

    def requeue_dead_letters(self, queue: str, ids: Sequence[int] | None = None) -> int:
        """Put dead letters of `queue` back on it (all, or those of `ids`); how many (`ShardedQueues.requeue_dead_letters`)."""
        return self.queues.requeue_dead_letters(queue, ids)

    def drop(self, queue: str) -> bool:
        """Remove `queue` from every server with everything it holds; False if no server had it (`ShardedQueues.drop`)."""
        return self.queues.drop(queue)

    def purge(self, queue: str) -> int:
        """Remove the messages of `queue` not yet finished, on every server; how many."""
        return self.queues.purge(queue)

    # --- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connections and stop the servers this pool started (`servers`).

        With servers to stop, what is attached stops first: its running tasks are settled while the
        servers still answer.
        """
        try:
            if self.servers is not None:
                self.attached.cancel_all()
        finally:
            try:
                self.queues.close()
            finally:
                if self.servers is not None:
                    self.servers.stop()

    def __enter__(self) -> QueuePool:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __reduce__(self) -> tuple[Callable[..., QueuePool], tuple[ShardedQueues, list[QueueConfig]]]:
        """A pool crosses to other processes (Spark executors, consumer processes) as its client only.

        Not the servers it started (they stop with this one) nor what is attached here.
        """
        return _pool_of, (self.queues, list(self._queue_configs.values()))

    def __repr__(self) -> str:
        return f"QueuePool({self.addresses!r})"


def _pool_of(queues: ShardedQueues, queue_configs: list[QueueConfig]) -> QueuePool:
    """What unpickling a pool gives: a pool over the same servers, on connections of its own."""
    return QueuePool(queues, queue_configs=queue_configs)


def _options(queue: str, time_limit: float | None, max_retries: int, retry_backoff: BackoffSpec | None) -> TaskOptions:
    """The task options of an ad-hoc call's publish options."""
    options = TaskOptions(queue=queue, time_limit=time_limit, max_retries=max_retries)
    return options if retry_backoff is None else dataclasses.replace(options, retry_backoff=Backoff.of(retry_backoff))
