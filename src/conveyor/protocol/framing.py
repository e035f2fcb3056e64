"""The wire protocol: frame sets, their limits, and the column codec both sides use.

A frame set is a msgpack header (a map with at least "op" and "id") plus raw payload frames; see
`constants` for the byte layout. One parser, written as a generator that asks for byte counts,
serves both the asyncio server/client and the blocking client, so the limits are checked in one
place. Payload frames are handed over as bytes exactly as sent: nothing here decodes them.
"""

from __future__ import annotations

import asyncio
import itertools
import mmap
import socket
import struct
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from conveyor.constants import (
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_FRAMES,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    FRAME_LENGTH,
    FRAME_PREFIX,
    PAGE_BYTES,
    READ_CHUNK_BYTES,
    REQUEST_SLACK_BYTES,
)
from conveyor.errors import ConnectionLostError, ProtocolError

Header = dict[str, Any]
Frames = list[bytes]
Body = bytes | mmap.mmap  # what a parser is sent: a part over READ_CHUNK_BYTES (frames, a header) comes in a map (`read`)

_packb = msgpack.Packer(use_bin_type=True).pack
_prefix_pack = FRAME_PREFIX.pack
_prefix_unpack = FRAME_PREFIX.unpack


@dataclass(frozen=True, slots=True)
class Limits:
    """What one side accepts from the other; anything larger is a protocol error."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_frames: int = DEFAULT_MAX_FRAMES
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    def __post_init__(self) -> None:
        for name in _LIMIT_FIELDS:
            v = getattr(self, name)
            if type(v) is not int or not 0 < v < 2**32:
                raise ValueError(f"{name} must be an integer in [1, 2**32), got {v!r}")

    def as_list(self) -> list[int]:
        """How a side tells the other its limits (the server in its hello, a client in its requests)."""
        return [getattr(self, name) for name in _LIMIT_FIELDS]

    @classmethod
    def from_list(cls, value: object) -> Limits:
        """Limits from `as_list`; ValueError for anything else."""
        if type(value) is not list or len(value) != len(_LIMIT_FIELDS):
            raise ValueError(f"limits must be a list of {len(_LIMIT_FIELDS)} integers, got {value!r:.80}")
        return cls(*value)

    @property
    def max_item_bytes(self) -> int:
        """The largest single payload, result or blob this side takes: one frame, within one message."""
        return min(self.max_frame_bytes, self.max_message_bytes)

    def reply_bytes(self) -> int:
        """Bytes a reply to this side may carry: a page within every limit of the side.

        Bytes a reply to this side may carry, counting each message's header fields with its
        payload (`Store._sizes`): a page of at most PAGE_BYTES, within every limit of the side. Only
        an item bigger than that alone can break a limit (a reply holds at least one item).
        """
        return min(PAGE_BYTES, self.max_message_bytes, self.max_frame_bytes, self.header_room())

    def header_room(self) -> int:
        """Header bytes for per-item fields: the header limit less a little for the rest of the header."""
        return max(self.max_header_bytes // 2, self.max_header_bytes - REQUEST_SLACK_BYTES)

    def pieces(self, frames: Sequence[int], headers: Sequence[int], what: str = "item") -> list[range]:
        """Split a request's items into runs that each fit these limits.

        Split a request's items (each one payload frame of `frames[i]` bytes and about `headers[i]`
        bytes of header fields) into runs that each fit these limits. ValueError for an item that
        fits in no request, naming it (`what` and its index) and its size.
        """
        out: list[range] = []
        start, size, head = 0, 0, 0
        room = self.header_room()
        for i, (f, h) in enumerate(zip(frames, headers, strict=True)):
            if f > self.max_frame_bytes or h > room:
                why = (
                    f"{f:,} bytes, over the server's limit of {self.max_frame_bytes:,} per frame"
                    if f > self.max_frame_bytes
                    else f"about {h:,} bytes of headers, over the limit of {room:,}"
                )
                raise ValueError(f"{what} {i} does not fit in a request: {why}")
            if i > start and (size + f > self.max_message_bytes or head + h > room or i - start >= self.max_frames):
                out.append(range(start, i))
                start, size, head = i, 0, 0
            size += f
            head += h
        if start < len(frames):
            out.append(range(start, len(frames)))
        return out


_LIMIT_FIELDS = ("max_frame_bytes", "max_header_bytes", "max_frames", "max_message_bytes")


def encode(header: Header, frames: Sequence[bytes] = ()) -> list[bytes]:
    """The parts of a frame set, ready for `writelines` / `sendall(b"".join(...))`."""
    h = _packb(header)
    n = len(frames)
    if not n:
        return [_prefix_pack(len(h), 0), h]
    lens = struct.pack(FRAME_LENGTH.format(n), *map(len, frames))
    return [_prefix_pack(len(h), n), lens, h, *frames]


def parser(
    limits: Limits, request: bool, sized: Callable[[int], None] | None = None
) -> Generator[int, Body, tuple[Header, Frames]]:
    """Parse one frame set: yields how many bytes it needs next, is sent exactly those bytes.

    A request's header must name its operation; a reply's need not. `sized` is told, before the
    header is asked for, how many bytes the header and the payload frames will take (the frames
    counted only if within the limits). A part may come in an anonymous `mmap` rather than bytes:
    its frames are copied out of it, and its pages given back as they are.
    """
    hlen, nframes = _prefix_unpack((yield FRAME_PREFIX.size))
    if hlen > limits.max_header_bytes:
        raise ProtocolError(f"header of {hlen:,} bytes exceeds the limit of {limits.max_header_bytes:,}")
    if nframes > limits.max_frames:
        raise ProtocolError(f"{nframes:,} payload frames exceed the limit of {limits.max_frames:,}")
    lens: tuple[int, ...] = ()
    total, over = 0, False
    if nframes:
        lens = struct.unpack(FRAME_LENGTH.format(nframes), (yield 4 * nframes))
        total = sum(lens)
        over = max(lens) > limits.max_frame_bytes or total > limits.max_message_bytes
    if sized is not None:
        sized(hlen + (0 if over else total))
    header = decode_header((yield hlen), request)
    rid = header["id"]
    if over:
        big = max(lens)
        if big > limits.max_frame_bytes:
            raise ProtocolError(f"a payload frame of {big:,} bytes exceeds the limit of {limits.max_frame_bytes:,}", rid)
        raise ProtocolError(f"payload frames of {total:,} bytes in all exceed the limit of {limits.max_message_bytes:,}", rid)
    if not lens:
        return header, []
    body = yield total
    if isinstance(body, bytes):
        return header, [body[a:b] for a, b in itertools.pairwise(itertools.accumulate(lens, initial=0))]
    return header, _unmap(body, lens)


def _unmap(body: mmap.mmap, lens: Sequence[int]) -> Frames:
    """The frames in a map, each as bytes, the pages behind them given back as they go."""
    frames: Frames = []
    at = freed = 0
    for n in lens:
        frames.append(body[at : at + n])
        at += n
        if at - freed >= READ_CHUNK_BYTES:  # one system call per chunk at most, not per frame
            body.madvise(mmap.MADV_DONTNEED, 0, at - at % mmap.PAGESIZE)
            freed = at
    return frames


def decode_header(raw: Body, request: bool) -> Header:
    """A header map with an "id" (int) and, for a request, an "op" (str); else a protocol error."""
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"header is not valid msgpack: {type(e).__name__}: {e}") from None
    if type(header) is not dict:
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    rid = header.get("id")
    if type(rid) is not int or not 0 <= rid < 2**63:
        raise ProtocolError(f"header field 'id' must be a non-negative 64-bit integer, got {rid!r:.40}")
    if request and type(header.get("op")) is not str:
        raise ProtocolError(f"header field 'op' must be a string, got {header.get('op')!r:.40}", rid)
    return header


async def read(
    reader: asyncio.StreamReader,
    limits: Limits,
    request: bool,
    started: Callable[[], None] | None = None,
    admit: Callable[[int], Awaitable[None] | None] | None = None,
) -> tuple[Header, Frames]:
    """Read one frame set from a stream; raises EOFError at a clean end of stream.

    `started` is called once its first bytes are in (a server times how long the rest takes);
    `admit` is told the bytes its header and frames will take before they are read, and what it
    returns, if anything, is awaited first (a server waits there for room in its memory budget),
    and `started` called again after it.
    A part of more than READ_CHUNK_BYTES (frames, or a header) is read into an anonymous map, a
    chunk at a time: the stream never buffers it all, and a frame set cut short gives its memory
    back to the system at once, whatever holds an exception's traceback (a traceback can keep the
    connection, and so the stream's buffer, until a garbage collection).
    """
    sizes: list[int] = []
    gen = parser(limits, request, None if admit is None else sizes.append)
    n = next(gen)
    first = True
    try:
        while True:
            if sizes and admit is not None and (wait := admit(sizes.pop())) is not None:
                await wait
                if started is not None:  # the time it waited is not the peer's
                    started()
            if n > READ_CHUNK_BYTES:
                body = await _mapped(reader, n)
                try:
                    n = gen.send(body)
                finally:
                    body.close()
                continue
            try:
                data = await reader.readexactly(n)
            except asyncio.IncompleteReadError as e:
                if first and not e.partial:
                    raise EOFError from None
                raise _cut(len(e.partial), n) from None
            if first:
                first = False
                if started is not None:
                    started()
            n = gen.send(data)
    except StopIteration as stop:
        message: tuple[Header, Frames] = stop.value
        return message
    except BaseException:
        gen.close()  # what it read so far: a traceback keeping its frame would keep that too
        raise


def _cut(got: int, n: int) -> ProtocolError:
    return ProtocolError(f"connection closed in the middle of a message ({got:,} of {n:,} bytes)")


async def _mapped(reader: asyncio.StreamReader, n: int) -> mmap.mmap:
    """n bytes in an anonymous map, read READ_CHUNK_BYTES at a time."""
    body = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    at = 0
    try:
        for at in range(0, n, READ_CHUNK_BYTES):
            body[at : at + READ_CHUNK_BYTES] = await reader.readexactly(min(READ_CHUNK_BYTES, n - at))
        return body
    except asyncio.IncompleteReadError as e:
        body.close()
        raise _cut(at + len(e.partial), n) from None
    except BaseException:
        body.close()
        raise


class SocketReader:
    """Reads replies from a blocking socket, buffering what `recv` returns beyond them."""

    def __init__(self, sock: socket.socket, limits: Limits) -> None:
        self.sock = sock
        self.limits = limits
        self._buf = bytearray()

    def _exactly(self, n: int) -> bytes:
        buf = self._buf
        while len(buf) < n:
            chunk = self.sock.recv(max(n - len(buf), 262144))
            if not chunk:
                raise ConnectionLostError("the server closed the connection")
            buf += chunk
        if len(buf) == n:
            out = bytes(buf)
            buf.clear()
        else:
            out = bytes(memoryview(buf)[:n])
            del buf[:n]
        return out

    def read(self) -> tuple[Header, Frames]:
        gen = parser(self.limits, request=False)
        n = next(gen)
        try:
            while True:
                n = gen.send(self._exactly(n))
        except StopIteration as stop:
            message: tuple[Header, Frames] = stop.value
            return message


# --- columns: per-message fields of a batch, a scalar when all values are equal -------------------
def column(values: Sequence[Any]) -> Any:
    """A list of per-message values, or the one value when all are equal (the common case).

    Equal means `==`: a column is expected to hold one type (1 and 1.0 would collapse to 1).
    """
    if not values:
        return []
    first = values[0]
    if values.count(first) == len(values):
        return first
    return list(values)


def expand(value: Any, n: int, name: str) -> list[Any]:
    """Undo `column`: a list of n values; raises ValueError when a list has the wrong length."""
    if type(value) is list:
        if len(value) != n:
            raise ValueError(f"'{name}' has {len(value)} values for {n} messages")
        return value
    if type(value) is dict:  # one mutable map per message, never shared
        return [dict(value) for _ in range(n)]
    return [value] * n
