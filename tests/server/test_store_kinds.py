"""Store kinds (`conveyor.server.store_kinds`): queues declared by kind name, over a real server on 127.0.0.1."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client.in_process import InProcessQueues
from conveyor.client.queue_client import QueueClient
from conveyor.constants import QUEUE_CONFIG_NAME, QUEUES_DIR, SEGMENT_GLOB
from conveyor.errors import RequestError
from conveyor.message import Message
from conveyor.server import store_kinds
from conveyor.server.store_kinds import StoreKind, StoreOpening
from conveyor.storage import DurableStore, MemoryStore, Store

from ..support.servers import thread_server

SERVER_DIR = Path(store_kinds.__file__).parent


def _small_segments(o: StoreOpening) -> Store:
    assert o.path is not None and o.fsync is not None
    return DurableStore(o.path, segment_bytes=4096, fsync=o.fsync, queue=o.queue, max_attempts=o.max_attempts, lease_s=o.lease_s)


def _scratch(o: StoreOpening) -> Store:
    return MemoryStore(o.queue, max_attempts=o.max_attempts, lease_s=o.lease_s)


@pytest.fixture
def kinds() -> Iterator[None]:
    """Two kinds of store registered for the test, beside the built-in ones: one on disk, one in memory."""
    added = [StoreKind("small-segments", _small_segments, on_disk=True), StoreKind("scratch", _scratch, on_disk=False)]
    for k in added:
        store_kinds.register(k)
    yield
    for k in added:
        store_kinds.unregister(k.name)


def test_a_registered_kind_is_declared_by_name_and_reopened_on_restart(tmp_path: Path, kinds: None) -> None:
    d = tmp_path / "data"
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        info = c.declare("a", kind="small-segments", lease_s=9)
        assert (info.kind, info.lease_s, info.fsync) == ("small-segments", 9.0, "batch")
        assert c.declare("b", kind="scratch").fsync is None  # not kept on disk: no fsync policy
        assert c.put("a", [Message(payload=b"x" * 100) for _ in range(200)])
        assert c.put("b", [Message(payload=b"y")])
        assert {q.name: q.kind for q in c.queues()} == {"a": "small-segments", "b": "scratch"}
        with pytest.raises(RequestError, match=r"exists with kind='small-segments' \(asked 'durable'\)") as e:
            c.declare("a", kind="durable")
        assert e.value.kind == "queue-conflict"
    assert len(list((d / QUEUES_DIR / "a").glob(SEGMENT_GLOB))) > 3  # its kind's factory made it: 4 KiB segments
    assert json.loads((d / QUEUES_DIR / "a" / QUEUE_CONFIG_NAME).read_text())["kind"] == "small-segments"
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        assert [(q.name, q.kind, q.lease_s) for q in c.queues()] == [("a", "small-segments", 9.0)]
        assert len(c.get("a", 500)) == 200


def test_an_unknown_kind_is_refused_naming_the_known_ones_and_changes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "data"
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        c.put("kept", [Message(payload=b"x")])
        for name in ("new", "kept"):
            with pytest.raises(RequestError, match=r"unknown store kind 'sqlite': this server knows 'durable', 'transient'") as e:
                c.declare(name, kind="sqlite")
            assert e.value.kind == "bad-argument"
        assert [(q.name, q.kind) for q in c.queues()] == [("kept", "durable")]
        assert c.stats("kept")["kept"].ready == 1
    assert sorted(p.name for p in (d / QUEUES_DIR).iterdir()) == ["kept"]


def test_the_kind_is_named_and_the_default_is_the_servers(tmp_path: Path) -> None:
    with thread_server(data_dir=tmp_path / "data") as s, QueueClient(s.address) as c:
        assert c.declare("d", kind="durable").kind == "durable"
        assert c.declare("t", kind="transient").kind == "transient"
        assert c.declare("x").kind == "durable"
        assert {q.name for q in c.queues()} == {"d", "t", "x"}
    with thread_server() as s, QueueClient(s.address) as c:  # no data dir: nothing on disk
        assert c.declare("q").kind == "transient"
        with pytest.raises(RequestError, match="a durable queue is kept on disk, and this server has no --data-dir"):
            c.declare("d", kind="durable")


def test_a_declare_without_a_kind_asks_for_the_servers_default(tmp_path: Path) -> None:
    """A queue of another kind than the server's default conflicts with a declare that names none."""
    with thread_server(data_dir=tmp_path / "data") as s, QueueClient(s.address) as c:
        c.declare("t", kind="transient")
        with pytest.raises(RequestError, match=r"exists with kind='transient' \(asked 'durable'\)") as e:
            c.declare("t")
        assert e.value.kind == "queue-conflict"
        assert c.declare("d").kind == c.declare("d", kind="durable").kind == "durable"


def test_in_process_queues_refuse_other_kinds_and_make_nothing() -> None:
    with InProcessQueues() as b:
        for asked in ({"kind": "durable"}, {"kind": "bogus"}):
            with pytest.raises(RequestError, match="in-process queues are transient") as e:
                b.declare("q", **asked)
            assert e.value.kind == "bad-argument"
        assert b.stats() == {}
        assert b.declare("q", kind="transient").kind == "transient"


def test_a_kind_is_registered_once_under_a_plain_name() -> None:
    with pytest.raises(ValueError, match="registered already"):
        store_kinds.register(StoreKind("durable", _scratch, on_disk=False))
    with pytest.raises(ValueError, match="bad store kind name"):
        store_kinds.register(StoreKind("Not a name", _scratch, on_disk=False))
    assert sorted(store_kinds.known()) == ["durable", "transient"]


def test_the_server_holds_stores_through_the_interface_only() -> None:
    """Only the kinds' factories name a store class: the rest of the server knows `Store`."""
    naming = {p.name for p in SERVER_DIR.glob("*.py") if re.search(r"\b(DurableStore|MemoryStore)\b", p.read_text())}
    assert naming == {"store_kinds.py"}
