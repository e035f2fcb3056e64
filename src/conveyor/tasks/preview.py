"""A task message's payload and result as a person reads them, shown without running any code.

A server's `task` answer carries the first bytes of a message's payload and of its result
(`conveyor.protocol.task_pages.Preview`), never decoded there. Here, on the reader's side (the CLI,
the dashboard), plain data encoded as msgpack is decoded (msgpack builds only plain values: safe
for any bytes) and shown as a call or a value; anything pickled is only named with its size, since
loading a pickle runs code of the sender's choosing. A preview cut short is shown as text, not
decoded.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any

from conveyor.constants import CT_MSGPACK, CT_PICKLE, H_CONTENT_TYPE, RESULT_TAG_MSGPACK, RESULT_TAG_PICKLE
from conveyor.errors import SerializationError
from conveyor.message import printable
from conveyor.protocol.task_pages import Preview
from conveyor.tasks.envelope import decode_call, decode_result

WIDTH = 300  # characters a preview is shown in, at most


@dataclass(frozen=True, slots=True)
class Shown:
    """A payload or a result as shown: how it is encoded, the text, and whether that is its decoded value."""

    encoding: str  # "msgpack", "pickle", or "unknown"
    text: str
    decoded: bool


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 10
_repr.maxlevel = 4


def show_call(preview: Preview, content_type: str | None, width: int = WIDTH) -> Shown:
    """A task message's payload: its call decoded from msgpack, or said to be pickled, with its size."""
    if content_type == CT_PICKLE:
        return Shown(CT_PICKLE, f"pickled, {preview.size:,} bytes", False)
    if content_type != CT_MSGPACK:
        return Shown("unknown", _bytes_text(preview, width), False)
    if not preview.complete:
        return Shown(CT_MSGPACK, _cut_text(preview, width), False)
    try:
        call = decode_call(preview.data, {H_CONTENT_TYPE: CT_MSGPACK})  # never the pickle path: msgpack named here
    except SerializationError as e:
        return Shown(CT_MSGPACK, f"msgpack, {preview.size:,} bytes, not a task call ({e})", False)
    parts = [_repr.repr(a) for a in call.args] + [f"{k}={_repr.repr(v)}" for k, v in call.kwargs.items()]
    return Shown(CT_MSGPACK, _fit(f"{call.name}({', '.join(parts)})", width), True)


def show_result(preview: Preview, width: int = WIDTH) -> Shown:
    """A task's stored result: its value decoded from msgpack, or said to be pickled, with its size."""
    tag = preview.data[0] if preview.data else None
    if tag == RESULT_TAG_PICKLE:
        return Shown(CT_PICKLE, f"pickled, {preview.size - 1:,} bytes", False)
    if tag != RESULT_TAG_MSGPACK:
        return Shown("unknown", _bytes_text(preview, width), False)
    if not preview.complete:
        return Shown(CT_MSGPACK, _cut_text(preview, width), False)
    try:
        value: Any = decode_result(preview.data)  # the msgpack tag, checked above: no pickle is loaded
    except SerializationError as e:
        return Shown(CT_MSGPACK, f"msgpack, {preview.size:,} bytes, undecodable ({e})", False)
    return Shown(CT_MSGPACK, _fit(_repr.repr(value), width), True)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _cut_text(preview: Preview, width: int) -> str:
    return f"msgpack, {preview.size:,} bytes (the first {len(preview.data):,} as text): {printable(preview.data, width)}"


def _bytes_text(preview: Preview, width: int) -> str:
    return f"{preview.size:,} bytes: {printable(preview.data, width)}"
