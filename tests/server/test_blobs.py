"""A server's blobs (`conveyor.server.blobs`): content-addressed bytes, kept on disk or in memory.

What a server keeps for `put_blob` (a pickled function): found by the sha256 of its bytes, kept
across a restart on its data dir, forgotten on request, and a key that is not 64 hex digits refused
before it can name a path.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from conveyor.constants import ERR_BAD_ARGUMENT
from conveyor.errors import RequestError
from conveyor.server.blobs import Blobs


@pytest.mark.parametrize("kept", ["disk", "memory"])
def test_blobs_are_found_by_the_hash_of_their_bytes_and_forgotten_on_request(tmp_path: Path, kept: str) -> None:
    blobs = Blobs(tmp_path / "blobs" if kept == "disk" else None)
    key = blobs.put(b"a pickled function")
    assert key == hashlib.sha256(b"a pickled function").hexdigest()
    assert blobs.put(b"a pickled function") == key  # the same bytes twice: one blob
    assert blobs.get(key) == b"a pickled function"
    other = blobs.put(b"another")
    assert blobs.forget([key, key]) == 1  # forgotten once; a key not held counts nothing
    assert blobs.get(key) is None and blobs.get(other) == b"another"


def test_blobs_on_disk_outlive_the_server_that_kept_them(tmp_path: Path) -> None:
    key = Blobs(tmp_path / "blobs").put(b"kept")
    assert Blobs(tmp_path / "blobs").get(key) == b"kept"  # a server started again on the same data dir


@pytest.mark.parametrize("key", ["../../etc/passwd", "A" * 64, "0" * 63, "", "0" * 64 + "/x"])
def test_a_key_that_is_not_a_sha256_is_refused_before_it_names_a_file(tmp_path: Path, key: str) -> None:
    (tmp_path / "secret").write_bytes(b"not a blob")
    blobs = Blobs(tmp_path / "blobs")
    for call in (lambda: blobs.get(key), lambda: blobs.forget([key])):
        with pytest.raises(RequestError, match="a blob key is 64 hex digits") as e:
            call()
        assert e.value.kind == ERR_BAD_ARGUMENT
    assert (tmp_path / "secret").read_bytes() == b"not a blob"
