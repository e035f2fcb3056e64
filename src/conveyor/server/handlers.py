"""The server's operations: one handler per operation declared in `conveyor.protocol.declarations`.

A handler reads its arguments as the declaration checks them (a wrong type is a clear
`bad-argument` error, never a crash), works on the hosted queue, waits for durability where the
operation changed something, and returns the reply header fields and frames. Payload frames go
into the store as the bytes that arrived.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from operator import itemgetter
from typing import Any

from conveyor.constants import (
    CANCELLED_ERROR,
    ERR_BAD_ARGUMENT,
    ERR_NO_QUEUE,
    H_IDEMPOTENCY_KEY,
    MAX_CONSUMER_CHARS,
    MAX_DELAY_S,
    PROTOCOL_VERSION,
    TASK_HISTORY_MAX,
    TASK_PREVIEW_BYTES,
)
from conveyor.errors import RequestError, StoreError
from conveyor.message import Status, headers_bytes
from conveyor.protocol.declarations import COL_IDS, MESSAGE_COLUMNS, OPERATIONS, Arguments, Operation
from conveyor.protocol.framing import Frames, column
from conveyor.protocol.task_pages import R_AT, R_END, TaskState
from conveyor.server.connection_leases import CONNECTION_LEASES
from conveyor.server.idempotency import check_key
from conveyor.server.queues import HostedQueue, QueueHost
from conveyor.server.replies import check_fits, reply_limits, room

Reply = tuple[dict[str, Any], list[bytes]]
Handler = Callable[[QueueHost, Arguments, Frames], Awaitable[Reply]]

_PER_ITEM = 16  # bytes of header fields an item of a results reply adds (its id, its place in 'found')
# A connection's next tied get this soon after a `wake` of its queue does not wait either (once): its
# consumer, stopping, may have been between the requests of one long poll (a look at each shard) then.
WAKE_HOLD_S = 0.05


def _queue(host: QueueHost, a: Arguments, create: bool = False) -> HostedQueue:
    return host.get(a["queue"], create)


# --- operations ---------------------------------------------------------------------------------
async def ping(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    return {"pong": True, "time": time.time(), "version": PROTOCOL_VERSION}, []


async def declare(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    q = host.declare(a["queue"], a["kind"], a["lease_s"], a["max_attempts"], a["fsync"])
    await q.durable()
    return {"info": asdict(q.info)}, []


async def queues(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    return {"queues": [asdict(q.info) for q in host.queues.values()], "unavailable": host.unavailable}, []


async def put(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    n = a["n"]
    if n != len(frames):
        raise RequestError(ERR_BAD_ARGUMENT, f"put: 'n' is {n} but {len(frames)} payload frames came")
    q = _queue(host, a, create=True)
    cols = (a.column("priority", n), a.column("not_before", n), a.column("max_attempts", n))
    hdr = a.column("headers", n)
    if type(hdr) is not list:
        hdr = None if not hdr else [hdr] * n
    keys = None if hdr is None else [h.get(H_IDEMPOTENCY_KEY) if type(h) is dict else None for h in hdr]
    if keys is None or all(k is None for k in keys):
        ids = q.store.put_columns(frames, cols[0], cols[1], cols[2], hdr)
        reply: dict[str, Any] = {"first": ids[0] if ids else 0, "n": len(ids)}
    else:
        reply = {"ids": _put_once(q, frames, cols, hdr, keys)}
    q.changed.notify()
    await q.durable()
    return reply, []


def _put_once(
    q: HostedQueue, frames: Frames, cols: tuple[Any, Any, Any], hdr: list[dict[str, str]], keys: list[str | None]
) -> list[int]:
    """Put the messages whose idempotency key is new; every message gets the id stored under its key.

    The keys are written before their messages, with the ids the store reserved for them (durably:
    no other message ever gets them, whatever crashed when). A crash between the two leaves keys
    naming ids that hold no message, which count as new. The other order would leave stored
    messages whose keys are forgotten, and a retried put would store them again.
    """
    first: dict[str, int] = {}  # key -> position of its first message in this batch
    new: list[int] = []
    for i, k in enumerate(keys):
        if k is None:
            new.append(i)
            continue
        try:
            check_key(k)
        except ValueError as e:
            raise RequestError(ERR_BAD_ARGUMENT, f"put: message {i}: {e}") from None
        if _stored_under(q, k) is None and k not in first:
            first[k] = i
            new.append(i)
    at: dict[int, int] = {}  # position -> the id the store gives it

    def keys_first(start: int) -> None:  # with the ids reserved for them: never another message's
        at.update((i, start + j) for j, i in enumerate(new))
        q.dedupe.add([(k, at[i]) for k, i in first.items()])

    prio, nb, ma = (c if type(c) is not list else [c[i] for i in new] for c in cols)
    # if this fails after the keys were written, they name ids that hold no message: they count as new
    stored = q.store.put_columns([frames[i] for i in new], prio, nb, ma, [hdr[i] for i in new], before=keys_first)
    if stored != [at[i] for i in new]:
        raise StoreError(f"put: the store assigned ids {stored[:3]}... where {[at[i] for i in new][:3]}... were expected")
    ids = [at.get(i, 0) for i in range(len(frames))]
    for i, k in enumerate(keys):
        if k is not None and ids[i] == 0:
            ids[i] = _stored_under(q, k) or ids[first[k]]
    return ids


def _stored_under(q: HostedQueue, key: str) -> int | None:
    """The id of the message stored under `key`, or None.

    The id of the message stored under `key`; None if none is (or its id holds no message:
    its put failed or was cut short by a crash, or it was purged).
    """
    i = q.dedupe.get(key)
    return i if i and q.store.status(i) is not None else None


def _columns(ids: list[int], *cols: list[Any]) -> dict[str, Any]:
    """A batch's message columns as a reply carries them.

    A batch's message columns as a reply carries them (`MESSAGE_COLUMNS`: ids, then one value
    for all or a list of one per message).
    """
    return {COL_IDS: ids, **{k: column(c) for k, c in zip(MESSAGE_COLUMNS[1:], cols, strict=True)}}


async def get(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    lim = reply_limits(a)
    n = min(a["n"], lim.max_frames)
    lease = a["lease_s"]
    wait = a["wait_s"]
    q = _queue(host, a, create=True)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    leases = CONNECTION_LEASES.get()  # the connection's record of its ties: one per connection
    wakes = q.wakes - (loop.time() < q.woken_until and id(leases) not in q.woken)  # a wake just now counts, once
    wakeable = a["tie"]  # a wake answers a consumer's get (it ties its leases), never a plain one
    while True:
        got = q.store.get_batch(n, lease, (await room(lim)).reply_bytes())  # what fits in the client's limits
        left = deadline - loop.time()
        if len(got) or n == 0 or left <= 0 or host.closing or (wakeable and q.wakes != wakes):  # woken: answer now, empty
            break
        await q.changed.wait(q.store.poll_wait(left))  # woken by a put, or when something comes due
        if q.dropped:  # while we waited: nothing will come (and `got` is empty)
            break
    if len(got):
        host.touch(q)  # it may have let go of its files while the get waited: they are open again
    if len(got) == 1:
        try:
            check_fits(
                f"message {got.ids[0]}", len(got.payloads[0]), headers_bytes(got.headers[0]), lim, "; the message stays queued"
            )
        except RequestError:
            q.store.release_many(got.ids)
            raise
    if woken := wakeable and q.wakes != wakes:
        q.woken.add(id(leases))
    if a["tie"] and len(got) and leases is not None:
        leases.took(q, got.ids)
    q.tasks.delivered(got, (a["consumer"] or "")[:MAX_CONSUMER_CHARS], time.time())
    cols = _columns(got.ids, got.priority, got.attempts, got.enqueued_at, got.not_before, got.max_attempts, got.headers)
    return {"queue": q.info.name, "lease_s": got.lease_s, "left": q.store.ready_left(), "woken": woken, **cols}, got.payloads


async def ack(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    ids = a["ids"]
    q = _queue(host, a)
    results: list[bytes | None] | None = None
    if frames:
        if len(frames) != len(ids):
            raise RequestError(ERR_BAD_ARGUMENT, f"ack: {len(ids)} ids but {len(frames)} result frames")
        results = list(frames)
        for i in a["none"] or ():
            if i >= len(ids):
                raise RequestError(ERR_BAD_ARGUMENT, f"ack: 'none' holds {i}, not an index into the {len(ids)} ids")
            results[i] = None
    ok = q.store.ack_many(ids, results)
    q.tasks.acked(ids, ok, time.time())
    await q.durable()
    host.settled.notify()
    return {"ok": ok}, []


async def nack(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    ids = a["ids"]
    errors = a.strs("errors", len(ids))
    q = _queue(host, a)
    delays = a.column("delay_s", len(ids))
    if type(delays) is list:
        if not all(type(d) in (int, float) and 0 <= d <= MAX_DELAY_S for d in delays):
            raise RequestError(ERR_BAD_ARGUMENT, f"nack: 'delay_s' must hold numbers in [0, {MAX_DELAY_S:g}]")
    else:
        if not (type(delays) in (int, float) and 0 <= delays <= MAX_DELAY_S):
            raise RequestError(ERR_BAD_ARGUMENT, f"nack: 'delay_s' must be a number in [0, {MAX_DELAY_S:g}]")
        delays = [float(delays)] * len(ids)
    ok = q.store.nack_each(ids, errors, delays, a["final"])
    if any(ok):
        q.tasks.nacked(ids, ok, errors, q.store.status, time.time())
        q.changed.notify()
        await q.durable()
        host.settled.notify()  # a last attempt's nack ends the message
    return {"ok": ok}, []


async def release(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    ids = a["ids"]
    q = _queue(host, a)
    ok = q.store.release_many(ids)
    if any(ok):
        q.tasks.released(ids, ok, time.time())
        q.changed.notify()
    return {"ok": ok}, []


async def result(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    """The results of the first of `ids` that fit in a reply (at least one): the client asks for the rest."""
    ids = a["ids"]
    q = _queue(host, a)
    lim = await room(reply_limits(a))
    space, size = lim.reply_bytes(), 0
    found: list[bytes | None] = []
    for i in ids:
        r = q.store.result(i)
        cost = _PER_ITEM + (0 if r is None else len(r))
        if found and (size + cost > space or len(found) >= lim.max_frames):
            break
        if not found and r is not None:
            check_fits(f"the result of message {i}", len(r), 0, lim)
        found.append(r)
        size += cost
    return {"found": [r is not None for r in found]}, [r for r in found if r is not None]


async def status(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    ids = a["ids"]
    q = _queue(host, a)
    return {"status": [None if (s := q.store.status(i)) is None else int(s) for i in ids]}, []


async def report(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    """A consumer's counts, kept (in memory) for `stats` to show."""
    host.report(a["worker"], a["counts"])
    return {}, []


