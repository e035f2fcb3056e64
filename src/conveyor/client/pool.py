"""QueuePool: queue servers used as one (`ShardedQueues`), with tasks on top.

What users of tasks see: a pool is a `Publisher` (`@task` functions publish through it), runs
ad-hoc callables (`submit`, `map`) and waits for results (`gather`, or a `TaskHandle`'s
`result()`). An ad-hoc callable is cloudpickled once per function object and stored on every
shard as a blob keyed by its sha256; its messages carry only the digest, and workers fetch and
cache the function.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import operator
import pickle
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from conveyor.client.progress import JoinProgress, Stall
from conveyor.client.sharded import LOCAL_MASK, ShardedQueues
from conveyor.constants import DEFAULT_MAX_RETRIES, DEFAULT_QUEUE, H_IDEMPOTENCY_KEY
from conveyor.errors import ConveyorError
from conveyor.gc_policy import gc_paused
from conveyor.message import Message, Status
from conveyor.protocol import requests as calls
from conveyor.protocol.auth import is_loopback
from conveyor.protocol.requests import QueueInfo, QueueStats
from conveyor.protocol.tls import self_signed
from conveyor.server.processes import listening, start_server, stop_server
from conveyor.tasks.envelope import adhoc_task_name, function_ref
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.policy import Backoff, BackoffSpec
from conveyor.tasks.publish import MessageTemplate, TaskHandle, check_publish_options, check_time_limit, outcome, task_handles
from conveyor.tasks.queue_config import QueueConfig

QUIET_POLL_S = 5.0  # join without a progress bar: the longest wait of one request (the servers answer at the end)
QUEUE_INFO_TTL_S = 5.0  # how long a pool trusts what the servers said about a queue's settings
ATTACHED_POLL_S = 1.0  # a join looks after the consumer pools attached at least this often

log = logging.getLogger("conveyor.client")


class Attached(Protocol):
    """What works on a pool's servers from this process (a `ConsumerPool`): see `QueuePool.attach`."""

    queue_names: list[str]  # the queues it serves: the waits on them look after it

    def check(self) -> None:
        """Look after its processes; raise its own error (consumers that cannot start, say)."""
        ...

    def cancel(self, graceful: bool = True) -> None:
        """Stop, gracefully: running tasks finish and are settled."""
        ...


def check_ports(ports: Iterable[int] | None, n_servers: int) -> list[int] | None:
    """`ports` as a list of one distinct TCP port per server (None: free ports are picked); a clear error for anything else."""
    if ports is None:
        return None
    if isinstance(ports, (str, bytes)) or not isinstance(ports, Iterable):
        raise ValueError(f"ports: one TCP port per server, got {ports!r}")
    out: list[int] = []
    for p in ports:
        try:
            if isinstance(p, bool):
                raise TypeError
            out.append(operator.index(p))
        except TypeError:
            raise ValueError(f"ports: {p!r} is not a TCP port number") from None
    if len(out) != n_servers:
        raise ValueError(f"ports: one per server ({n_servers}), got {out!r}")
    if any(not 1 <= p <= 65535 for p in out) or len(set(out)) != len(out):
        raise ValueError(f"ports must be distinct TCP ports (1-65535), got {out!r}")
    return out


