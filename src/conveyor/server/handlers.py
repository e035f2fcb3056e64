"""The server's operations: one table from operation name to handler.

A handler checks its arguments (a wrong type is a clear `bad-argument` error, never a crash), works
on the hosted queue, waits for durability where the operation changed something, and returns the
reply header fields and frames. Payload frames go into the store as the bytes that arrived.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from conveyor.constants import ERR_BAD_ARGUMENT, ERR_TOO_LARGE, H_IDEMPOTENCY_KEY, MAX_LEASE_S, PROTOCOL_VERSION
from conveyor.errors import RequestError, StoreError
from conveyor.message import Message, headers_bytes
from conveyor.protocol.framing import Frames, Header, Limits, column
from conveyor.server.idempotency import check_key
from conveyor.server.queues import HostedQueue, QueueHost

Reply = tuple[dict[str, Any], list[bytes]]
Handler = Callable[[QueueHost, "Args", Frames], Awaitable[Reply]]

MAX_BATCH = 1_000_000  # messages per get or page
MAX_WAIT_S = 3600.0
MAX_DELAY_S = 1e12  # finite: a message nacked with an endless delay would never come back
_MISSING = object()
_DEFAULT_LIMITS = Limits()
_PER_ITEM = 16  # bytes of header fields an item of a results reply adds (its id, its place in 'found')


class Args:
    """Typed access to a request's header fields, with errors that name the operation and field."""

    def __init__(self, header: Header) -> None:
        self.h = header
        self.op: str = header["op"]

    def _bad(self, name: str, want: str, got: object) -> RequestError:
        return RequestError(ERR_BAD_ARGUMENT, f"{self.op}: '{name}' must be {want}, got {type(got).__name__} {got!r:.60}")

    def _get(self, name: str, default: Any) -> Any:
        v = self.h.get(name, default)
        if v is _MISSING:
            raise RequestError(ERR_BAD_ARGUMENT, f"{self.op}: missing argument '{name}'")
        return v

    def str(self, name: str, default: Any = _MISSING) -> Any:
        v = self._get(name, default)
        if type(v) is not str and v is not default:
            raise self._bad(name, "a string", v)
        return v

    def int(self, name: str, default: Any = _MISSING, lo: int = 0, hi: int = 2**63 - 1) -> Any:
        v = self._get(name, default)
        if v is default and default is None:
            return v
        if type(v) is not int or not lo <= v <= hi:
            raise self._bad(name, f"an integer in [{lo}, {hi}]", v)
        return v

    def num(self, name: str, default: Any = _MISSING, lo: float = 0.0, hi: float = float("inf"), open_lo: bool = False) -> Any:
        v = self._get(name, default)
        if v is default and default is None:
            return v
        if type(v) not in (int, float) or not (lo < v if open_lo else lo <= v) or not v <= hi:
            raise self._bad(name, f"a number in {'(' if open_lo else '['}{lo}, {hi}]", v)
        return float(v)

    def bool(self, name: str, default: Any = _MISSING) -> Any:
        v = self._get(name, default)
        if type(v) is not bool and v is not default:
            raise self._bad(name, "true or false", v)
        return v

    def ids(self, name: str = "ids") -> list[int]:
        v = self._get(name, _MISSING)
        if type(v) is not list or not all(type(i) is int and 0 <= i < 2**63 for i in v):
            raise self._bad(name, "a list of non-negative 64-bit integers", v)
        return v

    def names(self, name: str) -> list[str] | None:
        v = self._get(name, None)
        if v is not None and (type(v) is not list or not all(type(e) is str for e in v)):
            raise self._bad(name, "a list of strings", v)
        return v

    def strs(self, name: str, n: int) -> list[str]:
        v = self._get(name, None)
        if v is None:
            return [""] * n
        if type(v) is not list or len(v) != n or not all(type(e) is str for e in v):
            raise self._bad(name, f"a list of {n} strings", v)
        return v

    def packed(self, name: str, n: int, default: Any) -> Any:
        """A per-message column as sent: one value for all, or a list of n (see `protocol.column`)."""
        v = self.h.get(name, default)
        if type(v) is list and len(v) != n:
            raise RequestError(ERR_BAD_ARGUMENT, f"{self.op}: '{name}' has {len(v)} values for {n} messages")
        return v

    def queue(self, host: QueueHost, create: bool = False) -> HostedQueue:
        return host.get(self.str("queue"), create)

    def reply_limits(self) -> Limits:
        """What the client accepts in a reply: it says so when that is not the default (`Limits`)."""
        v = self.h.get("lim")
        if v is None:
            return _DEFAULT_LIMITS
        try:
            return Limits.from_list(v)
        except ValueError as e:
            raise RequestError(ERR_BAD_ARGUMENT, f"{self.op}: 'lim': {e}") from None