async def extend_lease(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    ids = a["ids"]
    lease = a["lease_s"]
    q = _queue(host, a)
    ok = [q.store.extend_lease(i, lease) for i in ids]
    q.tasks.extended(ids, ok, lease, time.time())
    return {"ok": ok}, []


async def stats(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    """Counts of one queue (`queue`), of the named ones here (`queues`: names not here are left out) or of all.

    With `drained_wait_s`, the answer waits up to that long for those queues to have nothing
    pending: a join learns of the end at once instead of polling for it.
    """
    name = a["queue"]
    names = a["queues"]
    wait = a["drained_wait_s"]
    if name is not None:
        qs = [_queue(host, a)]
    elif names is not None:
        qs = [host.queues[n] for n in names if n in host.queues]
    else:
        qs = list(host.queues.values())
    if wait > 0:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not all(q.dropped or q.store.drained() for q in qs) and (left := deadline - loop.time()) > 0 and not host.closing:
            await host.settled.wait(left)
    out = {}
    for q in (q for q in qs if not q.dropped):
        s = asdict(q.stats())
        del s["queue"]
        out[q.info.name] = s
    return {"queues": out, "unavailable": host.unavailable, "workers": host.workers()}, []


async def purge(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    q = _queue(host, a)
    n = q.store.purge()
    await q.durable()
    host.settled.notify()
    return {"n": n}, []


async def cancel(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    """READY and delayed messages of `ids` to the dead letters (CANCELLED_ERROR); the others are left as they are.

    The reply says which were cancelled and where each id is now: a delivered one may be running,
    and its task is not stopped.
    """
    ids = a["ids"]
    q = _queue(host, a)
    ok = q.store.cancel(ids, CANCELLED_ERROR)
    if any(ok):
        await q.durable()
        host.settled.notify()  # a wait for the queue to drain may end
    return {"ok": ok, "status": [None if (s := q.store.status(i)) is None else int(s) for i in ids]}, []


async def drop(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    name = a["queue"]
    q = host.queues.get(name)
    if q is not None:
        await q.settled()  # an fsync under way or due ends before the files go
    dropped, trash = host.drop(name)
    if trash is not None:  # off the event loop: deleting gigabytes of segments takes a while
        await asyncio.get_running_loop().run_in_executor(None, functools.partial(shutil.rmtree, trash, ignore_errors=True))
    return {"dropped": dropped}, []


def _page_limit(a: Arguments) -> tuple[int, int]:
    return a["after"], a["limit"]


async def results(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    after, limit = _page_limit(a)
    q = _queue(host, a)
    lim = await room(reply_limits(a))
    limit, space = min(limit, lim.max_frames), lim.reply_bytes()
    ids: list[int] = []
    out: list[bytes] = []
    size = 0
    for i, r in q.store.results(after):
        if len(ids) >= limit or (ids and size + _PER_ITEM + len(r) > space):
            break
        if not ids:
            check_fits(f"the result of message {i}", len(r), 0, lim)
        ids.append(i)
        out.append(r)
        size += _PER_ITEM + len(r)
    return {"ids": ids}, out


async def dead_letters(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    after, limit = _page_limit(a)
    q = _queue(host, a)
    lim = await room(reply_limits(a))
    dls = q.store.dead_letters(after, min(limit, lim.max_frames), lim.reply_bytes())
    if len(dls) == 1:
        d = dls[0]
        check_fits(
            f"dead letter {d.message.id}", len(d.message.payload), headers_bytes(d.message.headers) + len(d.error.encode()), lim
        )
    ms = [d.message for d in dls]
    fields = ("priority", "attempts", "enqueued_at", "not_before", "max_attempts", "headers")
    cols = _columns([m.id for m in ms], *([getattr(m, f) for m in ms] for f in fields))
    return (
        {"queue": q.info.name, "lease_s": 0.0, **cols, "errors": [d.error for d in dls], "failed_at": [d.failed_at for d in dls]},
        [m.payload for m in ms],
    )


async def forget(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    ids = a["ids"]
    q = _queue(host, a)
    n = q.store.forget(ids)
    await q.durable()
    return {"n": n}, []


async def stored(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    keys = [check_key(k) for k in a["keys"]]
    try:
        q = _queue(host, a)
    except RequestError as e:
        if e.kind != ERR_NO_QUEUE:
            raise
        return {"ids": [0] * len(keys)}, []
    return {"ids": [_stored_under(q, k) or 0 for k in keys]}, []


async def put_blob(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    if len(frames) != 1:
        raise RequestError(ERR_BAD_ARGUMENT, f"put_blob takes exactly one payload frame, got {len(frames)}")
    return {"key": host.blobs.put(frames[0])}, []


async def get_blob(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    lim = await room(reply_limits(a))
    data = host.blobs.get(a["key"])
    if data is not None:
        check_fits("the blob", len(data), 0, lim)
    return {"found": data is not None}, [] if data is None else [data]


async def forget_blobs(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    return {"n": host.blobs.forget(a["keys"])}, []


async def bye(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    return {"ok": True}, []  # the server unties the connection as it reads the request (QueueServer._serve)


async def wake(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    qs = [host.queues[n] for n in a["queues"] if n in host.queues]
    until = asyncio.get_running_loop().time() + WAKE_HOLD_S
    for q in qs:
        q.wakes, q.woken_until = q.wakes + 1, until
        q.woken.clear()
        q.changed.notify()
    return {"n": len(qs)}, []


async def tasks(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    """A page of the task records of one queue, or of every queue here, each kind newest first."""
    name, task, limit, msg_id = a["queue"], a["task"], a["limit"], a["msg_id"]
    try:
        state = None if a["state"] is None else TaskState.named(a["state"])
    except ValueError as e:
        raise RequestError(ERR_BAD_ARGUMENT, f"tasks: {e}") from None
    qs = [_queue(host, a)] if name is not None else [q for q in host.queues.values() if not q.dropped]
    now = time.time()
    running: list[dict[str, Any]] = []
    recent: list[dict[str, Any]] = []
    total = 0
    for q in qs:
        q.tasks.sweep(q.store.status, now)
        r, s, n = q.tasks.page(task, state, msg_id, limit)
        running += r
        recent += s
        total += n
    if len(qs) > 1:  # newest first over every queue
        running = sorted(running, key=itemgetter(R_AT), reverse=True)[:limit]
        recent = sorted(recent, key=itemgetter(R_END), reverse=True)[:limit]
    return {"time": now, "running": running, "recent": recent, "running_total": total}, []


async def task(host: QueueHost, a: Arguments, frames: Frames) -> Reply:
    """One message: its status, its deliveries kept, and what is known of its headers, payload and result.

    From its records (its headers and a preview of its payload, as delivered), else, for a dead
    letter, from the dead letter; its result if it is kept. Previews are at most
    TASK_PREVIEW_BYTES: the server never decodes them.
    """
    msg_id = a["msg_id"]
    q = _queue(host, a)
    now = time.time()
    q.tasks.sweep(q.store.status, now)
    st = q.store.status(msg_id)
    kept = q.tasks.of(msg_id)
    reply: dict[str, Any] = {
        "time": now,
        "status": None if st is None else int(st),
        "records": [q.tasks.wire(r, e) for r, e in kept[-TASK_HISTORY_MAX:]],
        "headers": None,
        "enqueued_at": None,
        "payload": None,
        "result": None,
        "dead_error": None,
    }
    out: list[bytes] = []
    if kept:
        headers, enqueued_at, preview, size = q.tasks.message_of(kept[-1][0])
        reply.update(headers=headers, enqueued_at=enqueued_at, payload=size)
        out.append(preview)
    if st is Status.FAILED:
        dead = q.store.dead_letters(msg_id - 1, 1)
        if dead and dead[0].message.id == msg_id:
            m = dead[0].message
            reply["dead_error"] = dead[0].error
            if not kept:
                reply.update(headers=m.headers, enqueued_at=m.enqueued_at, payload=len(m.payload))
                out.append(bytes(m.payload[:TASK_PREVIEW_BYTES]))
    elif st is Status.ACKED and (result := q.store.result(msg_id)) is not None:
        reply["result"] = len(result)
        out.append(bytes(result[:TASK_PREVIEW_BYTES]))
    return reply, out


HANDLERS: dict[str, tuple[Operation, Handler]] = {}
for _name, _op in OPERATIONS.items():
    HANDLERS[_name] = (_op, globals()[_name])  # one handler per declared operation, named after it