class QueuePool(ShardedQueues):
    """Queue servers used as one, where tasks are published and their results read.

    As `ShardedQueues` (routing, stats, consumer assignment), plus waiting for queues to drain
    (`join`) and requeueing dead letters.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._queue_configs: dict[str, QueueConfig] = {}
        self._queue_info: tuple[float, dict[str, QueueInfo]] = (0.0, {})
        self._blobs_sent: set[str] = set()
        self._attached: list[Attached] = []
        self.data_dir: Path | None = None  # where servers this pool started keep their queues once stopped (None: nowhere)
        self._attach_lock = threading.Lock()

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
        the `with` block stops the consumer pools attached to the pool (`attach`), then the servers,
        cleanly. The servers run in a session of their own: a terminal's Ctrl-C reaches this program
        and its consumers, not them, so the consumers settle their running tasks before they stop.

        On an address other hosts reach (`host` not loopback) the servers are secured by default: a
        token is generated when none is given, and they serve TLS with a new self-signed certificate
        that the pool pins by fingerprint (`tls=None`: TLS off loopback only; True or False to choose).
        Token and fingerprint travel with the pool when it is pickled (to Spark executors).
        """
        if n_servers < 1:
            raise ValueError(f"n_servers must be >= 1, got {n_servers}")
        ports = check_ports(ports, n_servers)
        temporary = durable and data_dir is None
        procs: list[subprocess.Popen[bytes]] = []
        tmps: list[Path] = []
        remote = not is_loopback(host)
        token = token or (secrets.token_urlsafe(32) if remote else None)
        certs = None  # the certificate and key: read by the servers as they start, removed once they listen
        try:
            secure: list[str] = []
            fingerprint = None
            if remote if tls is None else tls:
                certs = Path(tempfile.mkdtemp(prefix="conveyor-tls-", dir=temp_dir))
                cert, key, fingerprint = self_signed(certs, [host, socket.gethostname()])
                secure = ["--tls-cert", str(cert), "--tls-key", str(key)]
            for i in range(n_servers):  # all start at once, then each is waited for
                d: Path | None = None  # a transient server
                if temporary:
                    tmps.append(d := Path(tempfile.mkdtemp(prefix=f"conveyor-shard{i}-", dir=temp_dir)))
                elif durable and data_dir is not None:
                    d = Path(data_dir) / f"shard-{i}"
                args = ["--fsync", fsync, *(["--temporary"] if temporary else []), *secure]
                procs.append(start_server(d, 0 if ports is None else ports[i], host=host, token=token, args=args))
            addresses = [listening(p)[1] for p in procs]
            pool = cls.connect(addresses, token, batch_size=batch_size, fingerprint=fingerprint)
        except BaseException:
            for p in procs:
                stop_server(p)
            for d in tmps:
                shutil.rmtree(d, ignore_errors=True)
            raise
        finally:
            if certs is not None:
                shutil.rmtree(certs, ignore_errors=True)
        pool._procs, pool._tmp = procs, tmps
        pool.data_dir = Path(data_dir) if durable and data_dir is not None else None
        return pool

    def attach(self, user: Attached) -> None:
        """Tie `user` (a started `ConsumerPool`) to this pool until it `detach`es.

        The pool's waits (`gather`, a handle's `result()`, `join`) on a queue it serves call its
        `check()` as they go, so consumers that cannot start fail the wait at once with their own
        error (not its timeout), and consumers that died are restarted meanwhile; and
        `close()` stops it before the servers this pool started (its running tasks are settled while
        they still answer).
        """
        with self._attach_lock:
            if all(u is not user for u in self._attached):
                self._attached.append(user)

    def detach(self, user: Attached) -> None:
        """Untie `user` (a stopped `ConsumerPool`): see `attach`."""
        with self._attach_lock:
            self._attached = [u for u in self._attached if u is not user]

    def check_attached(self, queues: Iterable[str] | None = None) -> None:
        """Call `check()` of what is attached on any of `queues` (None: all): its error is the wait's.

        One on other queues is left alone: its error would point a wait on work it does not do the
        wrong way.
        """
        wanted = None if queues is None else set(queues)
        for user in list(self._attached):
            if wanted is None or not wanted.isdisjoint(user.queue_names):
                user.check()

    def wake(self, queues: Sequence[str]) -> None:
        """End the long polls of consumers idle in one on `queues`, from a thread of its own.

        Consumers told to stop then stop at once, not when their poll ends. Over connections of its
        own: a server out of reach costs the caller, and the pool's own requests, nothing (the polls
        end on their own).
        """
        call, own = calls.wake(queues), pickle.loads(pickle.dumps(self))

        def wake() -> None:
            try:
                own.on_every_server(call)  # a server's error comes back as a value
            except Exception as e:
                log.warning("could not wake the consumers' long polls: %s", e)
            finally:
                own.close()

        threading.Thread(target=wake, name="conveyor-wake", daemon=True).start()

    def close(self) -> None:
        """Close the connections and stop the servers this pool started (`ShardedQueues.close`).

        With servers to stop, what is attached stops first: its running tasks are settled while the
        servers still answer.
        """
        try:
            for user in list(self._attached) if self._procs else ():
                user.cancel()
        finally:
            super().close()

    def requeue_dead_letters(self, queue: str, ids: Sequence[int] | None = None) -> int:
        """Put dead letters of `queue` back on it, then forget them; returns how many were put back.

        By default all of them; else those of the pool-wide `ids` that are dead letters.

        Each goes back to the shard it died on as a new message (a new id) with its payload,
        headers, priority and max_attempts, and fresh attempts. Its idempotency key is dropped:
        the server would take the message for the dead one and store nothing. Not atomic: a crash
        between the put and the forget leaves a message both requeued and still a dead letter, and
        requeueing again would put it twice (at-least-once, like every delivery).
        """
        wanted: dict[int, set[int]] | None = None
        if ids is not None:
            wanted = {s: {ids[k] & LOCAL_MASK for k in pos} for s, pos in self._by_shard(ids).items()}
        n = 0
        for s in self._shards_with(queue) if wanted is None else sorted(wanted):
            client, local = self.clients[s], None if wanted is None else wanted[s]
            # ids only grow: a dead letter at or above the first id put here is one of ours that
            # died again meanwhile (a worker still failing it), not one to requeue in this pass
            after, first_new = 0, None
            while page := client.dead_letters(queue, after):
                after = page[-1].message.id
                dead = [
                    d.message
                    for d in page
                    if (local is None or d.message.id in local) and (first_new is None or d.message.id < first_new)
                ]
                if dead:
                    new = client.put(queue, [_fresh(m) for m in dead])
                    first_new = min(new) if first_new is None else first_new
                    client.forget(queue, [m.id for m in dead])
                    n += len(dead)
                    if local is not None:
                        local -= {m.id for m in dead}
                if (first_new is not None and after >= first_new) or local == set():
                    break
        return n

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
        own: ShardedQueues = pickle.loads(pickle.dumps(self))
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
                self.check_attached(names)
                if deadline is not None and (left := deadline - time.monotonic()) <= 0:
                    pending = sum(s.pending for s in mine.values())
                    raise TimeoutError(f"join: {pending:,} messages still pending after {timeout} s")
                if self._attached:  # each look also looks after them: often enough to say at once that they fail
                    poll_s = min(poll_s, ATTACHED_POLL_S)
                wait = poll_s if deadline is None else max(min(poll_s, left), 0.001)

    def use_queues(self, configs: Iterable[QueueConfig]) -> None:
        """Queue configurations (from the queue YAML) that publishing checks time limits against."""
        self._queue_configs.update((c.name, c) for c in configs)

    # --- Publisher ---------------------------------------------------------------------------
    def queue_config(self, queue: str) -> QueueConfig | None:
        """The queue's configuration: from `use_queues`, else its lease on the servers as the visibility timeout."""
        if queue in self._queue_configs:
            return self._queue_configs[queue]
        when, infos = self._queue_info
        if time.monotonic() - when > QUEUE_INFO_TTL_S:
            infos = {i.name: i for c in self.clients for i in c.queues()}
            self._queue_info = (time.monotonic(), infos)
        info = infos.get(queue)
        return None if info is None else QueueConfig(name=queue, visibility_timeout_sec=info.lease_s)

    # --- ad-hoc callables -------------------------------------------------------------------
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
        queue's options, never passed to `func`.
        """
        return self.map(
            func,
            [(args, kwargs)],
            queue=_queue,
            priority=_priority,
            delay=_delay,
            key=_key,
            time_limit=_time_limit,
            max_retries=_max_retries,
            retry_backoff=_retry_backoff,
            star=True,
        )[0]

    def map(
        self,
        func: Callable[..., Any],
        items: Iterable[Any],
        *,
        queue: str = DEFAULT_QUEUE,
        priority: int | None = None,
        delay: float | None = None,
        key: str | None = None,
        time_limit: float | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        retry_backoff: BackoffSpec | None = None,
        star: bool = False,
    ) -> list[TaskHandle]:
        """Run `func(item)` on the workers for every item (with `star`: items are (args, kwargs)).

        Returns the handles in item order; `gather(handles)` waits for the results.
        """
        opts = TaskOptions(queue=queue, time_limit=time_limit, max_retries=max_retries)
        if retry_backoff is not None:
            opts = dataclasses.replace(opts, retry_backoff=Backoff.of(retry_backoff))
        ref = function_ref(func)
        name = adhoc_task_name(ref.digest)
        check_publish_options(name, delay, priority, key)
        check_time_limit(name, opts, self.queue_config(queue))
        template = MessageTemplate(name, opts, delay=delay, priority=priority, key=key)
        calls = ((tuple(a), dict(k)) for a, k in items) if star else (((it,), {}) for it in items)
        with gc_paused():  # see there: a batch's objects all outlive the collections it would trigger
            messages = [template.message(a, k) for a, k in calls]
        if not messages:
            return []
        if ref.digest not in self._blobs_sent:
            if self.put_blob(ref.data) != ref.digest:
                raise ConveyorError(f"the servers stored {name} under another digest")
            self._blobs_sent.add(ref.digest)
        ids = self.put(queue, messages)
        return task_handles(ids, queue, name, self)

    # --- results ----------------------------------------------------------------------------
    def gather(self, handles: Sequence[TaskHandle], timeout: float | None = None, poll_s: float = 0.05) -> list[Any]:
        """The results of published tasks, in order, once all have finished.

        Raises TaskFailedError for the first that ended in the dead letters (with its error),
        TimeoutError after `timeout` seconds, and the error of a `ConsumerPool` on this pool and their
        queues whose consumers cannot start; warns while no live consumer serves a queue it waits
        on (`Stall`).
        """
        stall = Stall("gather", self.workers, timeout=timeout)
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
                for k, r, st in zip(ks, self.result(queue, ids), self.status(queue, ids), strict=True):
                    done, out[k] = outcome(handles[k], r, st, functools.partial(self._dead_error, queue, handles[k].id))
                    if not done:
                        left.append(k)
            todo = left
            if todo:
                stall.check(Counter(handles[k].queue for k in todo))
                self.check_attached({handles[k].queue for k in todo})
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"gather: {len(todo)} of {len(handles)} tasks unfinished after {timeout} s")
                time.sleep(poll_s)
        return out

    def task_status(self, handle: TaskHandle) -> Status | None:
        """Where a published task's message is (None: no such message on these servers)."""
        return self.status(handle.queue, [handle.id])[0]

    def _dead_error(self, queue: str, msg_id: int) -> str | None:
        shard, local = self.split_id(msg_id)
        page = self.clients[shard].dead_letters(queue, after=local - 1, limit=1)
        return page[0].error if page and page[0].message.id == local else None


def _fresh(m: Message) -> Message:
    """A dead message as a new one to put.

    Same payload, headers (less the idempotency key), priority and max_attempts; the store gives it
    a new id and fresh attempts.
    """
    headers = {k: v for k, v in m.headers.items() if k != H_IDEMPOTENCY_KEY}
    return Message(queue=m.queue, payload=m.payload, priority=m.priority, max_attempts=m.max_attempts, headers=headers)