def _check_fits(what: str, size: int, head: int, lim: Limits, more: str = "") -> None:
    """An item a reply holds alone (it came alone: bigger than a page): a `too-large` error if even so
    it breaks the client's limits (`size`: its frame; `head`: its fields in the header)."""
    if size > lim.max_item_bytes or head > lim.header_room():
        raise RequestError(ERR_TOO_LARGE, f"{what} of {size:,} bytes (and {head:,} of headers) does not fit in a reply "
                                          f"to this client, which takes at most {lim.max_frame_bytes:,} bytes per frame, "
                                          f"{lim.max_message_bytes:,} per reply and {lim.header_room():,} of headers: "
                                          f"give the client larger limits{more}")  # fmt: skip


# --- operations ---------------------------------------------------------------------------------
async def ping(host: QueueHost, a: Args, frames: Frames) -> Reply:
    return {"pong": True, "time": time.time(), "version": PROTOCOL_VERSION}, []


async def declare(host: QueueHost, a: Args, frames: Frames) -> Reply:
    q = host.declare(a.str("queue"), a.bool("durable", None), a.num("lease_s", None, open_lo=True, hi=MAX_LEASE_S),
                     a.int("max_attempts", None, 1, 0xFFFF), a.str("fsync", None))  # fmt: skip
    await q.durable()
    return {"info": asdict(q.info)}, []


async def queues(host: QueueHost, a: Args, frames: Frames) -> Reply:
    return {"queues": [asdict(q.info) for q in host.queues.values()], "unavailable": host.unavailable}, []


async def put(host: QueueHost, a: Args, frames: Frames) -> Reply:
    n = a.int("n")
    if n != len(frames):
        raise RequestError(ERR_BAD_ARGUMENT, f"put: 'n' is {n} but {len(frames)} payload frames came")
    q = a.queue(host, create=True)
    cols = [a.packed("prio", n, 0), a.packed("nb", n, 0.0), a.packed("ma", n, 0)]
    hdr = a.packed("hdr", n, {})
    if type(hdr) is not list:
        hdr = None if not hdr else [hdr] * n
    keys = None if hdr is None else [h.get(H_IDEMPOTENCY_KEY) if type(h) is dict else None for h in hdr]
    if keys is None or all(k is None for k in keys):
        ids = q.store.put_columns(frames, *cols, hdr)
        reply: dict[str, Any] = {"first": ids[0] if ids else 0, "n": len(ids)}
    else:
        reply = {"ids": _put_once(q, frames, cols, hdr, keys)}  # type: ignore[arg-type]
    q.puts += n
    q.changed.notify()
    await q.durable()
    return reply, []


def _put_once(q: HostedQueue, frames: Frames, cols: list[Any], hdr: list[dict[str, str]], keys: list[str | None]) -> list[int]:
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

    pick = [c if type(c) is not list else [c[i] for i in new] for c in cols]
    # if this fails after the keys were written, they name ids that hold no message: they count as new
    stored = q.store.put_columns([frames[i] for i in new], *pick, [hdr[i] for i in new], before=keys_first)
    if stored != [at[i] for i in new]:
        raise StoreError(f"put: the store assigned ids {stored[:3]}... where {[at[i] for i in new][:3]}... were expected")
    ids = [at.get(i, 0) for i in range(len(frames))]
    for i, k in enumerate(keys):
        if k is not None and ids[i] == 0:
            ids[i] = _stored_under(q, k) or ids[first[k]]
    return ids


