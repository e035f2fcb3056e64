"""The bodies of a durable store's message and dead-letter records, encoded and decoded.

A message body is MESSAGE_PREFIX (kind, id, priority, max_attempts, not_before, enqueued_at,
headers length), then the msgpack headers and the raw payload, so that neither recovery nor reads
decode msgpack for a message without headers. A dead letter is msgpack of (error, failed_at,
attempts, the message's body). Encoding and decoding work on whole batches: one call per batch.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence

import msgpack

from conveyor.constants import KIND_MESSAGE, MESSAGE_PREFIX
from conveyor.message import DeadLetter, Message, make_message

_MSG_PREFIX = MESSAGE_PREFIX.size
_unpack_msg = MESSAGE_PREFIX.unpack_from
_packb = msgpack.Packer(use_bin_type=True).pack


def message_bodies(
    ids: Sequence[int],
    priority: Sequence[int],
    max_attempts: Sequence[int],
    not_before: Sequence[float],
    payloads: Sequence[bytes],
    headers: Sequence[dict[str, str]] | None,
    now: float,
) -> list[bytes]:
    """The bodies of new messages (columns of scheduling fields, one entry per id)."""
    pack = MESSAGE_PREFIX.pack
    cols = (ids, priority, max_attempts, not_before)
    if headers is None or not any(headers):
        return [pack(KIND_MESSAGE, i, p, x, t, now, 0) + d for d, i, p, x, t in zip(payloads, *cols, strict=True)]
    out = []
    last, hb = None, b""  # a batch's messages often share one headers dict (a server's put does): packed once
    for d, h, i, p, x, t in zip(payloads, headers, *cols, strict=True):
        if h is not last:
            last, hb = h, _packb(h) if h else b""
        out.append(b"".join((pack(KIND_MESSAGE, i, p, x, t, now, len(hb)), hb, d)))
    return out


def read_messages(
    mapped: Callable[[int, int], mmap.mmap], segs: list[int], offs: list[int], sizes: list[int]
) -> tuple[list[float], list[float], list[dict[str, str]], list[bytes]]:
    """(enqueued_at, not_before, headers, payload) of the message bodies at these locations.

    (enqueued_at, not_before, headers, payload) of the message bodies at these locations, read
    through `mapped(segment, end)` (a `SegmentLog`'s maps: the caller holds the store's lock).
    """
    at: list[float] = []
    nb: list[float] = []
    headers: list[dict[str, str]] = []
    payloads: list[bytes] = []
    unpack, unpackb = _unpack_msg, msgpack.unpackb
    seg, mm = -1, None
    last, last_h = b"", {}  # messages put together have the same headers: decoded once, then copied
    for s, o, n in zip(segs, offs, sizes, strict=True):
        if s != seg or mm is None or o + n > len(mm):  # consecutive messages mostly sit in one segment
            seg, mm = s, mapped(s, o + n)
        _, _, _, _, t_nb, t_at, hlen = unpack(mm, o)
        start = o + _MSG_PREFIX
        at.append(t_at)
        nb.append(t_nb)
        if hlen:
            hb = mm[start : start + hlen]
            if hb != last:
                last, last_h = hb, unpackb(hb)
            headers.append(last_h.copy())  # each message's own map (a caller may change one)
        else:
            headers.append({})
        payloads.append(mm[start + hlen : o + n])
    return at, nb, headers, payloads


def parse_message(buf: bytes | mmap.mmap, off: int, size: int, queue: str, attempts: int, lease_s: float) -> Message:
    """A Message from its KIND_MESSAGE body at `buf[off:off + size]`."""
    _, msg_id, prio, max_att, nb, at, hlen = _unpack_msg(buf, off)
    start = off + _MSG_PREFIX
    headers = msgpack.unpackb(buf[start : start + hlen]) if hlen else {}
    return make_message(msg_id, queue, buf[start + hlen : off + size], prio, attempts, at, nb, lease_s, max_att, headers)


def dead_letter_bodies(errors: Sequence[str], now: float, attempts: list[int], bodies: list[bytes]) -> list[bytes]:
    """The bodies of dead letters: each message's error and attempts, failed at `now`, and its body."""
    return [_packb([e, now, a, b]) for e, a, b in zip(errors, attempts, bodies, strict=True)]


def parse_dead_letter(raw: bytes, queue: str) -> DeadLetter:
    """A DeadLetter from its body (as `dead_letter_bodies` wrote it)."""
    error, failed_at, attempts, body = msgpack.unpackb(raw, raw=False)
    return DeadLetter(parse_message(body, 0, len(body), queue, attempts, 0.0), error, failed_at)
