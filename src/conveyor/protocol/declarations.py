"""Every server operation, declared once: its name, request fields and reply fields.

The client builds requests from these declarations (`Operation.header`) and the server checks a
request's arguments against them (`Operation.arguments`): a field's wire key, type, bounds and
default live here and nowhere else. A wrong type or an out-of-range value is a `bad-argument`
error naming the operation and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from conveyor.constants import (
    ERR_BAD_ARGUMENT,
    MAX_BATCH,
    MAX_HOST_CHARS,
    MAX_LEASE_S,
    MAX_WAIT_S,
    TASK_PAGE_MAX,
)
from conveyor.errors import RequestError
from conveyor.protocol.framing import Header
from conveyor.protocol.report import HOST

_I64 = 2**63 - 1


class Kind(Enum):
    """What a field holds on the wire."""

    STR = "a string"
    INT = "an integer"
    NUM = "a number"
    BOOL = "true or false"
    IDS = "a list of non-negative 64-bit integers"
    NAMES = "a list of strings"
    STRS = "a list of strings, one per id"
    COLUMN = "one value for all messages, or a list of one per message"
    COUNTS = f"a map of names to numbers ('{HOST}': a string of at most {MAX_HOST_CHARS} characters)"


REQUIRED: Any = object()  # the default of a field a request must carry
_ABSENT: Any = object()


@dataclass(frozen=True, slots=True)
class Field:
    """One request field: its Python name, its key on the wire, its kind, default and bounds."""

    name: str
    kind: Kind
    default: Any = REQUIRED
    wire: str = ""  # "" : the same as the name
    lo: float = 0
    hi: float | None = None  # None: the largest 64-bit integer, or no bound for a number
    open_lo: bool = False  # lo itself is out of range

    @property
    def key(self) -> str:
        return self.wire or self.name

    def check(self, op: str, v: Any) -> Any:
        """The value as the server uses it, or a `bad-argument` RequestError."""
        k = self.kind
        if k is Kind.STR:
            ok = type(v) is str
        elif k is Kind.INT:
            ok = type(v) is int and self.lo <= v <= (_I64 if self.hi is None else self.hi)
        elif k is Kind.NUM:
            hi = math.inf if self.hi is None else self.hi
            ok = type(v) in (int, float) and (self.lo < v if self.open_lo else self.lo <= v) and v <= hi
            v = float(v) if ok else v
        elif k is Kind.BOOL:
            ok = type(v) is bool
        elif k is Kind.IDS:
            ok = type(v) is list and all(type(i) is int and 0 <= i <= _I64 for i in v)
        elif k is Kind.NAMES:
            ok = type(v) is list and all(type(e) is str for e in v)
        elif k is Kind.COUNTS:
            ok = type(v) is dict and all(type(a) is str and _count(a, b) for a, b in v.items())
        else:  # a column or one string per id: checked where their count is known (`Arguments.column`, `strs`)
            ok = True
        if not ok:
            raise RequestError(ERR_BAD_ARGUMENT, f"{op}: '{self.key}' must be {self._want()}, got {type(v).__name__} {v!r:.60}")
        return v

    def _want(self) -> str:
        if self.kind is Kind.INT:
            return f"an integer in [{int(self.lo)}, {_I64 if self.hi is None else int(self.hi)}]"
        if self.kind is Kind.NUM:
            hi = math.inf if self.hi is None else float(self.hi)
            return f"a number in {'(' if self.open_lo else '['}{float(self.lo)}, {hi}]"
        return str(self.kind.value)


def _count(name: str, v: Any) -> bool:
    """A report's count is a number; its host, a short string (shown by `conveyor stats`)."""
    if name == HOST:
        return type(v) is str and len(v) <= MAX_HOST_CHARS
    return type(v) in (int, float)


@dataclass(frozen=True, slots=True)
class Operation:
    """A server operation: what a request carries and what its reply holds."""

    name: str
    request: tuple[Field, ...] = ()
    reply: tuple[str, ...] = ()
    doc: str = ""
    fields: dict[str, Field] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", {f.name: f for f in self.request})

    def header(self, **values: Any) -> dict[str, Any]:
        """A request's header fields from Python values, defaults left out.

        A request's header fields from Python values; values left out or equal to the default are
        not sent (the server applies the same default).
        """
        out: dict[str, Any] = {}
        for name, v in values.items():
            f = self.fields[name]  # KeyError: a field this operation does not declare
            if v is None or (f.default is not REQUIRED and _same(v, f.default)):
                continue
            out[f.key] = v
        return out

    def arguments(self, header: Header) -> Arguments:
        return Arguments(self, header)


def _same(v: Any, default: Any) -> bool:
    """Whether a value is the field's default as the server reads it (1.0 is no default count)."""
    if type(v) is type(default) or (type(default) is float and type(v) is int):
        return bool(v == default)
    return False