def _stored_under(q: HostedQueue, key: str) -> int | None:
    """The id of the message stored under `key`; None if none is (or its id holds no message:
    its put failed or was cut short by a crash, or it was purged)."""
    i = q.dedupe.get(key)
    return i if i and q.store.status(i) is not None else None


def _columns(messages: list[Message]) -> dict[str, Any]:
    return {"ids": [m.id for m in messages], "prio": column([m.priority for m in messages]),
            "att": column([m.attempts for m in messages]), "at": column([m.enqueued_at for m in messages]),
            "nb": column([m.not_before for m in messages]), "ma": column([m.max_attempts for m in messages]),
            "hdr": column([m.headers for m in messages])}  # fmt: skip


async def get(host: QueueHost, a: Args, frames: Frames) -> Reply:
    lim = a.reply_limits()
    n = min(a.int("n", 1, 0, MAX_BATCH), lim.max_frames)
    lease = a.num("lease_s", None, open_lo=True, hi=MAX_LEASE_S)
    wait = a.num("wait_s", 0.0, 0.0, MAX_WAIT_S)
    q = a.queue(host, create=True)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        got = q.store.get_batch(n, lease, lim.reply_bytes())  # what fits in the client's limits
        left = deadline - loop.time()
        if len(got) or n == 0 or left <= 0 or host.closing:
            break
        wake = q.store.next_wakeup()
        if wake is not None:  # a delayed message comes due or a lease runs out before anything is put
            left = min(left, max(wake - q.store.clock(), 0.0) + 0.002)
        await q.changed.wait(left)
        if q.dropped:  # while we waited: nothing will come (and `got` is empty)
            break
    if len(got):
        host.touch(q)  # it may have let go of its files while the get waited: they are open again
    if len(got) == 1:
        try:
            _check_fits(f"message {got.ids[0]}", len(got.payloads[0]), headers_bytes(got.headers[0]), lim,
                        "; the message stays queued")  # fmt: skip
        except RequestError:
            q.store.release_many(got.ids)
            raise
    cols = {"ids": got.ids, "prio": column(got.priority), "att": column(got.attempts), "at": column(got.enqueued_at),
            "nb": column(got.not_before), "ma": column(got.max_attempts), "hdr": column(got.headers)}  # fmt: skip
    return {"queue": q.info.name, "lease_s": got.lease_s, "left": q.store.ready_left(), **cols}, got.payloads


async def ack(host: QueueHost, a: Args, frames: Frames) -> Reply:
    ids = a.ids()
    q = a.queue(host)
    results: list[bytes | None] | None = None
    if frames:
        if len(frames) != len(ids):
            raise RequestError(ERR_BAD_ARGUMENT, f"ack: {len(ids)} ids but {len(frames)} result frames")
        results = list(frames)
        for i in a.ids("none") if "none" in a.h else ():
            if i >= len(ids):
                raise RequestError(ERR_BAD_ARGUMENT, f"ack: 'none' holds {i}, not an index into the {len(ids)} ids")
            results[i] = None
    ok = q.store.ack_many(ids, results)
    q.acks += sum(ok)
    await q.durable()
    host.settled.notify()
    return {"ok": ok}, []


