"""Previews of payloads and results (`conveyor.tasks.preview`): msgpack decoded, pickle never loaded.

The bytes are those publish and a consumer make (`encode_call`, `encode_result`), cut as a server
cuts them for a `task` answer.
"""

from __future__ import annotations

from pathlib import Path

from conveyor.constants import CT_MSGPACK, CT_PICKLE, H_CONTENT_TYPE, TASK_PREVIEW_BYTES
from conveyor.protocol.task_pages import Preview
from conveyor.tasks.envelope import encode_call, encode_result
from conveyor.tasks.preview import show_call, show_result

from ..support.docs import run_example, section_code


def cut(data: bytes) -> Preview:
    return Preview(data[:TASK_PREVIEW_BYTES], len(data))


class Trap:
    """Leaves a file behind when unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (Path(self.path),))


def test_a_msgpack_call_shows_as_a_call() -> None:
    payload, headers = encode_call("app.resize", ("a.png", (640, 480)), {"fast": True, "tags": ["x"] * 30})
    shown = show_call(cut(payload), headers[H_CONTENT_TYPE])
    assert shown.decoded and shown.encoding == CT_MSGPACK
    assert shown.text.startswith("app.resize('a.png', (640, 480), fast=True, tags=['x', 'x',")
    assert "..." in shown.text  # a long list is cut, not shown whole


def test_pickled_calls_and_results_are_named_never_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "loaded"
    payload, headers = encode_call("app.f", (Trap(str(marker)),), {})
    assert headers[H_CONTENT_TYPE] == CT_PICKLE
    assert show_call(cut(payload), CT_PICKLE).text == f"pickled, {len(payload):,} bytes"
    result = encode_result(Trap(str(marker)))
    assert show_result(cut(result)).text == f"pickled, {len(result) - 1:,} bytes"
    # msgpack named by a header over pickled bytes: read as msgpack, which loads nothing
    shown = show_call(cut(payload), CT_MSGPACK)
    assert not shown.decoded
    assert not marker.exists()


def test_a_result_shows_its_value_and_a_cut_one_shows_as_text() -> None:
    shown = show_result(cut(encode_result({"rows": 3, "ok": True})))
    assert (shown.text, shown.decoded) == ("{'ok': True, 'rows': 3}", True)  # reprlib sorts the keys
    big = encode_result("word " * 1000)
    shown = show_result(cut(big))
    assert not shown.decoded and shown.text.startswith(f"msgpack, {len(big):,} bytes (the first {TASK_PREVIEW_BYTES:,} as text)")
    assert "word word" in shown.text


def test_bytes_of_no_known_kind_show_as_text() -> None:
    assert show_call(Preview(b"raw\x00bytes", 9), None).text == "9 bytes: raw.bytes"
    assert show_result(Preview(b"", 0)).text == "0 bytes: "
    assert not show_call(Preview(b"\xc1\xc1", 2), CT_MSGPACK).decoded  # damaged msgpack: said, not raised


def test_the_docs_example_runs_as_written(tmp_path: Path) -> None:
    out = run_example(section_code("server.md", "### Task records"), tmp_path, 60)
    assert out.returncode == 0, out.stderr
    call, result = out.stdout.splitlines()
    assert call == "app.resize('a.png', 640)" and result.startswith("pickled, ") and result.endswith(" bytes")
