"""A server's task records: what runs where since when, how each delivery ended, and one message's story.

The `tasks` and `task` operations (`conveyor.server.task_records`, answered as
`conveyor.protocol.task_pages`), against real servers, with real consumers running real tasks, and
raw clients where a test needs a delivery held or a connection dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool
from conveyor.client.queue_client import QueueClient
from conveyor.constants import ERR_BAD_ARGUMENT, ERR_NO_QUEUE, H_TASK, TASK_ERROR_SUMMARY_CHARS, TASK_PREVIEW_BYTES, TASK_RECENT
from conveyor.errors import RequestError
from conveyor.message import Message, Status
from conveyor.protocol.requests import Call
from conveyor.protocol.task_pages import TaskPage, TaskRecord, TaskState
from conveyor.server.task_records import CONNECTION_CLOSED, LEASE_RAN_OUT, error_summary, kept_error
from conveyor.tasks.envelope import encode_result
from conveyor.tasks.preview import show_call, show_result
from conveyor.worker import Consumer

from ..support import worker_tasks as wt
from ..support.servers import RawConnection, ThreadServer, frame, thread_server, wait_for

pytestmark = pytest.mark.timeout(90)

WAITS = "tests.support.worker_tasks.waits_for_file"
FAILS = "tests.support.worker_tasks.always_fails"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadServer]:
    with thread_server(data_dir=tmp_path / "data", sweep_interval_s=0.05) as s:
        yield s


@pytest.fixture
def client(server: ThreadServer) -> Iterator[QueueClient]:
    c = QueueClient(server.address, timeout=10)
    yield c
    c.close()


class Running:
    """A consumer named `name` on the `jobs` queue, in a thread, stopped on exit."""

    def __init__(self, pool: QueuePool, name: str, concurrency: int = 2) -> None:
        self.consumer = Consumer(
            pool.queues, ["jobs"], concurrency=concurrency, task_modules=["tests.support.worker_tasks"], name=name
        )
        self.thread = threading.Thread(target=self.consumer.run, name=f"consumer-{name}")

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


def one(records: list[TaskRecord], msg_id: int) -> TaskRecord:
    (r,) = [r for r in records if r.id == msg_id]
    return r


def test_a_running_task_shows_with_its_consumer_then_its_end_with_attempts_and_runtime(tmp_path: Path) -> None:
    release = tmp_path / "go"
    with thread_server(sweep_interval_s=0.05) as s, QueuePool.connect([s.address]) as pool:
        h = wt.waits_for_file.publish(str(release), 60.0, _pool=pool)
        before = time.time()
        with Running(pool, "c-slow"):
            page = wait_for(lambda: (p := pool.queues.tasks("jobs")).running and p, 20, "the task running")
            r = one(page.running, h.id)
            assert (r.queue, r.task, r.state, r.consumer, r.attempt) == ("jobs", WAITS, TaskState.RUNNING, "c-slow", 1)
            assert r.finished_at is None and before - 1 <= r.delivered_at <= time.time()
            assert page.running_total == 1 and page.recent == []
            # it goes on running: its time grows with the server's clock
            later = wait_for(
                lambda: (x := one(pool.queues.tasks("jobs").running, h.id)).runtime_s > r.runtime_s and x, 10, "time"
            )
            assert later.delivered_at == r.delivered_at
            release.touch()
            assert h.result(timeout=30) == "released"
            page = wait_for(lambda: (p := pool.queues.tasks("jobs")).recent and p, 10, "its record settled")
    assert page.running == [] and page.running_total == 0
    done = one(page.recent, h.id)
    assert (done.state, done.consumer, done.attempt, done.task, done.error) == (TaskState.ACKED, "c-slow", 1, WAITS, "")
    assert done.finished_at is not None and done.runtime_s == pytest.approx(done.finished_at - done.delivered_at)
    assert done.runtime_s >= later.runtime_s > 0


def test_a_failing_task_is_retried_then_failed_with_its_error_each_time(server: ThreadServer, tmp_path: Path) -> None:
    log = tmp_path / "log"
    with QueuePool.connect([server.address]) as pool:
        h = wt.always_fails.publish(str(log), _pool=pool)  # max_retries=2: three attempts, then a dead letter
        with Running(pool, "c-fail"):
            wait_for(lambda: pool.queues.status("jobs", [h.id]) == [Status.FAILED], 30, "the dead letter")
            page = wait_for(lambda: len((p := pool.queues.tasks("jobs")).recent) == 3 and p, 10, "three records")
        detail = pool.queues.task("jobs", h.id)
    states = [(r.attempt, r.state) for r in page.recent]
    assert states == [(3, TaskState.FAILED), (2, TaskState.RETRIED), (1, TaskState.RETRIED)]  # newest first
    for r in page.recent:
        assert r.error == "ValueError: this input is bad" and r.consumer == "c-fail" and r.task == FAILS  # a page: its first line
    # the message's own story: put, then each delivery and its end, with the error and its traceback
    assert detail.status is Status.FAILED and detail.task == FAILS
    assert [(e.what, e.attempt) for e in detail.history()] == [
        ("put", 0),
        ("delivered", 1),
        ("retried", 1),
        ("delivered", 2),
        ("retried", 2),
        ("delivered", 3),
        ("failed", 3),
    ]
    assert all(r.error.startswith("ValueError: this input is bad\nTraceback") for r in detail.records)
    assert detail.error is not None and "this input is bad" in detail.error  # the dead letter's, whole
    assert detail.result is None


def test_pages_filter_by_task_state_and_id_newest_first(client: QueueClient) -> None:
    client.put("q", [Message(payload=b"%d" % i, headers={H_TASK: f"t{i % 2}"}) for i in range(6)])
    got = client.get("q", 6, lease_s=60, consumer="me")
    ids = [m.id for m in got]
    client.ack("q", ids[:2])
    client.nack("q", [ids[2]], ["boom\nwhere"])  # attempts left: retried
    client.release("q", [ids[3]])
    # running: ids[4], ids[5]; settled: acked 0 and 1, retried 2, released 3
    page = client.tasks("q")
    assert {r.id for r in page.running} == {ids[4], ids[5]}
    assert page.running_total == 2
    assert [r.id for r in page.recent] == [ids[3], ids[2], ids[1], ids[0]]  # newest first
    assert [r.state for r in page.recent] == [TaskState.RELEASED, TaskState.RETRIED, TaskState.ACKED, TaskState.ACKED]
    assert page.recent[1].error == "boom"  # its first line
    assert {r.id for r in client.tasks("q", task="t0").running + client.tasks("q", task="t0").recent} == set(ids[0::2])
    assert [r.id for r in client.tasks("q", state=TaskState.ACKED).recent] == [ids[1], ids[0]]
    only_running = client.tasks("q", state=TaskState.RUNNING)
    assert only_running.recent == [] and only_running.running_total == 2
    assert client.tasks("q", state=TaskState.FAILED) == TaskPage([], [], 0)
    by_id = client.tasks("q", msg_id=ids[2])
    assert by_id.running == [] and [r.id for r in by_id.recent] == [ids[2]]
    assert len(client.tasks("q", limit=1).recent) == 1
    # every queue of the server at once: a record names its queue
    client.put("other", [Message(payload=b"x", headers={H_TASK: "t9"})])
    client.get("other", 1, consumer="me")
    everywhere = client.tasks()
    assert {(r.queue, r.task) for r in everywhere.running} == {("q", "t0"), ("q", "t1"), ("other", "t9")}
    assert everywhere.running_total == 3


def test_bad_arguments_are_refused_and_change_nothing(client: QueueClient) -> None:
    client.put("q", [Message(payload=b"x")])
    for args, want in (
        ({"queue": "q", "state": "sleeping"}, ERR_BAD_ARGUMENT),
        ({"queue": "q", "limit": 0}, ERR_BAD_ARGUMENT),
        ({"queue": "q", "mid": -1}, ERR_BAD_ARGUMENT),
        ({"queue": "nowhere"}, ERR_NO_QUEUE),
    ):
        with pytest.raises(RequestError) as e:
            client.call(_raw("tasks", args))
        assert e.value.kind == want, args
    with pytest.raises(RequestError) as e:
        client.call(_raw("task", {"queue": "q"}))
    assert e.value.kind == ERR_BAD_ARGUMENT and "mid" in str(e.value)
    with pytest.raises(RequestError) as e:
        client.task("nowhere", 1)
    assert e.value.kind == ERR_NO_QUEUE
    assert client.stats("q")["q"].ready == 1


def _raw(op: str, args: dict[str, object]) -> Call[object]:
    return Call(op, args)


def test_an_old_client_that_names_no_consumer_is_recorded_without_one(server: ThreadServer, client: QueueClient) -> None:
    client.put("q", [Message(payload=b"x", headers={H_TASK: "t"})])
    raw = RawConnection(server.address)
    raw.send(frame({"op": "get", "id": 1, "queue": "q", "n": 1}))  # a get as clients before `consumer` sent it
    assert "error" not in raw.read()
    raw.close()
    (r,) = client.tasks("q").running
    assert (r.consumer, r.task) == ("", "t")


def test_leases_that_run_out_or_end_with_the_connection_are_recorded_as_such(server: ThreadServer, client: QueueClient) -> None:
    client.declare("q", max_attempts=2)
    client.put("q", [Message(payload=b"a", headers={H_TASK: "t"}), Message(payload=b"b", headers={H_TASK: "t"})])
    (short,) = client.get("q", 1, lease_s=0.2, consumer="lost")
    expired = wait_for(lambda: client.tasks("q", state=TaskState.EXPIRED).recent, 10, "the lease's end recorded")
    assert [(r.id, r.consumer, r.error) for r in expired] == [(short.id, "lost", LEASE_RAN_OUT)]
    assert expired[0].runtime_s == pytest.approx(0.2, abs=0.05)  # it ended when its lease did
    raw = RawConnection(server.address)
    raw.send(frame({"op": "get", "id": 1, "queue": "q", "n": 2, "lease_s": 600.0, "tie": True, "consumer": "dies"}))
    assert len(raw.read()["ids"]) == 2
    raw.close()  # its peer gone: the tied leases end at once, the second attempt of `short` its last
    ended = wait_for(lambda: len(r := client.tasks("q", msg_id=short.id).recent) == 2 and r, 10, "the connection's end")
    assert (ended[0].state, ended[0].consumer, ended[0].error, ended[0].attempt) == (TaskState.DEAD, "dies", CONNECTION_CLOSED, 2)
    other = one(client.tasks("q", state=TaskState.EXPIRED).recent, short.id + 1)
    assert (other.consumer, other.error) == ("dies", CONNECTION_CLOSED)
    assert client.status("q", [short.id, short.id + 1]) == [Status.FAILED, Status.READY]


def test_an_extended_lease_keeps_its_delivery_running(server: ThreadServer, client: QueueClient) -> None:
    client.put("q", [Message(payload=b"a")])
    (m,) = client.get("q", 1, lease_s=0.3, consumer="slow")
    assert client.extend_lease("q", [m.id], 600) == [True]
    deadline = time.monotonic() + 1.0  # past the first lease, several sweeps
    while time.monotonic() < deadline:
        assert [r.id for r in client.tasks("q").running] == [m.id]
        time.sleep(0.05)
    assert client.ack("q", [m.id]) == [True]
    assert [r.state for r in client.tasks("q").recent] == [TaskState.ACKED]


def test_the_task_operation_previews_msgpack_calls_and_never_unpickles(server: ThreadServer, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    with QueuePool.connect([server.address]) as pool:
        plain = wt.add.publish(2, 40, _pool=pool)
        pickled = wt.add.publish(Trap(str(marker)), 1, _pool=pool)  # not plain data: pickled
        got = pool.queues.get("jobs", 2, consumer="probe")  # delivered, not run: its records keep what it held
        assert {m.id for m in got} == {plain.id, pickled.id}
        p, k = pool.queues.task("jobs", plain.id), pool.queues.task("jobs", pickled.id)
    assert p.status is Status.DELIVERED and p.content_type == "msgpack" and p.payload is not None and p.payload.complete
    shown = show_call(p.payload, p.content_type)
    assert (shown.text, shown.decoded) == ("tests.support.worker_tasks.add(2, 40)", True)
    assert k.content_type == "pickle" and k.payload is not None
    assert show_call(k.payload, k.content_type).text == f"pickled, {k.payload.size:,} bytes"
    assert not marker.exists()  # neither the server nor the preview loaded the pickle
    assert [r.consumer for r in p.records] == ["probe"] and p.enqueued_at is not None and p.history()[0].what == "put"


def test_the_task_operation_previews_a_result_and_cuts_a_big_payload(client: QueueClient) -> None:
    big = b"\xaa" * (TASK_PREVIEW_BYTES * 3)
    client.put("q", [Message(payload=b"small", headers={H_TASK: "t"}), Message(payload=big, headers={H_TASK: "t"})])
    small, large = client.get("q", 2, consumer="c")
    assert client.ack("q", [small.id], [encode_result({"answer": 42})]) == [True]
    d = client.task("q", small.id)
    assert d.status is Status.ACKED and d.result is not None and d.result.complete
    assert show_result(d.result).text == "{'answer': 42}"
    assert [r.state for r in d.records] == [TaskState.ACKED]
    cut = client.task("q", large.id)
    assert cut.payload is not None and cut.payload.size == len(big) and cut.payload.data == big[:TASK_PREVIEW_BYTES]
    assert not cut.payload.complete
    # a message never delivered since the server started: where it is, nothing more
    (fresh,) = [client.put("q", [Message(payload=b"new")])[0]]
    d = client.task("q", fresh)
    assert (d.status, d.records, d.payload, d.headers) == (Status.READY, [], None, None)
    assert client.task("q", 10**9).status is None


def test_a_dead_letter_not_in_the_records_still_shows_its_payload_and_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with thread_server(data_dir=data) as s:
        c = QueueClient(s.address, timeout=10)
        (i,) = c.put("q", [Message(payload=b"payload", headers={H_TASK: "t"})])
        c.get("q", 1, consumer="c")
        c.nack("q", [i], ["it broke"], final=True)
        c.close()
    with thread_server(data_dir=data) as s:  # restarted: its records start empty, its store keeps the dead letter
        c = QueueClient(s.address, timeout=10)
        d = c.task("q", i)
        c.close()
    assert (d.status, d.records, d.error, d.task) == (Status.FAILED, [], "it broke", "t")
    assert d.payload is not None and d.payload.data == b"payload"


def test_the_recent_records_are_bounded_and_a_long_error_is_cut(client: QueueClient) -> None:
    n = TASK_RECENT + 200
    client.put("q", [Message(payload=b"x", headers={H_TASK: "t"})] * n)
    got = client.get("q", n, consumer="c")
    client.ack("q", [m.id for m in got[:-1]])
    long_error = "E: " + "x" * 100_000
    client.nack("q", [got[-1].id], [long_error])
    page = client.tasks("q", limit=1000)
    assert len(page.recent) == 1000 and page.recent[0].id == got[-1].id
    assert client.tasks("q", msg_id=got[0].id).recent == []  # the oldest settled: forgotten
    (kept,) = client.task("q", got[-1].id).records
    assert kept.error == kept_error(long_error) and len(kept.error) < 2200 and kept.error.endswith("x" * 100)


def test_a_pool_merges_its_servers_records_with_pool_wide_ids(tmp_path: Path) -> None:
    release = tmp_path / "go"
    with thread_server() as a, thread_server() as b, QueuePool.connect([a.address, b.address], connect_timeout=1) as pool:
        handles = [wt.waits_for_file.publish(str(release), 60.0, _pool=pool) for _ in range(2)]  # puts go round-robin
        assert {pool.queues.split_id(h.id)[0] for h in handles} == {0, 1}  # one on each server
        with Running(pool, "c-pool", concurrency=2):
            page = wait_for(lambda: len((p := pool.queues.tasks("jobs")).running) == 2 and p, 20, "both running")
            assert {r.id for r in page.running} == {h.id for h in handles} and page.running_total == 2
            for h in handles:
                d = pool.queues.task("jobs", h.id)
                assert d.id == h.id and [r.id for r in d.records] == [h.id] and d.records[0].consumer == "c-pool"
            assert [r.id for r in pool.queues.tasks(msg_id=handles[1].id).running] == [handles[1].id]
            release.touch()
            pool.gather(handles, timeout=30)
        with pytest.raises(RequestError) as e:
            pool.queues.tasks("nowhere")
        assert e.value.kind == ERR_NO_QUEUE
        b.stop()  # one server down: the other's records, and the one that did not answer named
        page = pool.queues.tasks("jobs")
        assert {r.id for r in page.recent} == {handles[0].id} and list(page.unreachable) == [b.address]
        assert pool.queues.tasks("nowhere").unreachable  # a queue the server down may have: no error


def test_a_dropped_queue_takes_its_records_with_it(client: QueueClient) -> None:
    client.put("q", [Message(payload=b"x", headers={H_TASK: "t"})])
    client.get("q", 1, consumer="c")
    assert client.drop("q")
    assert client.tasks().running_total == 0
    client.put("q", [Message(payload=b"y")])  # made again: none of the old records
    assert client.tasks("q") == TaskPage([], [], 0)


class Trap:
    """An argument that leaves a file behind when unpickled: proof that nothing loaded it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_touch, (self.path,))


def _touch(path: str) -> None:
    Path(path).touch()


def test_a_page_shows_the_line_that_names_the_error() -> None:
    worker_style = "ValueError: bad\nTraceback (most recent call last):\n  File 'x', line 1\nValueError: bad"
    assert error_summary(worker_style) == "ValueError: bad"  # a worker's errors start with the exception
    assert error_summary("Traceback (most recent call last):\n  File 'x', line 1\nKeyError: 'k'\n\n") == "KeyError: 'k'"
    assert error_summary("") == ""
    assert error_summary("x" * 500) == "x" * (TASK_ERROR_SUMMARY_CHARS - 1) + "…"