async def nack(host: QueueHost, a: Args, frames: Frames) -> Reply:
    ids = a.ids()
    errors = a.strs("errors", len(ids))
    q = a.queue(host)
    delays = a.packed("delay_s", len(ids), 0.0)
    if type(delays) is list:
        if not all(type(d) in (int, float) and 0 <= d <= MAX_DELAY_S for d in delays):
            raise RequestError(ERR_BAD_ARGUMENT, f"nack: 'delay_s' must hold numbers in [0, {MAX_DELAY_S:g}]")
    else:
        delays = [a.num("delay_s", 0.0, hi=MAX_DELAY_S)] * len(ids)
    final = a.bool("final", False)
    ok = [False] * len(ids)
    for d in dict.fromkeys(delays):  # one store call per distinct delay
        sel = [i for i, x in enumerate(delays) if x == d]
        done = q.store.nack_many([ids[i] for i in sel], [errors[i] for i in sel], float(d), final)
        for i, o in zip(sel, done, strict=True):
            ok[i] = o
    if any(ok):
        q.changed.notify()
        await q.durable()
        host.settled.notify()  # a last attempt's nack ends the message
    return {"ok": ok}, []


async def release(host: QueueHost, a: Args, frames: Frames) -> Reply:
    ids = a.ids()
    q = a.queue(host)
    ok = q.store.release_many(ids)
    if any(ok):
        q.changed.notify()
    return {"ok": ok}, []


async def result(host: QueueHost, a: Args, frames: Frames) -> Reply:
    """The results of the first of `ids` that fit in a reply (at least one): the client asks for the rest."""
    ids = a.ids()
    q = a.queue(host)
    lim = a.reply_limits()
    room, size = lim.reply_bytes(), 0
    found: list[bytes | None] = []
    for i in ids:
        r = q.store.result(i)
        cost = _PER_ITEM + (0 if r is None else len(r))
        if found and (size + cost > room or len(found) >= lim.max_frames):
            break
        if not found and r is not None:
            _check_fits(f"the result of message {i}", len(r), 0, lim)
        found.append(r)
        size += cost
    return {"found": [r is not None for r in found]}, [r for r in found if r is not None]


async def status(host: QueueHost, a: Args, frames: Frames) -> Reply:
    ids = a.ids()
    q = a.queue(host)
    return {"status": [None if (s := q.store.status(i)) is None else int(s) for i in ids]}, []


async def report(host: QueueHost, a: Args, frames: Frames) -> Reply:
    """A consumer's counts, kept (in memory) for `stats` to show."""
    worker = a.str("worker")
    counts = a.h.get("counts", {})
    if type(counts) is not dict or not all(type(k) is str and type(v) in (int, float) for k, v in counts.items()):
        raise RequestError(ERR_BAD_ARGUMENT, "report: 'counts' must map names to numbers")
    host.report(worker, counts)
    return {}, []


async def extend_lease(host: QueueHost, a: Args, frames: Frames) -> Reply:
    ids = a.ids()
    lease = a.num("lease_s", _MISSING, open_lo=True, hi=MAX_LEASE_S)
    q = a.queue(host)
    return {"ok": [q.store.extend_lease(i, lease) for i in ids]}, []


async def stats(host: QueueHost, a: Args, frames: Frames) -> Reply:
    """Counts of one queue (`queue`), of the named ones here (`queues`: names not here are left
    out) or of all. With `drained_wait_s`, the answer waits up to that long for those queues to have
    nothing pending: a join learns of the end at once instead of polling for it."""
    name = a.str("queue", None)
    names = a.names("queues")
    wait = a.num("drained_wait_s", 0.0, 0.0, MAX_WAIT_S)
    if name is not None:
        qs = [a.queue(host)]
    elif names is not None:
        qs = [host.queues[n] for n in names if n in host.queues]
    else:
        qs = list(host.queues.values())
    if wait > 0:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not all(q.dropped or q.store.drained() for q in qs) and (left := deadline - loop.time()) > 0 \
                and not host.closing:  # fmt: skip
            await host.settled.wait(left)
    out = {}
    for q in (q for q in qs if not q.dropped):
        s = asdict(q.stats())
        del s["queue"]
        out[q.info.name] = s
    return {"queues": out, "unavailable": host.unavailable, "workers": host.workers()}, []


