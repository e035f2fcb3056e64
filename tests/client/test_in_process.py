"""Worker logic against InProcessQueues: consumers, settlers and task handles with no server and no socket."""

from __future__ import annotations

import itertools
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

import conveyor.worker.consumer as consumer_module
import conveyor.worker.settler as settler_module
from conveyor.client.backend import QueueBackend
from conveyor.client.in_process import InProcessQueues
from conveyor.client.pool import QueuePool
from conveyor.errors import TaskFailedError
from conveyor.message import Message, Status
from conveyor.tasks.publish import publish_adhoc
from conveyor.worker import Consumer
from conveyor.worker.settler import BUSY_COALESCE_S, COALESCE_S, Ack, Settler

from ..support import worker_tasks as wt

MODULES = ["tests.support.worker_tasks"]


class Recording(InProcessQueues):
    """Records the ids of every ack call (how the settler batched them)."""

    def __init__(self) -> None:
        super().__init__()
        self.ack_calls: list[list[int]] = []

    def ack(self, queue: str, ids: Sequence[int], results: Sequence[bytes | None] | None = None) -> list[bool]:
        self.ack_calls.append(list(ids))
        return super().ack(queue, ids, results)


@pytest.fixture
def queues(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recording]:
    def refuse(*args: object) -> None:
        raise AssertionError("a socket connected: in-process queues need no network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    with Recording() as q:
        yield q


def consume(q: InProcessQueues, concurrency: int = 4, batch_size: int | None = None) -> Consumer:
    """Run a consumer on 'jobs' in this thread until the queue is drained."""
    c = Consumer(q, ["jobs"], concurrency=concurrency, batch_size=batch_size, until_empty=True, task_modules=MODULES)
    c.run()
    return c


def wait_until(cond: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def backends(pool: QueuePool, q: InProcessQueues) -> list[QueueBackend]:
    """Both are QueueBackends: a pool's sharded client and the in-process queues (mypy checks this function)."""
    return [pool.queues, q]


def test_it_is_a_backend_whose_copies_are_itself(queues: Recording) -> None:
    assert isinstance(queues, QueueBackend)
    assert queues.with_own_connections() is queues  # what the settler and the blob fetcher take
    assert pickle.loads(pickle.dumps(queues)) is queues  # and a pickled copy: it lives in this process only
    assert (len(queues), queues.assign(0, 3), queues.split_id(42)) == (1, [0], (0, 42))
    key = queues.put_blob(b"bytes")
    assert len(key) == 64 and queues.get_blob(key) == b"bytes" and queues.get_blob("0" * 64) is None


def test_tasks_run_and_their_results_are_stored(queues: Recording) -> None:
    handles = wt.add.publish_many([(i, 10) for i in range(40)], _pool=queues)
    # an ad-hoc callable: its function is a blob
    [adhoc] = publish_adhoc(divmod, [((17, 5), {})], wt.add.options, None, None, None, queues, lambda f: queues.put_blob(f.data))
    c = consume(queues)
    assert queues.gather(handles, timeout=5) == [i + 10 for i in range(40)]
    assert dict(queues.results("jobs"))[adhoc.id] is not None
    assert c.stats.processed == 41 and c.stats.failed == 0 and c.stats.fetched_by_shard == {0: 41}
    st = queues.stats("jobs")["jobs"]
    assert (st.acked, st.pending) == (41, 0)


def test_a_failing_task_is_retried_with_backoff_then_dead_lettered(queues: Recording, tmp_path: Path) -> None:
    log = tmp_path / "attempts.log"
    h = wt.always_fails.publish(str(log), _pool=queues)
    c = consume(queues)
    times = [float(t) for t in log.read_text().splitlines()]
    assert len(times) == 3  # max_retries=2: three attempts
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2, gaps  # retry_backoff=(0.2, 2), "equal" jitter
    [dl] = queues.dead_letters("jobs")
    assert dl.message.id == h.id and dl.message.attempts == 3
    assert dl.error.startswith("ValueError: this input is bad") and "Traceback" in dl.error
    assert (c.stats.retried, c.stats.dead) == (2, 1)
    assert h.status() is Status.FAILED


def test_a_nack_with_a_delay_holds_the_message_back_and_a_long_poll_wakes_for_it(queues: Recording) -> None:
    [i] = queues.put("q", [Message(payload=b"x")])
    [m] = queues.get("q", 1, lease_s=30)
    assert queues.nack("q", [m.id], ["boom"], delay_s=0.3) == [True]
    assert queues.stats("q")["q"].delayed == 1
    assert queues.get("q", 1) == []  # not due yet
    t0 = time.monotonic()
    [again] = queues.get("q", 1, wait_s=5)  # woken when it comes due, not after 5 s
    assert 0.2 <= time.monotonic() - t0 < 2 and again.id == i and again.attempts == 2
    assert queues.extend_lease("q", [i, 999], 60) == [True, False]  # only a delivered message has a lease
    assert queues.release("q", [i]) == [True]
    [third] = queues.get("q", 1)
    assert third.attempts == 2  # a release gives the attempt back
    assert queues.ack("q", [i], [b"r"]) == [True] and queues.ack("q", [i]) == [False]  # the first ack wins
    assert queues.result("q", [i]) == [b"r"] and queues.status("q", [i]) == [Status.ACKED]


def test_a_long_poll_returns_when_a_message_is_put(queues: Recording) -> None:
    got: list[list[Message]] = []
    t = threading.Thread(target=lambda: got.append(queues.get("q", 1, wait_s=10)))
    t0 = time.monotonic()
    t.start()
    wait_until(lambda: "q" in queues.stats())  # the get made the queue and waits
    queues.put("q", [Message(payload=b"hello")])
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 5
    assert [m.payload for m in got[0]] == [b"hello"]
    t0 = time.monotonic()
    assert queues.get("q", 1, wait_s=0.2) == [] and time.monotonic() - t0 >= 0.2  # bounded when nothing comes


def test_a_time_limit_stops_the_task(queues: Recording) -> None:
    slow = wt.sleeps.publish(2.0, _pool=queues)
    quick = wt.sleeps.publish(0.01, _pool=queues)
    t0 = time.monotonic()
    c = consume(queues, concurrency=1)
    assert time.monotonic() - t0 < 1.8  # the 2 s task did not hold the consumer
    with pytest.raises(TaskFailedError, match=r"TimeLimitExceeded: the task ran over its time limit of 0\.5 s") as e:
        slow.result(timeout=5)
    assert "thread was abandoned" in e.value.error
    assert quick.result(timeout=5) == 0.01
    assert c.stats.timed_out == 1


def test_task_handles_wait_for_results_from_a_running_consumer(queues: Recording) -> None:
    h = wt.add.publish(2, 3, _pool=queues)
    with pytest.raises(TimeoutError):
        h.result(timeout=0.1)  # no consumer yet
    c = Consumer(queues, ["jobs"], concurrency=2, task_modules=MODULES)
    t = threading.Thread(target=c.run)
    t.start()
    try:
        assert h.result(timeout=5) == 5
        dead = wt.fails_for_good.publish(_pool=queues)
        with pytest.raises(TaskFailedError, match="Unfixable: no retry can mend this"):
            dead.result(timeout=5)
        assert "pid" in queues.workers()[c.name]  # the settler reported the consumer
    finally:
        c.stop()
        t.join(10)
    assert not t.is_alive()
    assert (c.stats.processed, c.stats.dead) == (1, 1)


def test_the_settler_gathers_acks_into_one_call(queues: Recording) -> None:
    assert BUSY_COALESCE_S >= 4 * COALESCE_S
    queues.put("q", [Message(payload=b"x") for _ in range(3)])
    a, b, c = (m.id for m in queues.get("q", 3, lease_s=30))
    settler = Settler(queues)
    try:
        settler.busy = True
        settler.put([Ack("q", a, b"ra")])
        until = time.monotonic() + 2 * COALESCE_S  # a settler that is not busy would have sent it by now
        while time.monotonic() < until:
            assert queues.ack_calls == [], "a busy settler sent an ack within the quiet window"
        settler.put([Ack("q", b, b"rb"), Ack("q", c, None)])
        assert settler.flush(5)  # hurries: no wait for the rest of the window
        assert queues.ack_calls == [[a, b, c]]
        assert dict(queues.results("q")) == {a: b"ra", b: b"rb"}
    finally:
        settler.close(5)
    assert settler.unsettled == 0 and settler.errors == 0


def test_a_consumer_whose_last_fetch_was_full_sends_its_acks_when_it_goes_idle(
    queues: Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fetches of two for two slots: the queue looks busy, and a busy settler gathers for
    # BUSY_COALESCE_S; once nothing runs and the queue looks drained, the acks go at once rather
    # than after the window (the end of the work would wait for them)
    monkeypatch.setattr(settler_module, "BUSY_COALESCE_S", 2.0)
    monkeypatch.setattr(consumer_module, "IDLE_POLL_S", 2.0)  # the long poll an idle consumer makes next
    c = Consumer(queues, ["jobs"], concurrency=2, batch_size=2, task_modules=MODULES)
    t = threading.Thread(target=c.run)
    t.start()
    try:
        wait_until(lambda: c.name in queues.workers())  # started: it long-polls the empty queue
        t0 = time.monotonic()
        handles = wt.add.publish_many([(i, i) for i in range(6)], _pool=queues)
        assert queues.gather(handles, timeout=10) == [2 * i for i in range(6)]
        assert time.monotonic() - t0 < 1.0  # not after the 2 s window or the 2 s poll
    finally:
        c.stop()
        t.join(10)
    assert not t.is_alive()


def test_a_consumer_acks_in_batches(queues: Recording) -> None:
    handles = wt.add.publish_many([(i, 1) for i in range(200)], _pool=queues)
    consume(queues, concurrency=8, batch_size=50)
    assert queues.gather(handles, timeout=5) == [i + 1 for i in range(200)]
    assert sorted(i for ids in queues.ack_calls for i in ids) == sorted(h.id for h in handles)
    assert len(queues.ack_calls) < 200 / 2  # settlements went together, not one call per message
