"""What the `tasks` and `task` operations answer: a server's records of task runs, typed both ways.

A queue server records each delivery of a message (its task name, from the message's headers, the
consumer it went to, its attempt, since when) until it is settled, and keeps the last ones settled
(`conveyor.server.task_records`). `tasks` answers a page of them, `task` the records of one message
with its headers and a preview of its payload and of its result. Servers never decode payloads: a
preview is bytes, which the reader decodes where that is safe (`conveyor.tasks.preview`).

On the wire a record is a map under the keys below; `TaskRecord.from_wire` reads one back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from conveyor.constants import H_CONTENT_TYPE, H_TASK
from conveyor.message import Status


class TaskState(Enum):
    """Where a delivery of a message stands: running, or how it ended."""

    RUNNING = "running"  # delivered, not settled yet
    ACKED = "acked"  # finished
    RETRIED = "retried"  # nacked: back in its queue for another attempt
    FAILED = "failed"  # nacked: a dead letter now (out of attempts, or failed for good)
    EXPIRED = "expired"  # its lease ran out, or its consumer's connection closed: back in its queue
    DEAD = "dead-lettered"  # its lease ran out on its last attempt: a dead letter now
    RELEASED = "released"  # given back unstarted (the attempt not counted)

    @classmethod
    def named(cls, name: str) -> TaskState:
        """The state of this name; ValueError naming the known ones."""
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"no task state {name!r}: one of {', '.join(s.value for s in cls)}") from None


# the keys of a record on the wire
R_QUEUE, R_ID, R_TASK, R_STATE, R_CONSUMER, R_ATTEMPT, R_AT, R_END, R_ERROR = (
    "q",
    "id",
    "task",
    "st",
    "by",
    "att",
    "at",
    "end",
    "err",
)


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One delivery of a message, as the server that made it recorded it.

    `consumer` is the name the consumer fetched under ("" for a client that gave none). Times are
    the server's (seconds since the epoch); `runtime_s` is from the delivery to its end, or to the
    server's answer while it runs.
    """

    queue: str
    id: int  # pool-wide in a ShardedQueues' answer
    task: str  # the message's task name ("" for a message put without one)
    state: TaskState
    consumer: str
    attempt: int  # the message's attempts, this one included
    delivered_at: float
    finished_at: float | None  # None while it runs
    error: str  # of a failed or retried delivery, or the reason a lease ended ("" otherwise)
    runtime_s: float

    @classmethod
    def from_wire(cls, d: dict[str, Any], now: float, id_base: int = 0) -> TaskRecord:
        """A record from its map, `now` the server's time of the answer; `id_base` adds a pool's shard bits."""
        end = d[R_END]
        at = float(d[R_AT])
        return cls(
            str(d[R_QUEUE]),
            id_base + int(d[R_ID]),
            str(d[R_TASK]),
            TaskState(d[R_STATE]),
            str(d[R_CONSUMER]),
            int(d[R_ATTEMPT]),
            at,
            None if end is None else float(end),
            str(d[R_ERROR]),
            max(0.0, (now if end is None else float(end)) - at),
        )


def record_wire(
    queue: str, msg_id: int, task: str, state: TaskState, consumer: str, attempt: int, at: float, end: float | None, error: str
) -> dict[str, Any]:
    """A record as the server sends it (`TaskRecord.from_wire` reads it)."""
    return {
        R_QUEUE: queue,
        R_ID: msg_id,
        R_TASK: task,
        R_STATE: state.value,
        R_CONSUMER: consumer,
        R_ATTEMPT: attempt,
        R_AT: at,
        R_END: end,
        R_ERROR: error,
    }


@dataclass(frozen=True, slots=True)
class TaskPage:
    """Running deliveries and recently finished ones, each newest first.

    `running_total` counts every running delivery that matched (a page holds at most its limit);
    `unreachable` names the servers of a pool that did not answer, with their errors.
    """

    running: list[TaskRecord] = field(default_factory=list)
    recent: list[TaskRecord] = field(default_factory=list)
    running_total: int = 0
    unreachable: dict[str, str] = field(default_factory=dict)

    @classmethod
    def merged(cls, pages: list[TaskPage], limit: int) -> TaskPage:
        """The pages of several servers as one, newest first, at most `limit` of each kind."""
        running = sorted((r for p in pages for r in p.running), key=lambda r: r.delivered_at, reverse=True)[:limit]
        recent = sorted((r for p in pages for r in p.recent), key=lambda r: r.finished_at or 0.0, reverse=True)[:limit]
        unreachable = {a: e for p in pages for a, e in p.unreachable.items()}
        return cls(running, recent, sum(p.running_total for p in pages), unreachable)


@dataclass(frozen=True, slots=True)
class Preview:
    """The first bytes of a payload or a result (all of it when `complete`), and its whole size."""

    data: bytes
    size: int

    @property
    def complete(self) -> bool:
        return len(self.data) == self.size


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """One step of a message's history: `what` is "put", "delivered", or the `TaskState` value it ended in."""

    at: float
    what: str
    consumer: str = ""
    attempt: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class TaskDetail:
    """One message as its server knows it: where it is, its records, headers, payload and result previews.

    `status` is where the message is (None: no such message on its server). `headers`, `payload` and
    `enqueued_at` are known for a message delivered since its server started (its records keep
    them) or a dead letter; `result` for an acked message whose result is kept; `error` is a dead
    letter's error, whole. `records` are its deliveries the server still keeps, oldest first.
    """

    queue: str
    id: int
    status: Status | None
    records: list[TaskRecord]
    headers: dict[str, str] | None = None
    enqueued_at: float | None = None
    payload: Preview | None = None
    result: Preview | None = None
    error: str | None = None

    @property
    def task(self) -> str:
        """The message's task name ("" when unknown)."""
        if self.headers is not None and H_TASK in self.headers:
            return self.headers[H_TASK]
        return self.records[-1].task if self.records else ""

    @property
    def content_type(self) -> str | None:
        """How its payload is encoded (the header publish sets: msgpack or pickle), if known."""
        return None if self.headers is None else self.headers.get(H_CONTENT_TYPE)

    def history(self) -> list[TaskEvent]:
        """Its put, then each delivery and how it ended, in order (as far as the server's records go)."""
        out = [] if self.enqueued_at is None else [TaskEvent(self.enqueued_at, "put")]
        for r in self.records:
            out.append(TaskEvent(r.delivered_at, "delivered", r.consumer, r.attempt))
            if r.finished_at is not None:
                out.append(TaskEvent(r.finished_at, r.state.value, r.consumer, r.attempt, r.error))
        return out


# the reply of `task`: which previews follow as frames, in this order
PREVIEW_FRAMES = ("payload", "result")


def detail_from_reply(queue: str, msg_id: int, h: dict[str, Any], frames: list[bytes], id_base: int = 0) -> TaskDetail:
    """A `task` reply as a `TaskDetail` (`msg_id`: as the caller knows it, pool-wide)."""
    now = float(h["time"])
    it = iter(frames)
    previews = {k: None if h[k] is None else Preview(next(it), int(h[k])) for k in PREVIEW_FRAMES}
    at = h["enqueued_at"]
    return TaskDetail(
        queue,
        msg_id,
        None if h["status"] is None else Status(h["status"]),
        [TaskRecord.from_wire(r, now, id_base) for r in h["records"]],
        h["headers"],
        None if at is None or not math.isfinite(at) else float(at),
        previews["payload"],
        previews["result"],
        h["dead_error"],
    )
