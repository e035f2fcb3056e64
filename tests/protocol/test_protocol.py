"""The frame-set codec and its limits, without a network."""

from __future__ import annotations

from collections.abc import Generator

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.errors import ProtocolError
from conveyor.protocol.framing import Frames, Header, Limits, column, encode, expand, parser


def feed(data: bytes, limits: Limits | None = None, request: bool = True) -> tuple[Header, Frames]:
    """Run the parser over `data`, which must hold exactly one frame set."""
    gen: Generator[int, bytes, tuple[Header, Frames]] = parser(limits or Limits(), request)
    pos = 0
    n = next(gen)
    try:
        while True:
            if pos + n > len(data):
                raise EOFError(f"parser wants {n} bytes at {pos}, only {len(data) - pos} left")
            chunk, pos = data[pos : pos + n], pos + n
            n = gen.send(chunk)
    except StopIteration as stop:
        assert pos == len(data), "the parser left bytes unread"
        return stop.value


@given(
    st.dictionaries(st.text(max_size=8), st.integers(-(2**63), 2**63 - 1) | st.text() | st.binary(), max_size=5),
    st.lists(st.binary(max_size=300), max_size=20),
    st.integers(0, 2**63 - 1),
)
def test_round_trip(extra: dict[str, object], frames: list[bytes], rid: int) -> None:
    header = {**extra, "op": "put", "id": rid}
    got_header, got_frames = feed(b"".join(encode(header, frames)))
    assert got_header == header
    assert got_frames == frames and all(type(f) is bytes for f in got_frames)


def test_replies_need_no_operation() -> None:
    assert feed(b"".join(encode({"id": 3, "ok": [True]})), request=False) == ({"id": 3, "ok": [True]}, [])
    with pytest.raises(ProtocolError, match="'op'") as e:
        feed(b"".join(encode({"id": 3})))
    assert e.value.request_id == 3


@pytest.mark.parametrize(
    ("limits", "frames", "match", "knows_id"),
    [
        (Limits(max_frame_bytes=10), [b"x" * 11], "payload frame of 11 bytes exceeds the limit of 10", True),
        (Limits(max_message_bytes=15), [b"x" * 8, b"y" * 8], "16 bytes in all exceed the limit of 15", True),
        (Limits(max_frames=2), [b"a", b"b", b"c"], "3 payload frames exceed the limit of 2", False),
        (Limits(max_header_bytes=8), [], "header of .* bytes exceeds the limit of 8", False),
    ],
)
def test_limits(limits: Limits, frames: list[bytes], match: str, knows_id: bool) -> None:
    data = b"".join(encode({"op": "put", "id": 9, "queue": "q"}, frames))
    with pytest.raises(ProtocolError, match=match) as e:
        feed(data, limits)
    assert e.value.request_id == (9 if knows_id else 0)


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([1, 2]), "must be a map"),
        (msgpack.packb({"op": "x"}), "'id' must be"),
        (msgpack.packb({"op": "x", "id": -1}), "'id' must be"),
        (msgpack.packb({"op": 5, "id": 1}), "'op' must be"),
        (msgpack.packb({1: 2, "id": 1, "op": "x"}), "not valid msgpack"),  # only string keys
        (b"", "not valid msgpack"),
    ],
)
def test_malformed_headers(header: bytes, match: str) -> None:
    from conveyor.constants import FRAME_PREFIX

    with pytest.raises(ProtocolError, match=match):
        feed(FRAME_PREFIX.pack(len(header), 0) + header)


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_frame_bytes"):
        Limits(max_frame_bytes=0)


@given(st.lists(st.integers(-5, 5) | st.floats(allow_nan=False), max_size=20))
def test_column_round_trip(values: list[object]) -> None:
    packed = column(values)
    assert expand(packed, len(values), "v") == values
    if len(set(map(repr, values))) == 1 and len(values) > 1:
        assert type(packed) is not list  # all equal: one value on the wire


def test_expand_checks_length_and_never_shares_maps() -> None:
    with pytest.raises(ValueError, match="has 2 values for 3 messages"):
        expand([1, 2], 3, "prio")
    maps = expand({"k": "v"}, 3, "hdr")
    maps[0]["k"] = "changed"
    assert maps[1] == {"k": "v"}