class Arguments:
    """A request's fields as its operation declares them: `args["lease_s"]` is checked on first use."""

    __slots__ = ("header", "op")

    def __init__(self, op: Operation, header: Header) -> None:
        self.op = op
        self.header = header

    def __getitem__(self, name: str) -> Any:
        f = self.op.fields[name]
        v = self.header.get(f.key, _ABSENT)
        if v is _ABSENT:
            if f.default is REQUIRED:
                raise RequestError(ERR_BAD_ARGUMENT, f"{self.op.name}: missing argument '{f.key}'")
            return f.default
        if v is None and f.default is None and f.kind is not Kind.IDS:  # sent as None: as if left out
            return None
        return f.check(self.op.name, v)

    def given(self, name: str) -> bool:
        return self.op.fields[name].key in self.header

    def column(self, name: str, n: int) -> Any:
        """A per-message column as sent: one value for all, or a list of n (see `framing.column`)."""
        v = self[name]
        if type(v) is list and len(v) != n:
            key = self.op.fields[name].key
            raise RequestError(ERR_BAD_ARGUMENT, f"{self.op.name}: '{key}' has {len(v)} values for {n} messages")
        return v

    def strs(self, name: str, n: int) -> list[str]:
        """A list of n strings ("" for each when left out)."""
        v = self[name]
        if v is None:
            return [""] * n
        if type(v) is not list or len(v) != n or not all(type(e) is str for e in v):
            raise RequestError(ERR_BAD_ARGUMENT, f"{self.op.name}: '{self.op.fields[name].key}' must be a list of {n} strings")
        return v


LIMITS_KEY = "lim"  # any request: the reply limits of a client that does not take the defaults (`Limits.as_list`)

# --- the message columns: per-message fields of put requests and of get / dead_letters replies ---
COL_IDS, COL_PRIORITY, COL_ATTEMPTS, COL_ENQUEUED_AT = "ids", "prio", "att", "at"
COL_NOT_BEFORE, COL_MAX_ATTEMPTS, COL_HEADERS = "nb", "ma", "hdr"
MESSAGE_COLUMNS = (COL_IDS, COL_PRIORITY, COL_ATTEMPTS, COL_ENQUEUED_AT, COL_NOT_BEFORE, COL_MAX_ATTEMPTS, COL_HEADERS)


# --- request fields several operations share ----------------------------------------------------
_QUEUE = Field("queue", Kind.STR)
_IDS = Field("ids", Kind.IDS)
_LEASE = Field("lease_s", Kind.NUM, None, open_lo=True, hi=MAX_LEASE_S)
_AFTER = Field("after", Kind.INT, 0)
_LIMIT = Field("limit", Kind.INT, 1000, lo=1, hi=MAX_BATCH)
_FETCHED = ("queue", "lease_s", *MESSAGE_COLUMNS)

