"""The message model every layer shares.

An immutable `Message`, its `Status`, a `DeadLetter`, the columns of a batch (`MessageBatch`) and
the msgpack codec.

A store assigns `id`, `attempts`, `enqueued_at` and `lease_s`; producers set the rest.
The payload is opaque bytes: nothing in Conveyor's servers or stores ever decodes it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import msgpack

from conveyor.constants import ST_ACKED, ST_DELIVERED, ST_FAILED, ST_READY


class Status(enum.IntEnum):
    """Where a message is in its life: READY -> DELIVERED -> ACKED, or FAILED (dead letter)."""

    READY = ST_READY
    DELIVERED = ST_DELIVERED
    ACKED = ST_ACKED
    FAILED = ST_FAILED


@dataclass(frozen=True, slots=True)
class Message:
    """One unit of work.

    id: 64-bit id, unique within its queue, assigned by the store on put (0 before).
    priority: higher is served first; FIFO among equal priorities.
    attempts: deliveries so far, counting the one that returned this message.
    enqueued_at: wall-clock time of the put (seconds since the epoch).
    not_before: wall-clock time before which the message is not served (0: at once).
    lease_s: the lease this delivery was granted (0 when not delivered).
    max_attempts: deliveries allowed before the message becomes a dead letter (0: store default).
    """

    id: int = 0
    queue: str = ""
    payload: bytes = b""
    priority: int = 0
    attempts: int = 0
    enqueued_at: float = 0.0
    not_before: float = 0.0
    lease_s: float = 0.0
    max_attempts: int = 0
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        """(queue, id): what names the message among those of several queues (each numbers its own)."""
        return self.queue, self.id


FIELDS = tuple(Message.__dataclass_fields__)
_Setter = Callable[[Any, Any], None]


def slot_setters(cls: type[Any]) -> tuple[_Setter, ...]:
    """The slot setters of a frozen, slotted dataclass's fields, in order.

    They bypass the frozen check, so a hot path builds an instance from `object.__new__` at a third
    of `__init__`'s cost.
    """
    return tuple(cls.__dict__[f.name].__set__ for f in fields(cls))


_S = slot_setters(Message)


def printable(payload: bytes, width: int) -> str:
    """A payload's first `width` bytes as printable text (others as "."; "…" if cut).

    Payloads are opaque bytes: shown, never decoded.
    """
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in payload[:width])
    return text + ("…" if len(payload) > width else "")


def headers_bytes(headers: dict[str, str]) -> int:
    """About the bytes a message's headers take on the wire.

    Their strings, encoded, and a little around each: what requests and replies count against a
    header limit.
    """
    return sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items()) if headers else 0


def make_message(
    id: int,
    queue: str,
    payload: bytes,
    priority: int,
    attempts: int,
    enqueued_at: float,
    not_before: float,
    lease_s: float,
    max_attempts: int,
    headers: dict[str, str],
    _new: Callable[[type[Message]], Message] = object.__new__,
    _M: type[Message] = Message,
    _s: tuple[_Setter, ...] = _S,
) -> Message:
    """Build a Message from trusted fields twice as fast as its frozen `__init__` (hot paths only)."""
    m = _new(_M)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9 = _s
    s0(m, id)
    s1(m, queue)
    s2(m, payload)
    s3(m, priority)
    s4(m, attempts)
    s5(m, enqueued_at)
    s6(m, not_before)
    s7(m, lease_s)
    s8(m, max_attempts)
    s9(m, headers)
    return m


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that used up its attempts, with the last error and when it failed."""

    message: Message
    error: str
    failed_at: float


@dataclass(slots=True)
class MessageBatch:
    """Delivered messages as columns, one list per field: what a server sends without building Messages."""

    queue: str
    lease_s: float
    ids: list[int]
    priority: list[int]
    attempts: list[int]
    enqueued_at: list[float]
    not_before: list[float]
    max_attempts: list[int]
    headers: list[dict[str, str]]
    payloads: list[bytes]

    def __len__(self) -> int:
        return len(self.ids)

    def messages(self) -> list[Message]:
        q, lease = self.queue, self.lease_s
        return [
            make_message(i, q, p, pr, a, at, nb, lease, ma, h)
            for i, p, pr, a, at, nb, ma, h in zip(
                self.ids,
                self.payloads,
                self.priority,
                self.attempts,
                self.enqueued_at,
                self.not_before,
                self.max_attempts,
                self.headers,
                strict=True,
            )
        ]


_packb: Callable[[object], bytes] = msgpack.Packer(use_bin_type=True).pack
_unpackb: Callable[[bytes], Any] = msgpack.unpackb


def encode(m: Message, id: int | None = None, queue: str | None = None, enqueued_at: float | None = None) -> bytes:
    """Encode a message as a msgpack array in field order; keyword arguments replace fields."""
    try:
        return _packb(
            [
                m.id if id is None else id,
                m.queue if queue is None else queue,
                m.payload,
                m.priority,
                m.attempts,
                m.enqueued_at if enqueued_at is None else enqueued_at,
                m.not_before,
                m.lease_s,
                m.max_attempts,
                m.headers,
            ]
        )
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"message {m.id} cannot be encoded: {e}") from None


def decode(data: bytes, *, queue: str | None = None, attempts: int | None = None, lease_s: float | None = None) -> Message:
    """Decode `encode`'s output into a Message; keyword arguments replace fields."""
    try:
        f = _unpackb(data)
    except Exception as e:  # msgpack raises several unrelated types
        raise ValueError(f"not an encoded message: {e}") from None
    if type(f) is not list or len(f) != 10:
        raise ValueError(f"not an encoded message: expected an array of {len(FIELDS)} fields")
    if queue is not None:
        f[1] = queue
    if attempts is not None:
        f[4] = attempts
    if lease_s is not None:
        f[7] = lease_s
    return make_message(*f)
