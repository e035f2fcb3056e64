"""A queue server over real TCP on 127.0.0.1: operations, long polls, limits and bad requests.

Each connection (`conveyor.server.connection`), its requests to their handlers
(`conveyor.server.dispatch`), and the wakeups that end long polls (`conveyor.server.wakeups`), and
the group commit that answers durable writes once on disk (`conveyor.server.group_commit`).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import pytest

from conveyor.client.queue_client import QueueClient
from conveyor.constants import ID_FLOOR_NAME, MAX_HOST_CHARS, QUEUE_CONFIG_NAME, QUEUES_DIR, SEGMENT_GLOB
from conveyor.errors import ConnectionLostError, ProtocolError, RequestError
from conveyor.message import Message, Status
from conveyor.protocol import requests as calls
from conveyor.protocol.framing import Limits
from conveyor.protocol.requests import Call, QueueInfo
from conveyor.storage import DurableStore

from ..support.servers import RawConnection, ThreadServer, frame, thread_server, wait_for


@pytest.fixture
def server(tmp_path: Path) -> ThreadServer:
    s = ThreadServer(data_dir=tmp_path / "data", sweep_interval_s=0.05)
    yield s  # type: ignore[misc]
    s.stop()


@pytest.fixture
def client(server: ThreadServer) -> QueueClient:
    c = QueueClient(server.address, timeout=10)
    yield c  # type: ignore[misc]
    c.close()


def msgs(n: int, **kw: object) -> list[Message]:
    return [Message(payload=b"m%d" % i, **kw) for i in range(n)]  # type: ignore[arg-type]


def test_put_get_ack_nack_round_trip(client: QueueClient) -> None:
    ids = client.put("q", [Message(payload=b"a", priority=1, headers={"k": "v"}, max_attempts=2), *msgs(3)])
    assert ids == [1, 2, 3, 4]
    got = client.get("q", 2, lease_s=5)
    assert [m.id for m in got] == [1, 2] and got[0].headers == {"k": "v"} and got[0].priority == 1
    assert got[0].queue == "q" and got[0].attempts == 1 and got[0].lease_s == 5 and got[0].max_attempts == 2
    assert client.ack("q", [1, 1], [b"r1", b"dup"]) == [True, False]
    assert client.nack("q", [2], ["boom"], delay_s=0) == [True]
    assert [m.id for m in client.get("q", 10)] == [3, 4, 2]
    assert client.results("q") == [(1, b"r1")]
    s = client.stats("q")["q"]
    assert (s.ready, s.delivered, s.acked, s.failed) == (0, 3, 1, 0)


def test_results_and_dead_letters_page(client: QueueClient) -> None:
    ids = client.put("q", msgs(25, max_attempts=1))
    got = client.get("q", 25)
    client.ack("q", ids[:20], [b"r%d" % i if i % 2 else None for i in range(20)])
    client.nack("q", ids[20:], [f"e{i}" for i in range(5)])
    assert [i for i, _ in client.iter_results("q", page=3)] == ids[1:20:2]
    assert dict(client.results("q", after=ids[1], limit=2)) == {ids[3]: b"r3", ids[5]: b"r5"}
    dls = client.dead_letters("q", limit=3)
    want = [(ids[20 + k], f"e{k}", got[20 + k].payload) for k in range(3)]
    assert [(d.message.id, d.error, d.message.payload) for d in dls] == want
    assert [d.message.id for d in client.dead_letters("q", after=ids[22])] == ids[23:]
    assert client.forget("q", ids) == 15
    assert client.results("q") == [] and client.dead_letters("q") == []


def test_extend_lease_purge_and_sweeper(client: QueueClient) -> None:
    a, _, _ = client.put("q", msgs(3))
    client.get("q", 2, lease_s=0.2)
    assert client.extend_lease("q", [a, 999], 60) == [True, False]
    # the server's sweeper returns b without anyone calling get
    wait_for(lambda: client.stats("q")["q"].ready == 2, what="expired lease swept back")
    assert client.purge("q") == 2
    assert client.stats("q")["q"].delivered == 1
    assert client.get("q", 10) == []


def test_cancel_takes_ready_and_delayed_messages_off_the_queue_durably(tmp_path: Path) -> None:
    """Cancelled: a dead letter with the error saying so, kept across a restart; the others said per id."""
    from conveyor.constants import CANCELLED_ERROR
    from conveyor.protocol.requests import CancelOutcome as C

    d = tmp_path / "data"
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        done, running, ready = c.put("q", msgs(3))
        [late] = c.put("q", [Message(payload=b"later", not_before=time.time() + 60)])
        c.ack("q", [c.get("q", 1)[0].id])
        [m] = c.get("q", 1)
        waiting = threading.Thread(target=lambda: got.append(c.call(calls.stats(queues=["q"], drained_wait_s=30))))
        got: list[dict[str, object]] = []
        with QueueClient(s.address) as other:
            waiting.start()
            outcome = other.cancel("q", [ready, running, done, late, 999, ready])
            assert outcome == [C.CANCELLED, C.RUNNING, C.FINISHED, C.CANCELLED, C.UNKNOWN, C.FAILED]
            other.ack("q", [m.id])
        waiting.join(30)
        assert got and got[0]["q"].failed == 2  # type: ignore[attr-defined]
        with pytest.raises(RequestError, match="no queue named 'nope'"):
            c.cancel("nope", [1])
        for call, match in [
            (Call("cancel", {"queue": "q", "ids": [-1]}), "'ids' must be a list of non-negative"),
            (Call("cancel", {"queue": "q"}), "missing argument 'ids'"),
        ]:
            with pytest.raises(RequestError, match=match):
                c.call(call)
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        assert [(x.message.id, x.error) for x in c.dead_letters("q")] == [(ready, CANCELLED_ERROR), (late, CANCELLED_ERROR)]
        assert c.status("q", [ready, late, running]) == [Status.FAILED, Status.FAILED, Status.ACKED]
        assert c.get("q", 10) == []


def test_long_poll_wakes_on_put_and_times_out(server: ThreadServer, client: QueueClient) -> None:
    t0 = time.monotonic()
    assert client.get("q", 1, wait_s=0.3) == []
    assert time.monotonic() - t0 >= 0.29
    other = QueueClient(server.address)
    threading.Timer(0.2, lambda: other.put("q", msgs(1))).start()
    t0 = time.monotonic()
    [m] = client.get("q", 1, wait_s=20)
    assert m.payload == b"m0" and time.monotonic() - t0 < 5
    other.close()


def test_long_poll_wakes_when_a_delayed_message_comes_due(client: QueueClient) -> None:
    client.put("q", [Message(payload=b"later", not_before=time.time() + 0.4)])
    t0 = time.monotonic()
    [m] = client.get("q", 1, wait_s=20)
    assert m.payload == b"later" and 0.3 <= time.monotonic() - t0 < 5


def test_many_requests_in_flight_on_one_connection_reply_out_of_order(server: ThreadServer) -> None:
    conn = RawConnection(server.address)
    try:
        long_poll = calls.get("empty", 1, wait_s=0.5)
        conn.send(frame({**long_poll.args, "op": long_poll.op, "id": 1}))
        for k in range(50):  # sent after the long poll, on the same connection, answered before it
            put = calls.put("q", msgs(10))
            conn.send(frame({**put.args, "op": put.op, "id": 2 + k}, list(put.frames)))
        order = [conn.read()["id"] for _ in range(51)]
    finally:
        conn.close()
    assert order[-1] == 1 and sorted(order[:-1]) == list(range(2, 52))
    with QueueClient(server.address) as c:
        assert c.stats("q")["q"].ready == 500


def test_concurrent_puts_share_fsyncs(server: ThreadServer, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs = []
    real = DurableStore.sync
    monkeypatch.setattr(DurableStore, "sync", lambda self: (syncs.append(1), real(self))[1])
    clients = [QueueClient(server.address) for _ in range(8)]
    try:
        with ThreadPoolExecutor(8) as ex:  # 8 connections, 10 puts each, all at once
            list(ex.map(lambda c: c.pipeline([calls.put("q", msgs(50)) for _ in range(10)]), clients))
    finally:
        for c in clients:
            c.close()
    assert server.call(lambda: server.server.queues.get("q").store.stats().ready) == 8 * 10 * 50
    assert 0 < len(syncs) < 80  # group commit: fewer fsyncs than puts


def test_unknown_operation_and_bad_arguments_keep_the_connection(client: QueueClient) -> None:
    with pytest.raises(RequestError, match="unknown operation 'frobnicate'") as e:
        client.call(Call("frobnicate", {}))
    assert e.value.kind == "unknown-operation"
    bad = [
        (Call("put", {"queue": 5, "n": 0}), "'queue' must be a string"),
        (Call("put", {"queue": "q", "n": 2}, [b"x"]), "'n' is 2 but 1 payload frames came"),
        (Call("put", {"queue": "q", "n": 1, "prio": "high"}, [b"x"]), "priority must be an integer"),
        (Call("put", {"queue": "q", "n": 2, "prio": [1]}, [b"x", b"y"]), "'prio' has 1 values for 2 messages"),
        (Call("put", {"queue": "q", "n": 1, "hdr": [{"k": 1}]}, [b"x"]), "headers must be a dict of str to str"),
        (Call("get", {"queue": "q", "n": -1}), "'n' must be an integer"),
        (Call("get", {"queue": "q", "n": 1, "lease_s": 0}), "'lease_s' must be a number"),
        (Call("get", {"queue": "q", "wait_s": "soon"}), "'wait_s' must be a number"),
        (Call("ack", {"queue": "q", "ids": ["1"]}), "'ids' must be a list"),
        (Call("ack", {"queue": "q"}), "missing argument 'ids'"),
        (Call("ack", {"queue": "q", "ids": [1]}, [b"a", b"b"]), "1 ids but 2 result frames"),
        (Call("nack", {"queue": "q", "ids": [1], "errors": [1]}), "'errors' must be a list of 1 strings"),
        (Call("nack", {"queue": "q", "ids": [1], "delay_s": -1}), "'delay_s' must be a number"),
        (Call("put", {"queue": "../etc", "n": 0}), "bad queue name"),
        (Call("get_blob", {"key": "nothex"}), "64 hex digits"),
        (Call("results", {"queue": "q", "limit": 0}), "'limit' must be an integer"),
        (Call("stats", {"queues": "q"}), "'queues' must be a list of strings"),
        (Call("stats", {"queues": ["q"], "drained_wait_s": -1}), "'drained_wait_s' must be a number"),
        # an endless lease or delay would never give the message back; a priority is an integer, not
        # something msgpack can turn into one (an ExtType iterates as (code, data)); 2.7 attempts are none
        (Call("get", {"queue": "q", "n": 1, "lease_s": float("inf")}), "'lease_s' must be a number in"),
        (Call("declare", {"queue": "q2", "lease_s": float("inf")}), "'lease_s' must be a number in"),
        (Call("extend_lease", {"queue": "q", "ids": [1], "lease_s": 1e300}), "'lease_s' must be a number in"),
        (Call("nack", {"queue": "q", "ids": [1], "delay_s": float("inf")}), "'delay_s' must be a number"),
        (Call("nack", {"queue": "q", "ids": [1, 2], "delay_s": [1, float("inf")]}), "'delay_s' must hold numbers in"),
        (Call("put", {"queue": "q", "n": 1, "prio": msgpack.ExtType(1, b"x")}, [b"x"]), "priority must be an integer"),
        (Call("put", {"queue": "q", "n": 1, "ma": 2.7}, [b"x"]), "max_attempts must be an integer"),
        (Call("put", {"queue": "q", "n": 1, "nb": float("inf")}, [b"x"]), "not_before must be a finite time"),
        (Call("put", {"queue": "q", "n": 1, "prio": True}, [b"x"]), "priority must be an integer"),
        (Call("get", {"queue": "q", "n": 1, "lim": [1, 2]}), "'lim': limits must be a list of 4 integers"),
    ]
    client.put("q", msgs(1))
    for call, match in bad:
        with pytest.raises(RequestError, match=match):
            client.call(call)
    assert client.ping()["pong"] is True
    assert client.stats("q")["q"].ready == 1  # nothing stored by the bad requests


def test_a_report_carries_numbers_and_the_host_as_a_string(client: QueueClient) -> None:
    client.call(calls.report("w", {"processed": 2, "pid": 42, "host": "box-1.example"}))
    w = client.workers()["w"]
    assert w["host"] == "box-1.example" and w["processed"] == 2 and w["pid"] == 42 and 0 <= w["seen"] < 5
    for counts in ({"pid": "42"}, {"host": 7}, {"host": "h" * (MAX_HOST_CHARS + 1)}, {"host": ["box"]}):
        with pytest.raises(RequestError, match="'counts' must be a map of names to numbers") as e:
            client.call(calls.report("bad", counts))  # type: ignore[arg-type]
        assert e.value.kind == "bad-argument"
    assert "bad" not in client.workers()


def test_protocol_violation_closes_only_that_connection(server: ThreadServer, client: QueueClient) -> None:
    client.put("q", msgs(3))
    raw = RawConnection(server.address)
    raw.send(frame({"op": "put", "id": 7, "queue": "q", "n": 1}, [b"x" * 1000]))
    assert raw.read() == {"id": 7, "first": 4, "n": 1}
    raw.send(b"\x00\x00\x00\x40\x00\x00\x00\x00" + b"\x00" * 8)  # announces a header of 1 GiB
    reply = raw.read()
    assert reply["error"] == "protocol" and "exceeds the limit" in reply["message"]
    assert raw.closed_by_server()
    assert client.stats("q")["q"].ready == 4 and client.ping()["pong"]
    raw.close()


def test_frame_limit_is_configurable_and_reported(tmp_path: Path) -> None:
    with thread_server(limits=Limits(max_frame_bytes=1000)) as s, QueueClient(s.address) as c:
        # the server says its limits in its hello: a client refuses what the server would, before sending
        with pytest.raises(ValueError, match="message 0 does not fit in a request: 1,001 bytes, over the server's limit"):
            c.put("q", [Message(payload=b"x" * 1001)])
        assert c.server_limits.max_frame_bytes == 1000
        with pytest.raises(ProtocolError, match="payload frame of 1,001 bytes exceeds the limit of 1,000"):
            c.call(calls.put("q", [Message(payload=b"x" * 1001)]))  # sent anyway: the server refuses it
        assert c.put("q", [Message(payload=b"x" * 1000)]) == [1]  # reconnected by itself


def test_declare_settings_conflicts_and_restart(tmp_path: Path) -> None:
    d = tmp_path / "data"
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        info = c.declare("jobs", lease_s=7, max_attempts=2, fsync="interval")
        assert info == QueueInfo("jobs", "durable", 7.0, 2, "interval")
        assert c.declare("jobs") == info and c.declare("jobs", lease_s=7) == info
        with pytest.raises(RequestError, match=r"exists with lease_s=7\.0") as e:
            c.declare("jobs", lease_s=8)
        assert e.value.kind == "queue-conflict"
        assert c.declare("mem", kind="transient").fsync is None
        with pytest.raises(RequestError, match="fsync must be one of"):
            c.declare("x", fsync="sometimes")
        c.put("jobs", msgs(2))
        [m] = c.get("jobs", 1)
        assert m.lease_s == 7.0
        c.put("mem", msgs(2))
    assert json.loads((d / QUEUES_DIR / "jobs" / QUEUE_CONFIG_NAME).read_text())["lease_s"] == 7.0
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        assert {q.name for q in c.queues()} == {"jobs"}  # transient queues are gone, durable ones back
        assert c.stats("jobs")["jobs"].ready + c.stats("jobs")["jobs"].delivered == 2


def test_transient_only_server_refuses_durable_queues() -> None:
    with thread_server() as s, QueueClient(s.address) as c:
        assert c.declare("q").kind == "transient"
        with pytest.raises(RequestError, match="no --data-dir"):
            c.declare("d", kind="durable")


def test_a_damaged_queue_is_unavailable_and_the_rest_keeps_serving(tmp_path: Path) -> None:
    d = tmp_path / "data"
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        c.put("bad", msgs(50))
        c.put("good", msgs(5))
        c.declare("conf", lease_s=7.0)
        c.put("conf", msgs(3))
    (d / QUEUES_DIR / "conf" / QUEUE_CONFIG_NAME).write_text('{"name": "conf", "dura')  # a damaged settings file
    seg = sorted((d / QUEUES_DIR / "bad").glob(SEGMENT_GLOB))[0]
    raw = bytearray(seg.read_bytes())
    raw[100] ^= 0xFF  # inside an early record, followed by intact ones: not a torn tail
    seg.write_bytes(bytes(raw))
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        with pytest.raises(RequestError, match=r"could not be opened.*corrupt.*--repair") as e:
            c.get("bad", 1)
        assert e.value.kind == "unavailable"
        with pytest.raises(RequestError, match=r"queue.json is damaged.*--repair"):
            c.get("conf", 1)
        assert len(c.get("good", 10)) == 5
    with thread_server(data_dir=d, repair=True) as s, QueueClient(s.address) as c:
        assert 40 <= len(c.get("bad", 100)) < 50
        assert len(c.get("conf", 10)) == 3  # its messages, under the server's default settings
        assert [q.lease_s for q in c.queues() if q.name == "conf"] == [30.0]
    assert len(list((d / QUEUES_DIR / "conf").glob(QUEUE_CONFIG_NAME + ".damaged-*"))) == 1


def test_a_queue_json_from_before_store_kinds_is_no_damage_and_says_what_to_change(tmp_path: Path) -> None:
    """A `queue.json` saying `"durable": true` where it now says its kind: written by an older build.

    The queue is unavailable with a message saying so and what to put in its place; --repair does
    not reset its settings to the defaults (it is not damaged); changed as told, it opens as it was.
    """
    d = tmp_path / "data"
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        c.declare("old", lease_s=11.0, max_attempts=4)
        c.put("old", msgs(3))
    conf = d / QUEUES_DIR / "old" / QUEUE_CONFIG_NAME
    settings = json.loads(conf.read_text())
    older = json.dumps({"durable": True, **{k: v for k, v in settings.items() if k != "kind"}})
    conf.write_text(older)
    for repair in (False, True):
        with thread_server(data_dir=d, repair=repair) as s, QueueClient(s.address) as c:
            with pytest.raises(RequestError) as e:
                c.get("old", 1)
            assert e.value.kind == "unavailable"
            said = str(e.value)
            assert "written by an older build" in said and '"durable": true' in said and '"kind": "durable"' in said, said
            assert "damaged" not in said and "restart the server with --repair" not in said, said
            assert [q.name for q in c.queues()] == []
        assert conf.read_text() == older  # left as it was, settings and all: nothing set aside, nothing reset
        assert list(conf.parent.glob(QUEUE_CONFIG_NAME + ".*")) == []
    conf.write_text(older.replace('"durable": true', '"kind": "durable"'))  # as the message says
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        assert [(q.name, q.kind, q.lease_s, q.max_attempts) for q in c.queues()] == [("old", "durable", 11.0, 4)]
        assert len(c.get("old", 10)) == 3


def test_blobs_are_content_addressed(server: ThreadServer, client: QueueClient) -> None:
    key = client.put_blob(b"pickled function")
    assert len(key) == 64 and client.get_blob(key) == b"pickled function"
    assert client.get_blob("0" * 64) is None
    assert client.forget_blobs([key, "0" * 64]) == 1 and client.get_blob(key) is None
    assert client.forget_blobs([key]) == 0
    with pytest.raises(RequestError, match="64 hex digits") as e:
        client.forget_blobs(["../../etc/passwd"])
    assert e.value.kind == "bad-argument"


def test_client_reconnects_after_a_server_restart(tmp_path: Path) -> None:
    d = tmp_path / "data"
    s = ThreadServer(data_dir=d)
    port = s.server.port
    c = QueueClient(s.address, connect_timeout=10)
    c.put("q", msgs(2))
    s.stop()
    with pytest.raises(ConnectionLostError):
        c.ping()
    s2 = ThreadServer(data_dir=d, port=port)
    try:
        assert c.stats("q")["q"].ready == 2
    finally:
        c.close()
        s2.stop()


def test_connect_gives_up_after_connect_timeout() -> None:
    c = QueueClient("tcp://127.0.0.1:1", connect_timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(ConnectionLostError, match=r"cannot connect to tcp://127\.0\.0\.1:1"):
        c.ping()
    assert time.monotonic() - t0 < 5


def test_bad_addresses() -> None:
    for bad in ("http://x:1", "tcp://host:notaport", "tcp://:80", "tcp://h:70000"):
        with pytest.raises(ValueError, match="address"):
            QueueClient(bad)
    assert QueueClient("[::1]:7070").host == "::1"


def test_stop_returns_long_polls_and_closes_stores(tmp_path: Path) -> None:
    s = ThreadServer(data_dir=tmp_path / "data")
    c = QueueClient(s.address, timeout=10)
    c.put("q", msgs(1))
    c.get("q", 1)
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(c.get("q", 1, wait_s=30)))
    t.start()
    wait_for(lambda: s.call(lambda: any(conn.tasks for conn in s.server._conns)), what="long poll in flight")
    t0 = time.monotonic()
    s.stop()
    t.join(10)
    assert result == [[]] and time.monotonic() - t0 < 5
    c.close()
    with DurableStore(tmp_path / "data" / QUEUES_DIR / "q") as store:  # closed cleanly: it opens at once
        assert store.stats().delivered == 1


def test_a_connection_accepted_as_the_server_stops_is_closed() -> None:
    """A connection accepted but not yet served when the server stops is closed too.

    One the listener accepted but whose serving had not begun when stop() took the connections it
    closes: it is closed too, not left open with the loop gone (its client would wait out its
    timeout).
    """
    for token in (None, "s3cret"):
        s = ThreadServer(token=token)
        host, port = s.address.removeprefix("tcp://").rsplit(":", 1)
        held = threading.Event()
        s.loop.call_soon_threadsafe(held.wait, 30)  # the loop held: the connection below waits to be accepted
        sock = socket.create_connection((host, int(port)), timeout=30)
        stopping = asyncio.run_coroutine_threadsafe(s.server.stop(), s.loop)  # queued before that accept
        held.set()
        try:
            stopping.result(30)
            s.thread.join(30)
            sock.settimeout(10)  # closed at once; 10 s: a busy machine
            try:
                while sock.recv(65536):  # a hello at most, then the end
                    pass
            except ConnectionResetError:
                pass  # closed too: a connection still in the listener's backlog as it closes is reset, not ended
        finally:
            sock.close()
            s.loop.close()


def test_idempotency_keys_store_a_message_once(tmp_path: Path) -> None:
    from conveyor.constants import H_IDEMPOTENCY_KEY as KEY

    d = tmp_path / "data"
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        a = c.put("q", [Message(payload=b"a", headers={KEY: "order-1"}), Message(payload=b"plain")])
        b = c.put(
            "q",
            [
                Message(payload=b"a again", headers={KEY: "order-1"}),
                Message(payload=b"b", headers={KEY: "order-2"}),
                Message(payload=b"b twice in one batch", headers={KEY: "order-2"}),
            ],
        )
        assert b[0] == a[0] and b[1] == b[2] and b[1] not in a
        assert c.stats("q")["q"].ready == 3
        assert c.stored("q", ["order-2", "order-1", "unseen"]) == [b[1], a[0], 0]  # did a put land
        assert c.stored("no-such-queue", ["order-1"]) == [0]
        with pytest.raises(RequestError, match="idempotency key must be a non-empty string"):
            c.stored("q", ["order-1", ""])
        with pytest.raises(RequestError, match="idempotency key must be a non-empty string"):
            c.put("q", [Message(payload=b"x", headers={KEY: ""})])
        with pytest.raises(RequestError, match="priority"):  # a put that fails stores nothing under its keys
            c.put("q", [Message(payload=b"x", headers={KEY: "order-3"}, priority=2**40)])
        # ... nor names the id the next put gets: its retry is stored, not answered with another message's id
        [between] = c.put("between", [Message(payload=b"another client's")])
        with pytest.raises(RequestError, match="priority"):
            c.put("between", [Message(payload=b"keyed", headers={KEY: "k"}, priority=2**40)])
        [other] = c.put("between", [Message(payload=b"another client's, later")])
        [keyed] = c.put("between", [Message(payload=b"keyed", headers={KEY: "k"})])
        assert len({between, other, keyed}) == 3
        assert [m.payload for m in c.get("between", 10)] == [b"another client's", b"another client's, later", b"keyed"]
        [p] = c.put("p", [Message(payload=b"to purge", headers={KEY: "order-4"})])
        c.purge("p")
        assert c.stored("p", ["order-4"]) == [0]
        [p2] = c.put("p", [Message(payload=b"put again", headers={KEY: "order-4"})])  # a purged message is gone
        assert p2 != p
    # a crash between writing a put's keys and its messages leaves a key naming an id with no message
    from conveyor.server.idempotency import Dedupe

    keys = Dedupe(d / QUEUES_DIR / "q")
    keys.add([("order-5", 999)])
    keys.close()
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:  # remembered across a restart
        assert c.stored("q", ["order-1", "order-5"]) == [a[0], 0]  # order-5 names no message
        assert c.put("q", [Message(payload=b"late retry", headers={KEY: "order-1"})]) == [a[0]]
        [x] = c.put("q", [Message(payload=b"x", headers={KEY: "order-3"})])
        [y] = c.put("q", [Message(payload=b"y", headers={KEY: "order-5"})])
        assert y != 999 and c.put("q", [Message(payload=b"y again", headers={KEY: "order-5"})]) == [y]
        assert c.put("q", [Message(payload=b"x again", headers={KEY: "order-3"})]) == [x]
        assert [m.payload for m in c.get("q", 10)] == [b"a", b"plain", b"b", b"x", b"y"]


def test_stats_waits_for_the_queues_to_drain(client: QueueClient) -> None:
    from conveyor.protocol import requests as calls

    client.put("q", msgs(2, max_attempts=1))
    client.put("other", msgs(1))  # not asked about: it may stay pending
    [a, b] = client.get("q", 2, lease_s=5.0)  # b is acked from another thread: its lease must outlast that
    client.ack("q", [a.id])
    t0 = time.monotonic()
    st = client.call(calls.stats(queues=["q", "not-here"], drained_wait_s=0.1))
    assert 0.09 <= time.monotonic() - t0 < 5 and set(st) == {"q"} and st["q"].pending == 1  # timed out

    def ack_later() -> None:
        time.sleep(0.2)
        with QueueClient(client.address, timeout=10) as c:
            c.ack("q", [b.id])

    threading.Thread(target=ack_later).start()
    t0 = time.monotonic()
    st = client.call(calls.stats(queues=["q"], drained_wait_s=30))
    assert time.monotonic() - t0 < 5 and st["q"].pending == 0 and st["q"].acked == 2  # answered at the ack

    # a message whose last lease runs out ends without a settle: the sweeper's expiry answers
    client.put("q", msgs(1, max_attempts=1))
    client.get("q", 1, lease_s=0.2)
    t0 = time.monotonic()
    st = client.call(calls.stats(queues=["q"], drained_wait_s=30))
    assert time.monotonic() - t0 < 5 and st["q"].pending == 0 and st["q"].failed == 1


def test_drop_removes_a_queue_and_never_reuses_its_ids(tmp_path: Path) -> None:
    d = tmp_path / "data"
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        ids = c.put("q", msgs(5))
        got = c.get("q", 3)
        c.ack("q", [got[0].id], [b"r"])
        c.put("other", msgs(1))
        c.declare("mem", kind="transient")
        assert c.drop("q") is True and c.drop("q") is False and c.drop("mem") is True
        assert not (d / QUEUES_DIR / "q").exists()
        assert {q.name for q in c.queues()} == {"other"}
        assert c.stats("other")["other"].ready == 1  # the others keep what they hold
        new = c.put("q", msgs(2))
        assert min(new) > max(ids)  # a queue made again continues past the old one's ids
        assert c.ack("q", [got[1].id], [b"late"]) == [False]  # an ack meant for the dropped queue finds nothing
        assert c.stats("q")["q"].ready == 2 and c.results("q") == []
        floor = (d / ID_FLOOR_NAME).read_bytes()
        c.put("r", msgs(3))
        assert c.drop("r") is True and (d / ID_FLOOR_NAME).read_bytes() == floor  # kept ahead: no write per drop
        c.declare("loose", fsync="never")  # its drop is left to the OS as its writes are: gone all the same
        c.put("loose", msgs(2))
        assert c.drop("loose") is True and not (d / QUEUES_DIR / "loose").exists()
        with pytest.raises(RequestError, match="bad queue name") as e:
            c.drop("../x")
        assert e.value.kind == "bad-argument"
    (d / QUEUES_DIR / ".dropping-gone").mkdir()  # as a crash in the middle of a drop leaves it
    (d / QUEUES_DIR / ".dropping-gone" / QUEUE_CONFIG_NAME).write_text("{}")
    with thread_server(data_dir=d) as s, QueueClient(s.address) as c:
        assert not (d / QUEUES_DIR / ".dropping-gone").exists()
        assert {q.name for q in c.queues()} == {"other", "q"}
        assert c.drop("q") is True
        assert min(c.put("fresh", msgs(1))) > max(new)  # the floor outlives restarts


def test_drop_ends_requests_waiting_on_the_queue(server: ThreadServer) -> None:
    with QueueClient(server.address) as c:
        c.put("q", msgs(1))
        c.get("q", 1, lease_s=60)  # pending: a join on it waits
        t0 = time.monotonic()
        # one connection: the server starts them in this order, so both wait when the drop comes
        poll, join, dropped = c.pipeline(
            [calls.get("q", 1, wait_s=30), calls.stats(queues=["q"], drained_wait_s=30), calls.drop("q")]
        )
        assert time.monotonic() - t0 < 5
        assert (poll, join, dropped) == ([], {}, True)
        assert c.queues() == []  # the get that waited did not make it again


def test_wake_answers_the_consumers_gets_waiting_on_its_queues_at_once(server: ThreadServer) -> None:
    from conveyor.server.handlers import WAKE_HOLD_S

    def waited(c: QueueClient, queue: str, tie: bool = True) -> bool:
        t0 = time.monotonic()
        got = c.call(calls.get(queue, 1, wait_s=0.3, tie=tie))
        assert got == [] and not got.woken
        return time.monotonic() - t0 >= 0.3

    with QueueClient(server.address) as c, QueueClient(server.address) as other:
        c.declare("q")
        t0 = time.monotonic()
        # one connection: the server starts them in this order, so the gets wait when the wake comes;
        # a consumer's get (it ties its leases) is answered, a plain one waits its wait_s out
        poll, plain, woke = c.pipeline(
            [calls.get("q", 1, wait_s=30, tie=True), calls.get("q", 1, wait_s=1.0), calls.wake(["q", "not-here"])]
        )
        assert time.monotonic() - t0 >= 1.0
        assert (poll, poll.woken, plain, plain.woken, woke) == ([], True, [], False, 1)  # 1: one of the two queues here
        assert waited(c, "q")  # answered woken once: its next get waits as usual
        # a connection between two requests when the wake came: its next get does not wait, once
        held = other.pipeline([calls.wake(["q"]), calls.get("q", 1, wait_s=30, tie=True)])[1]
        assert held == [] and held.woken
        assert waited(other, "q") and waited(other, "r")  # then as usual; another queue was never woken
        t0 = time.monotonic()
        plain = c.pipeline([calls.wake(["q"]), calls.get("q", 1, wait_s=0.3)])[1]  # a plain get in the hold waits
        assert (plain, plain.woken) == ([], False) and time.monotonic() - t0 >= 0.3
        woken_at = time.monotonic()
        wait_for(lambda: time.monotonic() - woken_at > WAKE_HOLD_S, what="the hold's end")
        with QueueClient(server.address) as late:
            assert waited(late, "q")  # after the hold, a new connection's get waits too
        c.put("q", msgs(1))
        [m] = c.call(calls.get("q", 1, wait_s=30, tie=True))  # work there: a wake changes nothing for it
        assert m.payload == b"m0"


def test_a_wake_ends_a_pools_long_poll_across_its_shards(tmp_path: Path) -> None:
    import pickle

    from conveyor.client.sharded import ShardedQueues

    with thread_server(data_dir=tmp_path / "a") as a, thread_server(data_dir=tmp_path / "b") as b:
        pool = ShardedQueues([QueueClient(a.address), QueueClient(b.address)])
        waker = pickle.loads(pickle.dumps(pool))  # connections of its own: the pool's are busy waiting
        done = threading.Event()

        def wake_until_answered() -> bool:  # a wake before the get waits may miss it: wake again until it answers
            return done.is_set() or (waker.on_every_server(calls.wake(["q"])) == [1, 1] and done.wait(0.1))

        try:
            pool.get("q", 1)  # the queue on both shards
            t = threading.Thread(target=lambda: wait_for(wake_until_answered, timeout=10, what="the get answered"))
            t0 = time.monotonic()
            t.start()
            assert pool.get("q", 1, wait_s=30, tie=True) == []
            assert time.monotonic() - t0 < 5  # not the next shard's turn, nor the rest of the 30 s
            done.set()
            t.join(10)
        finally:
            pool.close()
            waker.close()


def test_a_stopped_server_leaves_no_task_of_its_connections_pending(tmp_path: Path) -> None:
    """After `stop()` the loop has no task left: the connections' readers ran their clean-up.

    Else a loop closed after the stop (an embedding application's, or `asyncio.run`'s) destroys them
    pending, with "Task was destroyed but it is pending!" and never-awaited reads.
    """
    s = ThreadServer(data_dir=str(tmp_path))
    idle = [RawConnection(s.address) for _ in range(3)]  # their readers wait on their sockets
    with QueueClient(s.address) as c:
        c.put("jobs", [Message(payload=b"x")])
        asyncio.run_coroutine_threadsafe(s.server.stop(), s.loop).result(30)
    s.thread.join(30)
    try:
        assert not s.thread.is_alive()
        assert not [t for t in asyncio.all_tasks(s.loop) if not t.done()]
    finally:
        s.loop.close()
        for r in idle:
            r.sock.close()
