"""ShardedQueues: one logical queue spread over several queue servers (shards), with no central broker.

Puts go out in batches, round-robin over the shards. Every other operation goes to the shard that
holds the message: a pool folds the shard number into the ids it hands out
(`shard << SHARD_SHIFT | id on the server`), so shard order is part of a pool's identity —
every pool over the same servers must list them in the same order.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from conveyor.client.queue_client import QueueClient
from conveyor.client.server_health import ServerHealth
from conveyor.constants import ERR_NO_QUEUE, H_IDEMPOTENCY_KEY, SHARD_DOWN_MAX_S, SHARD_DOWN_S, SHARD_SHIFT
from conveyor.errors import ConnectionLostError, ConveyorError, RequestError
from conveyor.message import DeadLetter, Message, Status
from conveyor.protocol import requests as calls
from conveyor.protocol.framing import Limits
from conveyor.protocol.report import SEEN, Counts
from conveyor.protocol.requests import Call, CancelOutcome, QueueInfo, QueueStats
from conveyor.protocol.task_pages import TaskDetail, TaskPage, TaskState
from conveyor.tasks.envelope import FunctionRef, adhoc_task_name

if TYPE_CHECKING:
    from typing import Self

T = TypeVar("T")
log = logging.getLogger("conveyor.client")
LOCAL_MASK = (1 << SHARD_SHIFT) - 1  # the bits of a pool-wide id that are its id on its shard's server
MAX_ID = (1 << 63) - 1  # ids travel as non-negative 64-bit integers
MAX_SHARD = MAX_ID >> SHARD_SHIFT
_ID_TEXT = re.compile(r"(?:(\d+):)?(\d+)", re.ASCII)  # what `parse_id` reads: shard:n, or the id whole


class ShardedQueues:
    """Queue servers used as one: every queue operation, routed by id or sent to every server.

    Aggregated stats, consumer assignment, blobs. It is the `QueueBackend` the workers use; a
    `QueuePool` holds one (`pool.queues`) and adds tasks and the waits users call on top.
    """

    def __init__(self, clients: Sequence[QueueClient], *, batch_size: int = 1000) -> None:
        if not clients:
            raise ValueError("a pool needs at least one server")
        if len(clients) > MAX_SHARD + 1:
            raise ValueError(f"a pool holds at most {MAX_SHARD + 1} servers")
        self.clients = list(clients)
        self.batch_size = batch_size
        self._rr = itertools.count()  # rotates the shard a shard-less get looks at first
        self._next_put = 0
        self._down: dict[int, float] = {}  # shard -> until when `get` skips it (it failed to answer)
        self.health = ServerHealth(self.clients)  # which servers answer, what each held when last heard from
        self._threads: ThreadPoolExecutor | None = None
        self._threads_lock = threading.Lock()  # threads calling at once make one executor, not one each

    @classmethod
    def connect(
        cls, addresses: str | Sequence[str], token: str | bytes | None = None, *, batch_size: int = 1000, **client_options: Any
    ) -> Self:
        """A pool over running servers: a list, or one string of comma-separated addresses (options: `QueueClient`'s, TLS too)."""
        if isinstance(addresses, str):
            addresses = [a.strip() for a in addresses.split(",") if a.strip()]
        return cls([QueueClient(a, token, **client_options) for a in addresses], batch_size=batch_size)

    @property
    def addresses(self) -> list[str]:
        return [c.address for c in self.clients]

    def with_own_connections(self) -> Self:
        """A copy over the same servers, with the same settings, on connections of its own.

        For a thread whose requests must not wait behind this one's (a long poll, a settler, a
        watcher): close it when done. The copy shares no socket, lock or executor with this one.
        """
        return type(self)([c.sibling(c.timeout, c.connect_timeout) for c in self.clients], batch_size=self.batch_size)

    def __len__(self) -> int:
        return len(self.clients)

    # --- ids --------------------------------------------------------------------------------
    @staticmethod
    def global_id(shard: int, local_id: int) -> int:
        return shard << SHARD_SHIFT | local_id

    @staticmethod
    def split_id(msg_id: int) -> tuple[int, int]:
        """(shard, id on that shard's server) of a pool-wide message id."""
        return msg_id >> SHARD_SHIFT, msg_id & LOCAL_MASK

    def _by_shard(self, ids: Sequence[int]) -> dict[int, list[int]]:
        """Positions of `ids` per shard, checking every id names a shard of this pool."""
        out: dict[int, list[int]] = {}
        for k, i in enumerate(ids):
            s = i >> SHARD_SHIFT
            if not 0 <= s < len(self.clients):
                raise ValueError(f"message id {i} names shard {s}, but this pool has {len(self.clients)}")
            out.setdefault(s, []).append(k)
        return out

    def _each(self, work: dict[int, list[Call[Any]]]) -> dict[int, list[Any]]:
        """Run each shard's calls (pipelined), the shards in parallel; results per shard."""
        if len(work) == 1:
            [(s, batch)] = work.items()
            return {s: self.clients[s].pipeline(batch)}
        futures = {s: self._executor().submit(self.clients[s].pipeline, batch) for s, batch in work.items()}
        return {s: f.result() for s, f in futures.items()}

    def _everywhere(self, call: Call[T]) -> list[T]:
        """The same call on every shard, in parallel; the results in shard order."""
        done = self._each({s: [call] for s in range(len(self.clients))})
        return [done[s][0] for s in range(len(self.clients))]

    def _executor(self) -> ThreadPoolExecutor:
        with self._threads_lock:
            self._threads = self._threads or ThreadPoolExecutor(len(self.clients), thread_name_prefix="conveyor-pool")
            return self._threads

    def on_every_server(self, call: Call[T], clients: Sequence[QueueClient] | None = None) -> list[T | Exception]:
        """`_everywhere`, with a failing shard's error in its place instead of failing the call.

        A shard fails when it is down, out of reach, or gives no reply within the client's timeout.
        `clients`: only these servers (of `clients`), in their order.
        """

        def one(client: QueueClient) -> T | Exception:
            try:
                return client.call(call)
            except (ConveyorError, OSError) as e:  # OSError: TimeoutError, a request with no reply in time
                return e

        return list(self._executor().map(one, self.clients if clients is None else clients))

    def _scatter(self, ids: Sequence[int], make: Callable[[list[int], list[int]], Call[list[Any]]]) -> list[Any]:
        """Route a per-id operation to the shards holding the ids; results in the order of `ids`."""
        return self._scatter_many(ids, lambda s, pos, local: [make(pos, local)])

    def _scatter_many(self, ids: Sequence[int], make: Callable[[int, list[int], list[int]], list[Call[list[Any]]]]) -> list[Any]:
        """`_scatter` with any number of requests per shard (`make(shard, positions, local ids)`).

        The replies, joined, answer its ids in order.
        """
        groups = self._by_shard(ids)
        work = {s: make(s, pos, [ids[k] & LOCAL_MASK for k in pos]) for s, pos in groups.items()}
        out: list[Any] = [None] * len(ids)
        for s, replies in self._each(work).items():
            for k, r in zip(groups[s], (r for res in replies for r in res), strict=True):
                out[k] = r
        return out

    # --- operations -------------------------------------------------------------------------
    def declare(self, queue: str, **settings: Any) -> QueueInfo:
        """Declare a queue on every shard (see `QueueClient.declare` for the settings)."""
        return self._everywhere(calls.declare(queue, **settings))[0]

    def put(self, queue: str, messages: Sequence[Message]) -> list[int]:
        """Put messages in batches of `batch_size`, round-robin over the shards; returns pool-wide ids.

        A message with an idempotency key goes to the shard the key hashes to, so that the server
        holding earlier messages with that key sees it and does not store it twice.
        """
        n, b = len(self.clients), self.batch_size
        plain: list[int] = []
        keyed: dict[int, list[int]] = {}
        for i, m in enumerate(messages):
            key = m.headers.get(H_IDEMPOTENCY_KEY) if m.headers else None
            if key is None:
                plain.append(i)
            else:
                keyed.setdefault(self._key_shard(str(key)), []).append(i)
        chunks = [plain[i : i + b] for i in range(0, len(plain), b)]
        first, self._next_put = self._next_put, (self._next_put + len(chunks)) % n
        groups = [((first + k) % n, chunk) for k, chunk in enumerate(chunks)]
        groups += [(s, pos[i : i + b]) for s, pos in keyed.items() for i in range(0, len(pos), b)]
        work: dict[int, list[Call[Any]]] = {}
        where: list[tuple[int, int, int]] = []  # (shard, index of its first call, calls) per group
        for s, pos in groups:
            made = calls.puts(queue, [messages[i] for i in pos], self._server_limits(s))  # several if big
            work.setdefault(s, []).extend(made)
            where.append((s, len(work[s]) - len(made), len(made)))
        done = self._each(work)
        out = [0] * len(messages)
        for (_, pos), (s, j, k) in zip(groups, where, strict=True):
            for i, local in zip(pos, (i for ids in done[s][j : j + k] for i in ids), strict=True):
                out[i] = s << SHARD_SHIFT | local
        return out

    def _server_limits(self, shard: int) -> Limits:  # what its server takes in a request: said at connecting
        return self.clients[shard].connect().server_limits

    def get(
        self,
        queue: str,
        n: int = 1,
        *,
        lease_s: float | None = None,
        wait_s: float = 0.0,
        shards: Sequence[int] | None = None,
        tie: bool = False,
        consumer: str | None = None,
    ) -> list[Message]:
        """Lease up to n messages from the first of `shards` (default: all, rotating) that has some.

        With `wait_s`, keeps trying (long polls of a fraction of a second on each shard) until then,
        or until a server says a `wake` ended the wait (the list's `woken`; only with `tie`).
        `consumer`: who fetches, as the servers' task records name it.
        """
        order = list(range(len(self.clients))) if shards is None else list(shards)
        if shards is None:
            k = next(self._rr) % len(order)
            order = order[k:] + order[:k]
        # one slice of a long poll per shard in turn: a message put on another shard waits at most that long
        slice_s = wait_s if len(order) == 1 else 0.25
        deadline = time.monotonic() + wait_s
        waiting = False  # first a quick look at every shard
        while True:
            error: ConnectionLostError | None = None
            up = [s for s in order if self._down.get(s, 0.0) <= time.monotonic()] or order
            for s in up:
                # a slice each, and never past the deadline: a caller told "wait_s" gets its answer then
                wait = max(0.0, min(deadline - time.monotonic(), slice_s)) if waiting else 0.0
                try:
                    call = calls.get(queue, n, lease_s=lease_s, wait_s=wait, id_base=s << SHARD_SHIFT, tie=tie, consumer=consumer)
                    got = self.clients[s].call(call)
                except ConnectionLostError as e:  # serve from the other shards meanwhile, trying it less often as it stays out
                    gone = self.clients[s].unreachable_s()
                    self._down[s] = time.monotonic() + min(max(SHARD_DOWN_S, gone / 4), SHARD_DOWN_MAX_S)
                    error = e
                    continue
                self._down.pop(s, None)
                if got or got.woken:  # woken: the wait is over on every shard
                    return got
            if error is not None and all(s in self._down for s in up):
                raise error
            if deadline - time.monotonic() <= 0:
                return []
            waiting = True

    def ack(self, queue: str, ids: Sequence[int], results: Sequence[bytes | None] | None = None) -> list[bool]:
        """Finish messages, with optional results; in as many requests as the servers' limits take."""

        def make(s: int, pos: list[int], local: list[int]) -> list[Call[list[bool]]]:
            return calls.acks(queue, local, None if results is None else [results[k] for k in pos], self._server_limits(s))

        return self._scatter_many(ids, make)

    def nack(
        self,
        queue: str,
        ids: Sequence[int],
        errors: Sequence[str] | None = None,
        delay_s: float | Sequence[float] = 0.0,
        final: bool = False,
    ) -> list[bool]:
        def make(s: int, pos: list[int], local: list[int]) -> list[Call[list[bool]]]:
            d = delay_s if isinstance(delay_s, (int, float)) else [delay_s[k] for k in pos]
            errs = None if errors is None else [errors[k] for k in pos]
            return calls.nacks(queue, local, errs, d, final, self._server_limits(s))

        return self._scatter_many(ids, make)

    def release(self, queue: str, ids: Sequence[int]) -> list[bool]:
        return self._scatter(ids, lambda pos, local: calls.release(queue, local))

    def result(self, queue: str, ids: Sequence[int]) -> list[bytes | None]:
        """Stored results of pool-wide ids, in order (None where there is none)."""
        out: list[bytes | None] = [None] * len(ids)
        todo = list(range(len(ids)))
        while todo:  # a reply holds what fits in this client's limits: ask again for the rest
            groups = self._by_shard([ids[k] for k in todo])
            done = self._each({s: [calls.result(queue, [ids[todo[k]] & LOCAL_MASK for k in pos])] for s, pos in groups.items()})
            left = []
            for s, [res] in done.items():
                for k, r in zip(groups[s], calls.progress(res, "result"), strict=False):
                    out[todo[k]] = r
                left += [todo[k] for k in groups[s][len(res) :]]
            todo = sorted(left)
        return out

    def status(self, queue: str, ids: Sequence[int]) -> list[Status | None]:
        return self._scatter(ids, lambda pos, local: calls.status(queue, local))

    def report(self, worker: str, counts: Counts) -> None:
        """A consumer's counts, to every shard (so `stats` on any of them shows it)."""
        self._everywhere(calls.report(worker, counts))

    def workers(self) -> dict[str, Counts]:
        """Consumers heard from within WORKER_GONE_S, with their latest counts (`seen`: seconds ago)."""
        out: dict[str, Counts] = {}
        for per in self._everywhere(calls.workers()):
            for w, counts in per.items():
                if w not in out or float(counts[SEEN]) < float(out[w][SEEN]):
                    out[w] = counts
        return out

    def extend_lease(self, queue: str, ids: Sequence[int], lease_s: float) -> list[bool]:
        return self._scatter(ids, lambda pos, local: calls.extend_lease(queue, local, lease_s))

    def forget(self, queue: str, ids: Sequence[int]) -> int:
        groups = self._by_shard(ids)
        done = self._each({s: [calls.forget(queue, [ids[k] & LOCAL_MASK for k in pos])] for s, pos in groups.items()})
        return sum(r[0] for r in done.values())

    def stored(self, queue: str, keys: Sequence[str]) -> list[int]:
        """The pool-wide id of the message stored under each idempotency key, 0 where none is (its put did not land)."""
        groups: dict[int, list[int]] = {}
        for k, key in enumerate(keys):
            groups.setdefault(self._key_shard(key), []).append(k)
        b = self.batch_size
        pages = {s: [pos[i : i + b] for i in range(0, len(pos), b)] for s, pos in groups.items()}
        done = self._each({s: [calls.stored(queue, [keys[k] for k in page]) for page in ps] for s, ps in pages.items()})
        out = [0] * len(keys)
        for s, ps in pages.items():
            for page, ids in zip(ps, done[s], strict=True):
                for k, i in zip(page, ids, strict=True):
                    out[k] = i and self.global_id(s, i)
        return out

    def _key_shard(self, key: str) -> int:
        """The shard a message with idempotency key `key` goes to: the one that remembers the key."""
        return zlib.crc32(key.encode()) % len(self.clients)

    def purge(self, queue: str) -> int:
        return sum(r[0] for r in self._each({s: [calls.purge(queue)] for s in self._shards_with(queue)}).values())

    def cancel(self, queue: str, ids: Sequence[int]) -> list[CancelOutcome]:
        """Take messages off `queue` before they run: the ready and delayed ones of the pool-wide `ids`.

        Each becomes a dead letter with the error CANCELLED_ERROR (`requeue_dead_letters` puts it
        back). A message delivered to a consumer is left to it: its task is not stopped. Returns what
        became of each id, in order.
        """
        return self._scatter(ids, lambda pos, local: calls.cancel(queue, local))

    def drop(self, queue: str) -> bool:
        """Remove `queue` from every server with everything it holds (messages, results, dead letters); False if no server had it.

        Consumers still fetching from it would make it anew, empty: stop them first. Ids are not
        reused: a late ack meant for the dropped queue's messages finds nothing in a queue made
        later under the same name.
        """
        dropped = self._everywhere(calls.drop(queue))
        return any(dropped)

    def shard_stats(self, queue: str | None = None) -> list[dict[str, QueueStats]]:
        """Stats per shard, in shard order (a queue appears on the shards that have it)."""
        per = self.health.heard(self._everywhere(calls.stats()))
        if queue is not None:
            per = [{q: st for q, st in p.items() if q == queue} for p in per]
            if not any(per):
                raise RequestError(ERR_NO_QUEUE, f"no queue named {queue!r} on any of the {len(self.clients)} servers")
        return per

    def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        """Stats per queue, summed over the shards."""
        return summed_stats(self.shard_stats(queue))

    def wait_drained(self, queues: Sequence[str] | None, wait_s: float) -> dict[str, QueueStats]:
        """Stats of `queues`, summed over the shards, once every shard has nothing pending in them.

        Or after `wait_s`, whichever comes first. `queues`: default all (those no shard has left out).
        """
        return summed_stats(self.health.heard(self._everywhere(calls.stats(queues=queues, drained_wait_s=wait_s))))

    def reachable_stats(
        self, queues: Sequence[str] | None = None, drained_wait_s: float = 0.0
    ) -> list[dict[str, QueueStats] | Exception]:
        """Stats per shard, in shard order, or the error of a shard that does not answer.

        Of `queues`, default all. With `drained_wait_s`, as `wait_drained`: a caller waiting for the
        end hears of it at once.
        """
        return self.health.heard(self.on_every_server(calls.stats(queues=queues, drained_wait_s=drained_wait_s)))

    def check_reachable(self, limit_s: float, queues: Sequence[str] | None = None, what: str = "") -> None:
        """Raise `ServerUnreachableError` for a server out of reach for longer than `limit_s` (see `ServerHealth`)."""
        self.health.check(limit_s, queues, what)

    def _shards_with(self, queue: str) -> list[int]:
        """The shards that host `queue` (a queue exists where it was put, got or declared)."""
        have = [s for s, per in enumerate(self.shard_stats()) if queue in per]
        if not have:
            raise RequestError(ERR_NO_QUEUE, f"no queue named {queue!r} on any of the {len(self.clients)} servers")
        return have

    def results(self, queue: str) -> Iterator[tuple[int, bytes]]:
        """Every stored result as (pool-wide id, result), shard by shard."""
        for s in self._shards_with(queue):
            for i, r in self.clients[s].iter_results(queue):
                yield s << SHARD_SHIFT | i, r

    def dead_letters(self, queue: str) -> list[DeadLetter]:
        """Every dead letter of the queue, with pool-wide ids."""
        out = []
        for s in self._shards_with(queue):
            out += [
                dataclasses.replace(d, message=dataclasses.replace(d.message, id=s << SHARD_SHIFT | d.message.id))
                for d in self.clients[s].iter_dead_letters(queue)
            ]
        return out

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

    def tasks(
        self,
        queue: str | None = None,
        *,
        task: str | None = None,
        state: TaskState | None = None,
        msg_id: int = 0,
        limit: int = 100,
    ) -> TaskPage:
        """The servers' task records as one page: running deliveries and recently settled ones, each newest first.

        Of `queue` (None: every queue), with this task name, in this state, of this pool-wide message
        id (0: any; then only its shard is asked); at most `limit` of each kind. A server that does
        not answer is named in the page's `unreachable`, with its error, and the others are shown.
        """
        shards = list(self._by_shard([msg_id])) if msg_id else list(range(len(self.clients)))

        def one(s: int) -> TaskPage | None:  # None: the server has no such queue
            call = calls.tasks(queue, task=task, state=state, msg_id=msg_id & LOCAL_MASK, limit=limit, id_base=s << SHARD_SHIFT)
            try:
                return self.clients[s].call(call)
            except RequestError as e:
                if e.kind == ERR_NO_QUEUE:  # a queue on some shards only
                    return None
                raise
            except (ConveyorError, OSError) as e:  # OSError: TimeoutError, a request with no reply in time
                return TaskPage(unreachable={self.clients[s].address: f"{type(e).__name__}: {e}"})

        pages = list(self._executor().map(one, shards))
        if queue is not None and all(p is None for p in pages):
            raise RequestError(ERR_NO_QUEUE, f"no queue named {queue!r} on any of the {len(shards)} servers asked")
        return TaskPage.merged([p for p in pages if p is not None], limit)

    def task(self, queue: str, msg_id: int) -> TaskDetail:
        """One message by its pool-wide id: where it is, its deliveries its server keeps, its headers and previews."""
        (shard,) = self._by_shard([msg_id])
        return self.clients[shard].call(calls.task(queue, msg_id & LOCAL_MASK, id_base=shard << SHARD_SHIFT))

    def put_blob(self, data: bytes) -> str:
        """Store bytes on every shard (so any consumer finds them); returns the sha256 key."""
        return self._everywhere(calls.put_blob(data))[0]

    def put_function(self, ref: FunctionRef) -> None:
        """Store an ad-hoc task's function on every shard: its blobs, the one its digest names last."""
        for key, blob in ref.blobs.items():
            if self.put_blob(blob) != key:
                raise ConveyorError(f"the servers stored a blob of {adhoc_task_name(ref.digest)} under another digest")

    def get_blob(self, key: str, shard: int = 0) -> bytes | None:
        return self.clients[shard].get_blob(key)

    def forget_blobs(self, keys: Sequence[str]) -> None:
        """Remove blobs from every shard (markers nothing needs any more)."""
        self._everywhere(calls.forget_blobs(keys))

    def wake(self, queues: Sequence[str]) -> None:
        """End the long polls of consumers idle in one on `queues`, from a thread of its own.

        Consumers told to stop then stop at once, not when their poll ends. Over connections of its
        own: a server out of reach costs the caller, and this client's own requests, nothing (the
        polls end on their own).
        """
        call, own = calls.wake(queues), self.with_own_connections()

        def wake() -> None:
            try:
                own.on_every_server(call)  # a server's error comes back as a value
            except Exception as e:
                log.warning("could not wake the consumers' long polls: %s", e)
            finally:
                own.close()

        threading.Thread(target=wake, name="conveyor-wake", daemon=True).start()

    def assign(self, consumer: int, n_consumers: int) -> list[int]:
        """The shards consumer `consumer` of `n_consumers` serves first (it may steal from the others)."""
        if not 0 <= consumer < n_consumers:
            raise ValueError(f"consumer must be in [0, {n_consumers}), got {consumer}")
        n = len(self.clients)
        if n_consumers >= n:
            return [consumer % n]
        return [s for s in range(n) if s % n_consumers == consumer]

    # --- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connections (the servers go on: `LocalServers` stops those started here)."""
        for c in self.clients:
            c.close()
        with self._threads_lock:  # shut down outside it: its tasks may be asking for it
            threads, self._threads = self._threads, None
        threads.shutdown() if threads is not None else None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def own_connections(self) -> ShardedQueues:
        """The same servers over connections of its own: a thread that long-polls them holds up no one else's calls.

        (A connection answers one caller at a time.) Close it when done.
        """
        return ShardedQueues([copy.copy(c) for c in self.clients], batch_size=self.batch_size)

    def __getstate__(self) -> dict[str, Any]:
        """A pool crosses to other processes (Spark executors) as its connections' settings only."""
        return {"clients": self.clients, "batch_size": self.batch_size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["clients"], batch_size=state["batch_size"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.addresses!r})"


def format_id(msg_id: int) -> str:
    """A pool-wide message id as people read and type it: `shard:n` (n: its id on that shard's server)."""
    shard, local = ShardedQueues.split_id(msg_id)
    return f"{shard}:{local}"


def parse_id(text: str) -> int:
    """The pool-wide message id `text` names: `shard:n`, as `format_id` writes it, or the integer itself.

    A ValueError that says what it takes for anything else.
    """
    m = _ID_TEXT.fullmatch(text.strip())
    if m is not None:
        shard, local = m.groups()
        if shard is None and int(local) <= MAX_ID:
            return int(local)
        if shard is not None and int(shard) <= MAX_SHARD and int(local) <= LOCAL_MASK:
            return ShardedQueues.global_id(int(shard), int(local))
    raise ValueError(
        f"{text!r} is not a message id: give shard:n (shard 0 to {MAX_SHARD}, n 0 to {LOCAL_MASK}), as ids are shown, "
        f"or the id as one integer (0 to {MAX_ID})"
    )


def summed_stats(shards: Iterable[dict[str, QueueStats]]) -> dict[str, QueueStats]:
    """Per-queue stats summed over the shards."""
    out: dict[str, QueueStats] = {}
    for per in shards:
        for q, st in per.items():
            out[q] = out[q] + st if q in out else st
    return out


def _fresh(m: Message) -> Message:
    """A dead message as a new one to put.

    Same payload, headers (less the idempotency key), priority and max_attempts; the store gives it
    a new id and fresh attempts.
    """
    headers = {k: v for k, v in m.headers.items() if k != H_IDEMPOTENCY_KEY}
    return Message(queue=m.queue, payload=m.payload, priority=m.priority, max_attempts=m.max_attempts, headers=headers)