PING = Operation("ping", (), ("pong", "time", "version"), "Is the server there; its time and protocol version.")
DECLARE = Operation(
    "declare",
    (
        _QUEUE,
        Field("kind", Kind.STR, None),
        _LEASE,
        Field("max_attempts", Kind.INT, None, lo=1, hi=0xFFFF),
        Field("fsync", Kind.STR, None),
    ),
    ("info",),
    "Create a queue, or check that it exists with these settings.",
)
QUEUES = Operation("queues", (), ("queues", "unavailable"), "Every queue's settings.")
PUT = Operation(
    "put",
    (
        _QUEUE,
        Field("n", Kind.INT),
        Field("priority", Kind.COLUMN, 0, COL_PRIORITY),
        Field("not_before", Kind.COLUMN, 0.0, COL_NOT_BEFORE),
        Field("max_attempts", Kind.COLUMN, 0, COL_MAX_ATTEMPTS),
        Field("headers", Kind.COLUMN, {}, COL_HEADERS),
    ),
    ("first", "n", "ids"),
    "Append messages (payloads as frames); their ids.",
)
GET = Operation(
    "get",
    (
        _QUEUE,
        Field("n", Kind.INT, 1, hi=MAX_BATCH),
        _LEASE,
        Field("wait_s", Kind.NUM, 0.0, hi=MAX_WAIT_S),
        Field("tie", Kind.BOOL, False),
        Field("consumer", Kind.STR, None),
    ),
    (*_FETCHED, "left", "woken"),
    "Lease up to n messages, waiting up to wait_s for some; with tie (a "
    "consumer's get), the leases also end when the connection is closed by "
    "its peer, and a wake ends the wait (`woken`). `consumer`: who fetches, "
    "as the server's task records name it.",
)
ACK = Operation(
    "ack",
    (_QUEUE, _IDS, Field("none", Kind.IDS, None)),
    ("ok",),
    "Finish messages, with results as frames (`none`: the positions without one).",
)
NACK = Operation(
    "nack",
    (_QUEUE, _IDS, Field("errors", Kind.STRS, None), Field("delay_s", Kind.COLUMN, 0.0), Field("final", Kind.BOOL, False)),
    ("ok",),
    "Give messages back after a delay, or to the dead letters.",
)
RELEASE = Operation("release", (_QUEUE, _IDS), ("ok",), "Give back messages never started.")
RESULT = Operation("result", (_QUEUE, _IDS), ("found",), "The stored results of ids (as many as fit in a reply).")
STATUS = Operation("status", (_QUEUE, _IDS), ("status",), "Where each message is.")
REPORT = Operation("report", (Field("worker", Kind.STR), Field("counts", Kind.COUNTS, {})), (), "A consumer's counts.")
EXTEND_LEASE = Operation(
    "extend_lease",
    (_QUEUE, _IDS, Field("lease_s", Kind.NUM, open_lo=True, hi=MAX_LEASE_S)),
    ("ok",),
    "Push the leases of delivered messages to now + lease_s.",
)
STATS = Operation(
    "stats",
    (Field("queue", Kind.STR, None), Field("queues", Kind.NAMES, None), Field("drained_wait_s", Kind.NUM, 0.0, hi=MAX_WAIT_S)),
    ("queues", "unavailable", "workers"),
    "Counts and rates of queues; with drained_wait_s, once they have nothing pending.",
)
PURGE = Operation("purge", (_QUEUE,), ("n",), "Drop every READY and delayed message.")
CANCEL = Operation(
    "cancel",
    (_QUEUE, _IDS),
    ("ok", "status"),
    "Make READY and delayed messages dead letters with the error 'cancelled'; which were, and where each id is now.",
)
DROP = Operation("drop", (_QUEUE,), ("dropped",), "Remove a queue and everything it holds.")
RESULTS = Operation("results", (_QUEUE, _AFTER, _LIMIT), ("ids",), "A page of stored results in id order.")
DEAD_LETTERS = Operation(
    "dead_letters", (_QUEUE, _AFTER, _LIMIT), (*_FETCHED, "errors", "failed_at"), "A page of dead letters in id order."
)
FORGET = Operation("forget", (_QUEUE, _IDS), ("n",), "Drop stored results and dead letters of ids.")
STORED = Operation(
    "stored",
    (_QUEUE, Field("keys", Kind.NAMES)),
    ("ids",),
    "The ids of the messages stored under idempotency keys (0: none; a queue not there holds none).",
)
BYE = Operation("bye", (), ("ok",), "This connection closes on purpose: leases it took with tie keep their time.")
WAKE = Operation(
    "wake",
    (Field("queues", Kind.NAMES),),
    ("n",),
    "Answer the consumers' gets (with tie) waiting on these queues now, empty: they look again (at a stop, say).",
)
TASKS = Operation(
    "tasks",
    (
        Field("queue", Kind.STR, None),
        Field("task", Kind.STR, None),
        Field("state", Kind.STR, None),
        Field("msg_id", Kind.INT, 0, "mid"),
        Field("limit", Kind.INT, 100, lo=1, hi=TASK_PAGE_MAX),
    ),
    ("time", "running", "recent", "running_total"),
    "Running deliveries and recently finished ones, newest first, of a queue (default: every queue), "
    "with this task name, state or message id: at most `limit` of each.",
)
TASK = Operation(
    "task",
    (_QUEUE, Field("msg_id", Kind.INT, wire="mid", lo=1)),
    ("time", "status", "records", "headers", "enqueued_at", "payload", "result", "dead_error"),
    "One message: where it is, its deliveries kept, its headers, and previews (as frames) of its "
    "payload and result: `payload` and `result` are their whole sizes, or None; a dead letter's error.",
)
PUT_BLOB = Operation("put_blob", (), ("key",), "Store one frame under its sha256.")
GET_BLOB = Operation("get_blob", (Field("key", Kind.STR),), ("found",), "The bytes stored under a key.")
FORGET_BLOBS = Operation("forget_blobs", (Field("keys", Kind.NAMES),), ("n",), "Remove blobs.")

OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        PING,
        DECLARE,
        QUEUES,
        PUT,
        GET,
        ACK,
        NACK,
        RELEASE,
        RESULT,
        STATUS,
        REPORT,
        EXTEND_LEASE,
        STATS,
        PURGE,
        CANCEL,
        DROP,
        RESULTS,
        DEAD_LETTERS,
        FORGET,
        STORED,
        PUT_BLOB,
        GET_BLOB,
        FORGET_BLOBS,
        BYE,
        WAKE,
        TASKS,
        TASK,
    )
}
# every request also carries these keys, and a reply these: no field may take one
assert not {f.key for op in OPERATIONS.values() for f in op.request} & {"op", "id", LIMITS_KEY}
assert not {k for op in OPERATIONS.values() for k in op.reply} & {"id", "error", "message"}
