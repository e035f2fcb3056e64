"""The message model and its msgpack codec."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.message import Message, Status, decode, encode, make_message

messages = st.builds(
    Message,
    id=st.integers(0, 2**64 - 1),
    queue=st.text(max_size=20),
    payload=st.binary(max_size=2000),
    priority=st.integers(-(2**31), 2**31 - 1),
    attempts=st.integers(0, 2**16 - 1),
    enqueued_at=st.floats(allow_nan=False, allow_infinity=False),
    not_before=st.floats(allow_nan=False, allow_infinity=False),
    lease_s=st.floats(0, 1e9, allow_nan=False),
    max_attempts=st.integers(0, 2**16 - 1),
    headers=st.dictionaries(st.text(max_size=10), st.text(max_size=30), max_size=5),
)


@given(messages)
def test_codec_round_trip(m: Message) -> None:
    assert decode(encode(m)) == m


@given(messages, st.integers(1, 2**63), st.text(max_size=5), st.integers(0, 100), st.floats(0, 100))
def test_codec_overrides(m: Message, i: int, q: str, attempts: int, lease: float) -> None:
    assert decode(encode(m, id=i), queue=q, attempts=attempts, lease_s=lease) == dataclasses.replace(
        m, id=i, queue=q, attempts=attempts, lease_s=lease
    )


def test_message_is_frozen_and_slotted() -> None:
    m = Message(payload=b"x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.id = 3  # type: ignore[misc]
    assert not hasattr(m, "__dict__")
    fast = make_message(1, "q", b"x", 2, 3, 4.0, 5.0, 6.0, 7, {"a": "b"})
    assert fast == Message(1, "q", b"x", 2, 3, 4.0, 5.0, 6.0, 7, {"a": "b"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.payload = b"y"  # type: ignore[misc]


def test_status_values() -> None:
    assert [s.name for s in Status] == ["READY", "DELIVERED", "ACKED", "FAILED"]


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01\x02\x03", b"\xa3abc"])
def test_decode_rejects_garbage(data: bytes) -> None:
    with pytest.raises(ValueError, match="not an encoded message"):
        decode(data)


def test_encode_rejects_unencodable_fields() -> None:
    with pytest.raises(TypeError, match="cannot be encoded"):
        encode(Message(payload=object()))  # type: ignore[arg-type]
