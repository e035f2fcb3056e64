"""The requests a client sends a queue server: how each operation's request is built and its reply read.

`QueueClient` sends these `Call`s; the fields of each request and reply are declared once, in
`conveyor.protocol.declarations`.
Per-message fields travel as columns in the header (a scalar when all messages agree), payloads
and results as raw frames.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar, cast

import msgpack

from conveyor.errors import ProtocolError
from conveyor.message import DeadLetter, Message, Status, headers_bytes, make_message
from conveyor.protocol.declarations import (
    ACK,
    BYE,
    CANCEL,
    COL_IDS,
    DEAD_LETTERS,
    DECLARE,
    DROP,
    EXTEND_LEASE,
    FORGET,
    FORGET_BLOBS,
    GET,
    GET_BLOB,
    MESSAGE_COLUMNS,
    NACK,
    PING,
    PURGE,
    PUT,
    PUT_BLOB,
    QUEUES,
    RELEASE,
    REPORT,
    RESULT,
    RESULTS,
    STATS,
    STATUS,
    STORED,
    TASK,
    TASKS,
    WAKE,
)
from conveyor.protocol.framing import Frames, Header, Limits, column, expand
from conveyor.protocol.report import Counts
from conveyor.protocol.task_pages import TaskDetail, TaskPage, TaskRecord, TaskState, detail_from_reply

T = TypeVar("T")
_packb = msgpack.Packer(use_bin_type=True).pack
_HEAD_BYTES = 48  # a message's fields in a request header, besides its headers (id, priority, ...: at most)


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request: operation, arguments, payload frames, and how to read the reply."""

    op: str
    args: dict[str, Any]
    frames: Sequence[bytes] = ()
    parse: Callable[[Header, Frames], T] = field(default=lambda h, f: h)
    wait_s: float = 0.0  # how long the server may hold it on purpose (long poll), beyond the timeout
    ties: bool = False  # it ties the leases it takes to its connection (`get` with `tie`)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue's settings on one server."""

    name: str
    kind: str  # the kind of store that holds it: "transient", "durable", or another the server knows
    lease_s: float
    max_attempts: int
    fsync: str | None  # None for a kind not kept on disk


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts and rates of one queue (on one server, or summed over a pool's shards)."""

    queue: str
    ready: int = 0
    delivered: int = 0
    delayed: int = 0
    acked: int = 0
    failed: int = 0
    bytes_on_disk: int = 0
    put_rate: float = 0.0  # messages/s over the last ~10 s
    ack_rate: float = 0.0

    @property
    def pending(self) -> int:
        """Messages not finished yet: ready, delayed or delivered."""
        return self.ready + self.delayed + self.delivered

    def __add__(self, other: QueueStats) -> QueueStats:
        return QueueStats(self.queue, *(getattr(self, f) + getattr(other, f) for f in _STAT_FIELDS))


_STAT_FIELDS = ("ready", "delivered", "delayed", "acked", "failed", "bytes_on_disk", "put_rate", "ack_rate")


@dataclass(frozen=True, slots=True)
class ServerStats:
    """One server's `stats` reply: its queues, and the consumers it heard from lately (with `seen`)."""

    queues: dict[str, QueueStats]
    workers: dict[str, Counts]  # by consumer: its report on the wire (`ConsumerReport.from_counts` reads it)


class CancelOutcome(Enum):
    """What `cancel` did with one message id (the values are how the command line says it)."""

    CANCELLED = "cancelled"  # it was ready or delayed: a dead letter now, with the error CANCELLED_ERROR
    RUNNING = "delivered to a consumer (running, or about to): not cancelled"
    FINISHED = "finished already: not cancelled"
    FAILED = "a dead letter already: not cancelled"
    UNKNOWN = "no such message in this queue: not cancelled"


_NOT_CANCELLED = {
    Status.DELIVERED: CancelOutcome.RUNNING,
    Status.ACKED: CancelOutcome.FINISHED,
    Status.FAILED: CancelOutcome.FAILED,
}


def ping() -> Call[Header]:
    return Call(PING.name, {})


def declare(
    queue: str,
    *,
    kind: str | None = None,
    lease_s: float | None = None,
    max_attempts: int | None = None,
    fsync: str | None = None,
) -> Call[QueueInfo]:
    """Create a queue, or check that it exists with these settings (None: the server's default).

    kind: the kind of store that holds it, by name (`STORE_TRANSIENT`, `STORE_DURABLE`, or another
    the server knows).
    """
    args = DECLARE.header(queue=queue, kind=kind, lease_s=lease_s, max_attempts=max_attempts, fsync=fsync)
    return Call(DECLARE.name, args, parse=lambda h, f: QueueInfo(**h["info"]))


def queues() -> Call[list[QueueInfo]]:
    return Call(QUEUES.name, {}, parse=lambda h, f: [QueueInfo(**i) for i in h["queues"]])


def put(queue: str, messages: Sequence[Message]) -> Call[list[int]]:
    """Append messages (their `id`, `queue`, `attempts`, `enqueued_at` and `lease_s` are ignored)."""
    try:
        priority = column([m.priority for m in messages])
    except AttributeError:
        bad = next(m for m in messages if not isinstance(m, Message))
        raise TypeError(f"put takes Message objects, not {type(bad).__name__}") from None
    args = PUT.header(
        queue=queue,
        n=len(messages),
        priority=priority,
        not_before=column([m.not_before for m in messages]),
        max_attempts=column([m.max_attempts for m in messages]),
        headers=column([m.headers for m in messages]),
    )
    return Call(PUT.name, args, [m.payload for m in messages], parse=_put_ids)


def puts(queue: str, messages: Sequence[Message], limits: Limits) -> list[Call[list[int]]]:
    """`put` as as many requests as it takes to fit a server's limits.

    `put` as as many requests as it takes to fit a server's limits (ValueError for a message that
    fits in none); the ids are the replies' ids, in order.
    """
    whole = put(queue, messages)
    if _fits(whole, limits):
        return [whole]
    frames = [len(m.payload) for m in messages]
    heads = [_HEAD_BYTES + headers_bytes(m.headers) for m in messages]
    return [put(queue, messages[r.start : r.stop]) for r in limits.pieces(frames, heads, "put: message")]


def _fits(c: Call[Any], limits: Limits) -> bool:
    """Whether a request fits a server's limits as it is: the usual case, found at C speed."""
    f = c.frames
    return (
        len(f) <= limits.max_frames
        and (not f or max(map(len, f)) <= limits.max_frame_bytes)
        and sum(map(len, f)) <= limits.max_message_bytes
        and len(_packb(c.args)) <= limits.header_room()
    )


def _put_ids(h: Header, frames: Frames) -> list[int]:
    """Consecutive ids (first, n), or a list when idempotency keys mapped some to earlier messages."""
    return h["ids"] if "ids" in h else list(range(h["first"], h["first"] + h["n"]))


def _messages(h: Header, frames: Frames, id_base: int = 0) -> list[Message]:
    """Messages from a get or dead_letters reply: columns in the header, payloads in the frames.

    id_base is added to every id (a pool's shard bits).
    """
    n = len(frames)
    q, lease = h["queue"], h["lease_s"]
    cols = [expand(h[k], n, k) for k in MESSAGE_COLUMNS]
    return [
        make_message(id_base + i, q, p, pr, a, at, nb, lease, ma, hd)
        for i, p, pr, a, at, nb, ma, hd in zip(cols[0], frames, *cols[1:], strict=True)
    ]


class Fetched(list[Message]):
    """The messages a get delivered, how many READY ones were left, and whether a `wake` ended it.

    The messages a get delivered, how many READY ones its queue had left on that server (`left`;
    None from a server that does not tell), and whether a `wake` ended its wait (`woken`: the caller
    should not wait on, on this server or another).
    """

    left: int | None = None
    woken: bool = False


def _fetched(h: Header, frames: Frames, id_base: int) -> Fetched:
    out = Fetched(_messages(h, frames, id_base))
    out.left = h.get("left")
    out.woken = bool(h.get("woken", False))
    return out


def get(
    queue: str,
    n: int,
    *,
    lease_s: float | None = None,
    wait_s: float = 0.0,
    id_base: int = 0,
    tie: bool = False,
    consumer: str | None = None,
) -> Call[Fetched]:
    """Lease up to n messages; with `wait_s`, wait that long for some to arrive (long poll).

    With `tie` (a consumer's get), the leases also end when this connection closes (the process
    holding them died), and a `wake` of the queue ends the wait. `consumer`: the name the server's
    task records give the deliveries' holder.
    """
    args = GET.header(queue=queue, n=n, lease_s=lease_s, wait_s=wait_s, tie=tie, consumer=consumer)
    return Call(GET.name, args, parse=lambda h, f: _fetched(h, f, id_base), wait_s=max(0.0, wait_s), ties=tie)


def acks(queue: str, ids: Sequence[int], results: Sequence[bytes | None] | None, limits: Limits) -> list[Call[list[bool]]]:
    """`ack` as as many requests as it takes to fit a server's limits.

    `ack` as as many requests as it takes to fit a server's limits (ValueError for a result that
    fits in none); the replies' lists, joined, are the acks' outcomes in order.
    """
    whole = ack(queue, ids, results)
    if results is None or _fits(whole, limits):
        return [whole]
    pieces = limits.pieces([0 if r is None else len(r) for r in results], [_HEAD_BYTES] * len(results), "ack: result")
    return [ack(queue, ids[r.start : r.stop], results[r.start : r.stop]) for r in pieces]


def ack(queue: str, ids: Sequence[int], results: Sequence[bytes | None] | None = None) -> Call[list[bool]]:
    """Finish messages, with optional results; returns which acks took effect (the first ack wins)."""
    frames: list[bytes] = []
    none = None
    if results is not None:
        if len(results) != len(ids):
            raise ValueError(f"ack: {len(ids)} ids but {len(results)} results")
        none = [i for i, r in enumerate(results) if r is None]
        frames = [b"" if r is None else r for r in results]
    return Call(ACK.name, ACK.header(queue=queue, ids=list(ids), none=none), frames, parse=_ok)


def nack(
    queue: str,
    ids: Sequence[int],
    errors: Sequence[str] | None = None,
    delay_s: float | Sequence[float] = 0.0,
    final: bool = False,
) -> Call[list[bool]]:
    """Give messages back (READY after the delay) or to the dead letters.

    Give messages back (READY after the delay, per message or for all) or to the dead letters (when
    out of attempts, or at once with `final`).
    """
    delay = delay_s if isinstance(delay_s, (int, float)) else list(delay_s)
    args = NACK.header(queue=queue, ids=list(ids), errors=None if errors is None else list(errors), delay_s=delay, final=final)
    return Call(NACK.name, args, parse=_ok)


def nacks(
    queue: str, ids: Sequence[int], errors: Sequence[str] | None, delay_s: float | Sequence[float], final: bool, limits: Limits
) -> list[Call[list[bool]]]:
    """`nack` as as many requests as it takes to fit a server's limits (errors travel in the header)."""
    whole = nack(queue, ids, errors, delay_s, final)
    if errors is None or _fits(whole, limits):
        return [whole]
    pieces = limits.pieces([0] * len(errors), [_HEAD_BYTES + len(e.encode()) for e in errors], "nack: error")
    if isinstance(delay_s, (int, float)):
        return [nack(queue, ids[r.start : r.stop], errors[r.start : r.stop], delay_s, final) for r in pieces]
    return [nack(queue, ids[r.start : r.stop], errors[r.start : r.stop], delay_s[r.start : r.stop], final) for r in pieces]


def release(queue: str, ids: Sequence[int]) -> Call[list[bool]]:
    """Give back delivered messages never started: READY at once, the attempt not counted."""
    return Call(RELEASE.name, RELEASE.header(queue=queue, ids=list(ids)), parse=_ok)


def _ok(h: Header, frames: Frames) -> list[bool]:
    return cast("list[bool]", h["ok"])


def _found(h: Header, frames: Frames) -> list[bytes | None]:
    it = iter(frames)
    return [next(it) if ok else None for ok in h["found"]]


def progress(got: list[T], op: str) -> list[T]:
    """A page of a paged reply, which holds at least one item (a reply of none would be asked again forever)."""
    if not got:
        raise ProtocolError(f"{op}: the server answered none of the ids asked for")
    return got


def result(queue: str, ids: Sequence[int]) -> Call[list[bytes | None]]:
    """The stored results of these ids (None: not acked, acked without a result, or forgotten)."""
    return Call(RESULT.name, RESULT.header(queue=queue, ids=list(ids)), parse=_found)


def status(queue: str, ids: Sequence[int]) -> Call[list[Status | None]]:
    """Where each message is (None: never assigned on this server, or purged)."""

    def parse(h: Header, f: Frames) -> list[Status | None]:
        return [None if s is None else Status(s) for s in h["status"]]

    return Call(STATUS.name, STATUS.header(queue=queue, ids=list(ids)), parse=parse)


def report(worker: str, counts: Mapping[str, float | str]) -> Call[Header]:
    """A consumer's counts (processed, failed, running..., and its host), shown by `stats` while it reports."""
    return Call(REPORT.name, REPORT.header(worker=worker, counts=counts))


def workers() -> Call[dict[str, Counts]]:
    """Counts of the consumers that reported within WORKER_GONE_S (with `seen`: seconds ago).

    Asks for the stats of no queue: a wait looks at who reports often, and a server with many
    queues would count them all each time for nothing.
    """
    return Call(STATS.name, STATS.header(queues=[]), parse=lambda h, f: h["workers"])


def extend_lease(queue: str, ids: Sequence[int], lease_s: float) -> Call[list[bool]]:
    """Push the leases of delivered messages to now + lease_s (a running task's heartbeat)."""
    return Call(EXTEND_LEASE.name, EXTEND_LEASE.header(queue=queue, ids=list(ids), lease_s=lease_s), parse=_ok)


def stats(
    queue: str | None = None, *, queues: Sequence[str] | None = None, drained_wait_s: float = 0.0
) -> Call[dict[str, QueueStats]]:
    """Counts and rates of one queue, of those of `queues` on the server, or of every queue.

    With `drained_wait_s`, the server answers once those queues have nothing pending (or after
    that long).
    """
    args = STATS.header(queue=queue, queues=None if queues is None else list(queues), drained_wait_s=max(drained_wait_s, 0.0))
    return Call(
        STATS.name, args, parse=lambda h, f: {q: QueueStats(q, **s) for q, s in h["queues"].items()}, wait_s=drained_wait_s
    )


def server_stats() -> Call[ServerStats]:
    """Every queue's counts and the consumers heard from, in one request (what `conveyor stats` shows)."""

    def parse(h: Header, f: Frames) -> ServerStats:
        return ServerStats({q: QueueStats(q, **s) for q, s in h["queues"].items()}, h["workers"])

    return Call(STATS.name, {}, parse=parse)


def purge(queue: str) -> Call[int]:
    """Drop every READY (and delayed) message; returns how many."""
    return Call(PURGE.name, PURGE.header(queue=queue), parse=lambda h, f: h["n"])


def cancel(queue: str, ids: Sequence[int]) -> Call[list[CancelOutcome]]:
    """Make the READY and delayed messages of `ids` dead letters (CANCELLED_ERROR); what became of each id.

    A message delivered to a consumer is left to it (its task is not stopped); finished and unknown
    ids are said as such.
    """

    def one(ok: bool, status: int | None) -> CancelOutcome:
        if ok:
            return CancelOutcome.CANCELLED
        if status is None:
            return CancelOutcome.UNKNOWN
        if (outcome := _NOT_CANCELLED.get(Status(status))) is None:
            raise ProtocolError(f"cancel: the server left a {Status(status).name} message as it was")
        return outcome

    def parse(h: Header, f: Frames) -> list[CancelOutcome]:
        return [one(ok, st) for ok, st in zip(h["ok"], h["status"], strict=True)]

    return Call(CANCEL.name, CANCEL.header(queue=queue, ids=list(ids)), parse=parse)


def drop(queue: str) -> Call[bool]:
    """Remove the queue and everything it holds; False if there was none."""
    return Call(DROP.name, DROP.header(queue=queue), parse=lambda h, f: h["dropped"])


def results(queue: str, after: int = 0, limit: int = 1000) -> Call[list[tuple[int, bytes]]]:
    """Stored results in id order from the first id above `after`: one page of at most `limit`."""
    args = RESULTS.header(queue=queue, after=after, limit=limit)
    return Call(RESULTS.name, args, parse=lambda h, f: list(zip(h[COL_IDS], f, strict=True)))


def _dead(h: Header, frames: Frames) -> list[DeadLetter]:
    return [DeadLetter(m, e, t) for m, e, t in zip(_messages(h, frames), h["errors"], h["failed_at"], strict=True)]


def dead_letters(queue: str, after: int = 0, limit: int = 1000) -> Call[list[DeadLetter]]:
    """Dead letters in id order from the first id above `after`: one page of at most `limit`."""
    return Call(DEAD_LETTERS.name, DEAD_LETTERS.header(queue=queue, after=after, limit=limit), parse=_dead)


def forget(queue: str, ids: Sequence[int]) -> Call[int]:
    """Drop stored results and dead letters of these ids, freeing their space; returns how many."""
    return Call(FORGET.name, FORGET.header(queue=queue, ids=list(ids)), parse=lambda h, f: h["n"])


def stored(queue: str, keys: Sequence[str]) -> Call[list[int]]:
    """The id of the message stored under each idempotency key, 0 where none is: did a put land."""
    return Call(STORED.name, STORED.header(queue=queue, keys=list(keys)), parse=lambda h, f: list(h["ids"]))


def tasks(
    queue: str | None = None,
    *,
    task: str | None = None,
    state: TaskState | None = None,
    msg_id: int = 0,
    limit: int = 100,
    id_base: int = 0,
) -> Call[TaskPage]:
    """A page of task records: running deliveries and recently settled ones, each newest first.

    Of `queue` (None: every queue on the server), with this task name, in this state, of this
    message (0: any); at most `limit` of each kind. `id_base` is added to every id (a pool's shard bits).
    """
    args = TASKS.header(queue=queue, task=task, state=None if state is None else state.value, msg_id=msg_id, limit=limit)

    def parse(h: Header, f: Frames) -> TaskPage:
        now = float(h["time"])
        records = [[TaskRecord.from_wire(r, now, id_base) for r in h[k]] for k in ("running", "recent")]
        return TaskPage(records[0], records[1], int(h["running_total"]))

    return Call(TASKS.name, args, parse=parse)


def task(queue: str, msg_id: int, *, id_base: int = 0) -> Call[TaskDetail]:
    """One message (`msg_id` on this server): where it is, its deliveries kept, headers and previews."""
    return Call(
        TASK.name,
        TASK.header(queue=queue, msg_id=msg_id),
        parse=lambda h, f: detail_from_reply(queue, id_base + msg_id, h, list(f), id_base),
    )


def put_blob(data: bytes) -> Call[str]:
    """Store bytes under their sha256 (hex); returns the key. Used for pickled functions."""
    return Call(PUT_BLOB.name, {}, [data], parse=lambda h, f: h["key"])


def bye() -> Call[bool]:
    """This connection is closing on purpose: the leases it tied keep their time."""
    return Call(BYE.name, {}, parse=lambda h, f: bool(h["ok"]))


def wake(queues: Sequence[str]) -> Call[int]:
    """End the long polls of the consumers' gets waiting on `queues` now.

    End the long polls of the consumers' gets (with `tie`) waiting on `queues` now (they answer with
    nothing; a plain get waits its `wait_s` out); returns how many of those queues the server has. A
    pool stopping its consumers sends it after the signal, so that a consumer idle in a long poll
    stops at once, not when its poll ends.
    """
    return Call(WAKE.name, WAKE.header(queues=list(queues)), parse=lambda h, f: h["n"])


def get_blob(key: str) -> Call[bytes | None]:
    """The bytes stored under a key, or None."""
    return Call(GET_BLOB.name, GET_BLOB.header(key=key), parse=lambda h, f: f[0] if f else None)


def forget_blobs(keys: Sequence[str]) -> Call[int]:
    """Remove blobs; returns how many there were."""
    return Call(FORGET_BLOBS.name, FORGET_BLOBS.header(keys=list(keys)), parse=lambda h, f: h["n"])