async def purge(host: QueueHost, a: Args, frames: Frames) -> Reply:
    q = a.queue(host)
    n = q.store.purge()
    await q.durable()
    host.settled.notify()
    return {"n": n}, []


async def drop(host: QueueHost, a: Args, frames: Frames) -> Reply:
    name = a.str("queue")
    q = host.queues.get(name)
    if q is not None:
        await q.durable()  # an fsync under way ends before the files go
    dropped, trash = host.drop(name)
    if trash is not None:  # off the event loop: deleting gigabytes of segments takes a while
        await asyncio.get_running_loop().run_in_executor(None, functools.partial(shutil.rmtree, trash, ignore_errors=True))
    return {"dropped": dropped}, []


def _page_limit(a: Args) -> tuple[int, int]:
    return a.int("after", 0), a.int("limit", 1000, 1, MAX_BATCH)


async def results(host: QueueHost, a: Args, frames: Frames) -> Reply:
    after, limit = _page_limit(a)
    q = a.queue(host)
    lim = a.reply_limits()
    limit, room = min(limit, lim.max_frames), lim.reply_bytes()
    ids: list[int] = []
    out: list[bytes] = []
    size = 0
    for i, r in q.store.results(after):
        if len(ids) >= limit or (ids and size + _PER_ITEM + len(r) > room):
            break
        if not ids:
            _check_fits(f"the result of message {i}", len(r), 0, lim)
        ids.append(i)
        out.append(r)
        size += _PER_ITEM + len(r)
    return {"ids": ids}, out


async def dead_letters(host: QueueHost, a: Args, frames: Frames) -> Reply:
    after, limit = _page_limit(a)
    q = a.queue(host)
    lim = a.reply_limits()
    dls = q.store.dead_letters(after, min(limit, lim.max_frames), lim.reply_bytes())
    if len(dls) == 1:
        d = dls[0]
        _check_fits(f"dead letter {d.message.id}", len(d.message.payload), headers_bytes(d.message.headers)
                    + len(d.error.encode()), lim)  # fmt: skip
    msgs = [d.message for d in dls]
    return ({"queue": q.info.name, "lease_s": 0.0, **_columns(msgs), "errors": [d.error for d in dls],
             "failed_at": [d.failed_at for d in dls]}, [m.payload for m in msgs])  # fmt: skip


async def forget(host: QueueHost, a: Args, frames: Frames) -> Reply:
    ids = a.ids()
    q = a.queue(host)
    n = q.store.forget(ids)
    await q.durable()
    return {"n": n}, []


async def put_blob(host: QueueHost, a: Args, frames: Frames) -> Reply:
    if len(frames) != 1:
        raise RequestError(ERR_BAD_ARGUMENT, f"put_blob takes exactly one payload frame, got {len(frames)}")
    return {"key": host.blobs.put(frames[0])}, []


async def get_blob(host: QueueHost, a: Args, frames: Frames) -> Reply:
    data = host.blobs.get(a.str("key"))
    if data is not None:
        _check_fits("the blob", len(data), 0, a.reply_limits())
    return {"found": data is not None}, [] if data is None else [data]


async def forget_blobs(host: QueueHost, a: Args, frames: Frames) -> Reply:
    keys = a.names("keys")
    if keys is None:
        raise RequestError(ERR_BAD_ARGUMENT, "forget_blobs: missing argument 'keys'")
    return {"n": host.blobs.forget(keys)}, []


HANDLERS: dict[str, Handler] = {
    "ping": ping,
    "declare": declare,
    "queues": queues,
    "put": put,
    "get": get,
    "ack": ack,
    "nack": nack,
    "extend_lease": extend_lease,
    "release": release,
    "result": result,
    "status": status,
    "report": report,
    "stats": stats,
    "purge": purge,
    "drop": drop,
    "results": results,
    "dead_letters": dead_letters,
    "forget": forget,
    "put_blob": put_blob,
    "get_blob": get_blob,
    "forget_blobs": forget_blobs,
}
