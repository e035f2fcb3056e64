"""conveyor.compat.daskqueue: daskqueue-style code with only its imports changed.

On real Conveyor servers and consumer processes: submitting, custom consumers, early and late acks
under a killed consumer, poison items, and clear errors for bad input.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import conveyor.worker.ack_modes as ack_modes_module
import conveyor.worker.consumer as consumer_module
from conveyor.compat.daskqueue import (
    Client,
    ConsumerBaseClass,
    ConsumerPool,
    DummyConsumer,
    Durability,
    GeneralConsumer,
    LocalCluster,
    Queue,
    QueuePool,
)
from conveyor.errors import ConveyorError, SerializationError
from conveyor.message import Status
from conveyor.tasks.envelope import decode_result
from conveyor.worker import Consumer, ConsumerHooks, HookFailure
from conveyor.worker import ConsumerPool as ConveyorConsumerPool

from ..support.servers import wait_for

pytestmark = pytest.mark.timeout(60)


# --- what the items run (module level: the consumer processes import them by name) ---------------
def add(x: int, y: int) -> int:
    return x + y


def boom(log: str) -> None:
    with open(log, "a") as f:
        f.write("ran\n")
    raise ValueError("boom")


def wait_for_go(log: str, go: str) -> str:
    """Say which process runs it, then hold the item until `go` exists (bounded)."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + 30
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "done"


class Doubler(ConsumerBaseClass):
    """A custom consumer keeping its own results, as daskqueue users write them."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.doubled: list[int] = []
        self.lock = threading.Lock()

    def process_item(self, item: int) -> int:
        with self.lock:
            self.doubled.append(item * 2)
        return item * 2

    def get_results(self) -> list[int]:
        return self.doubled


class NoResults(ConsumerBaseClass):
    def process_item(self, item: Any) -> None:
        pass


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with Client() as c:
        yield c


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def flat(results: dict[str, Any]) -> list[Any]:
    return [v for per in results.values() for v in (per.values() if isinstance(per, dict) else per)]


# --- a daskqueue script ---------------------------------------------------------------------------
def test_a_daskqueue_script_runs_with_its_imports_changed() -> None:
    client = Client(n_workers=5, threads_per_worker=2, direct_to_workers=True)  # dask's options: accepted
    servers = client.pool.servers.processes
    try:
        queue_pool = QueuePool(client, 4)
        consumer_pool = ConsumerPool(client, queue_pool, ConsumerClass=GeneralConsumer, n_consumers=2)
        assert len(queue_pool) == 4 and isinstance(queue_pool[0], Queue) and len(consumer_pool) == 2
        assert consumer_pool[1].name == "GeneralConsumer-1"
        assert queue_pool.batch_submit([(add, i, 1) for i in range(40)]) == [None] * 4  # chunks of 40 // 4 + 1
        for i in range(10):
            queue_pool.submit(add, 100, y=i)
        assert sum(queue_pool.get_queue_size().values()) == 50
        # round-robin: chunks of 11, 11, 11 and 7 calls, then the 10 submits one by one
        assert [q.qsize() for q in queue_pool.get_queues()] == [14, 14, 13, 9]
        assert queue_pool.print().startswith("QueuePool : 4 queue(s)") and "13 pending items" in repr(queue_pool)
        consumer_pool.start()
        consumer_pool.join(timestep=0.05, print_timestep=1, progress=False)
        res = consumer_pool.results()
        assert set(res) == {"GeneralConsumer-0", "GeneralConsumer-1"}
        assert sorted(flat(res)) == sorted([i + 1 for i in range(40)] + [100 + i for i in range(10)])
        assert sum(queue_pool.get_queue_size().values()) == 0
        assert consumer_pool.nb_consumed() == 50 and consumer_pool.stats.processed == 50
        assert sum(c.len_items() for c in consumer_pool) == 50
        assert "2 Consumers(s)" in repr(consumer_pool) and "50 received" in repr(consumer_pool)
    finally:
        client.close()
    assert all(p.poll() is not None for p in servers)  # the servers Client() started are stopped
    client.close()  # twice: nothing more to do


# daskqueue's README and perf scripts log with `from daskqueue.utils import logger`
SHOUTER = """
from conveyor.compat.daskqueue import Client, ConsumerBaseClass, ConsumerPool, QueuePool
from conveyor.compat.daskqueue.utils import logger


class Shouter(ConsumerBaseClass):
    def process_item(self, item):
        logger.info("info about %s", item)
        logger.warning("warning about %s", item)


if __name__ == "__main__":
    with Client() as client:
        queue_pool = QueuePool(client, 1)
        queue_pool.put_many(["apple", "pear"])
        ConsumerPool(client, queue_pool, Shouter, 1).join()
        logger.info("main done")
"""


@pytest.mark.parametrize("level", [None, "warning"])
def test_daskqueue_utils_logger_writes_once_in_daskqueues_format_at_its_loglevel(tmp_path: Path, level: str | None) -> None:
    """The script's and its consumers' records, each once, as `time,ms LEVEL: message`, above `LOGLEVEL`."""
    script = tmp_path / "shouter.py"
    script.write_text(SHOUTER)
    env = {k: v for k, v in os.environ.items() if k != "LOGLEVEL"} | ({"LOGLEVEL": level} if level else {})
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50)
    assert run.returncode == 0, run.stderr
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3},\d+ "
    written = sorted(re.sub(stamp, "", line) for line in run.stderr.splitlines() if re.match(stamp, line))
    expected = ["WARNING: warning about apple", "WARNING: warning about pear"]
    if level is None:  # daskqueue's default level: INFO
        expected += ["INFO: info about apple", "INFO: info about pear", "INFO: main done"]
    assert written == sorted(expected), run.stderr
    assert "conveyor.compat.daskqueue.utils" not in run.stderr, run.stderr  # not written again by the root logger


def test_custom_consumer_gets_plain_items_and_keeps_its_results(client: Client) -> None:
    queue_pool = QueuePool(client, 2, durability=Durability.DURABLE)
    queue_pool.put_many(list(range(20)))
    queue_pool.put(100)
    queue_pool[1].put_many([200, 300])
    consumer_pool = ConsumerPool(
        client, queue_pool, ConsumerClass=Doubler, n_consumers=2, batch_size=4, max_concurrency=3, early_ack=False
    )
    consumer_pool.start()
    consumer_pool.join()
    res = consumer_pool.results()
    assert set(res) == {"Doubler-0", "Doubler-1"}
    assert sorted(flat(res)) == sorted([2 * i for i in range(20)] + [200, 400, 600])
    assert consumer_pool.nb_consumed() == 23
    assert consumer_pool.stats.processed == 23 and consumer_pool.stats.failed == 0
    queue_pool.put_many([1000, 2000])  # a second round: join starts the consumers again, results add up
    consumer_pool.join()
    assert sorted(flat(consumer_pool.results())) == sorted([2 * i for i in range(20)] + [200, 400, 600, 2000, 4000])
    assert sum(c.len_items() for c in consumer_pool) == 25
    # consumers without get_results: daskqueue's error
    with pytest.raises(NotImplementedError, match="get_results"):
        ConsumerPool(client, queue_pool, ConsumerClass=NoResults).results()


def padded(i: int) -> str:
    return f"{i:0200d}"


def test_a_durable_pool_made_again_with_its_dirpath_reopens_its_queues(client: Client, tmp_path: Path) -> None:
    """daskqueue's durable queues lived in `dirpath`: a program run again with it found its items there."""
    import asyncio

    first = QueuePool(client, 2, durability=Durability.DURABLE, dirpath=str(tmp_path / "queues"))
    for i in range(10):
        first.put(i)  # round-robin: 5 to each queue
    again = QueuePool(client, 2, durability=Durability.DURABLE, dirpath=tmp_path / "queues")
    assert again.queue_names == first.queue_names
    assert [q.qsize().result() for q in again.get_queues()] == [5, 5]  # as daskqueue's actor futures answered
    assert sum(again.get_queue_size().values()) == 10 and again[0].qsize() == 5
    assert asyncio.run(_awaited(again[1])) == 5
    other = QueuePool(client, 2, durability=Durability.DURABLE, dirpath=str(tmp_path / "elsewhere"))
    assert not set(other.queue_names) & set(first.queue_names) and sum(other.get_queue_size().values()) == 0
    transient = [QueuePool(client, 1).queue_names for _ in range(2)]
    assert transient[0] != transient[1]  # memory queues are a pool's own
    for name in first.queue_names:
        client.pool.purge(name)


async def _awaited(queue: Any) -> int:
    return int(await queue.qsize())


def test_results_bigger_than_a_pipe_holds_come_back(client: Client) -> None:
    queue_pool = QueuePool(client, 2)
    queue_pool.batch_submit([(padded, i) for i in range(3000)])  # 600 kB of results for one consumer to send back
    consumer_pool = ConsumerPool(client, queue_pool, n_consumers=1, batch_size=100)
    consumer_pool.join()
    assert sorted(flat(consumer_pool.results())) == [padded(i) for i in range(3000)]


# --- acks: late (at least once) and early (at most once, daskqueue's default) ------------------------
@pytest.mark.parametrize("early_ack", [False, True])
def test_a_consumer_killed_mid_item(client: Client, tmp_path: Path, early_ack: bool) -> None:
    log, go = tmp_path / "runs.log", tmp_path / "go"
    queue_pool = QueuePool(client, 1)
    queue_pool.submit(wait_for_go, str(log), str(go))
    consumer_pool = ConsumerPool(client, queue_pool, n_consumers=1, early_ack=early_ack)
    consumer_pool.start()
    pid = int(wait_for(lambda: lines(log), timeout=20, what="the item started")[0])
    os.kill(pid, signal.SIGKILL)  # the consumer process itself: items run in its threads
    go.touch()
    consumer_pool.join()  # restarts the dead consumer, then waits for the queues to drain
    runs = lines(log)
    if early_ack:  # acked on delivery: the item died with its consumer, as in daskqueue
        assert runs == [str(pid)]
        assert flat(consumer_pool.results()) == []
    else:  # acked once processed: it came back at once and ran again, in the new consumer
        assert len(runs) == 2 and runs[0] == str(pid) and runs[1] != str(pid)
        assert flat(consumer_pool.results()) == ["done"]
    assert sum(queue_pool.get_queue_size().values()) == 0 and queue_pool.dead_letters() == []


def test_conveyor_consumers_early_ack_settles_on_delivery(client: Client) -> None:
    """The consumer option under the compat layer's default settles on delivery, before the task runs.

    Acked before the task runs, its result is not stored and its failure is counted, never retried
    nor dead-lettered.
    """
    pool = client.pool
    ok, bad = pool.submit(add, 2, 3, _queue="early-acks"), pool.submit(add, "a", 1, _queue="early-acks")
    consumer = Consumer(pool.queues, ["early-acks"], early_ack=True, until_empty=True, concurrency=2)
    assert not consumer.reads_ahead  # a message read ahead could not be given back
    stats = consumer.run()
    assert pool.queues.status("early-acks", [ok.id, bad.id]) == [Status.ACKED, Status.ACKED]
    assert pool.queues.result("early-acks", [ok.id]) == [None]
    assert stats.processed == 1 and stats.failed == 1 and stats.dead == 1 and stats.retried == 0
    assert pool.dead_letters("early-acks") == []


def held_a_while(x: int) -> int:
    time.sleep(0.05)  # the work itself: long enough for both queues' messages to be held at once
    return x


def test_a_consumer_tells_apart_messages_of_two_queues_with_the_same_id(client: Client) -> None:
    """A consumer of several queues holds messages by queue and id: each is acked once, with its result.

    Each queue numbers its own messages: a consumer serving several (as a compat QueuePool's) holds
    them by queue and id, so every one is acked once, with its result.
    """
    pool = client.pool
    # two puts per queue: each put goes to the next server, so both queues have messages 1-5 on both
    handles = [
        h
        for q, first in [("ids-a", 0), ("ids-a", 5), ("ids-b", 10), ("ids-b", 15)]
        for h in pool.map(held_a_while, range(first, first + 5), _queue=q)
    ]
    assert {h.id for h in handles[:10]} & {h.id for h in handles[10:]}  # ids both queues have
    stats = Consumer(pool.queues, ["ids-a", "ids-b"], until_empty=True, concurrency=20).run()
    assert pool.gather(handles, timeout=10) == list(range(20))
    assert stats.processed == 20 and stats.failed == 0
    assert sum(stats.fetched_by_shard.values()) == 20  # none delivered again for want of its ack


# --- poison items ----------------------------------------------------------------------------------
def test_a_poison_item_is_retried_then_dead_lettered_with_late_acks(client: Client, tmp_path: Path) -> None:
    log = tmp_path / "boom.log"
    queue_pool = QueuePool(client, 2)
    queue_pool.submit(boom, str(log))
    queue_pool.put(42)  # a plain item for a GeneralConsumer: no retry can mend it, failed at once
    queue_pool.submit(add, 1, 2)
    consumer_pool = ConsumerPool(client, queue_pool, n_consumers=1, retries=1, early_ack=False)
    consumer_pool.join()  # ends: the poison item does not loop forever
    assert lines(log) == ["ran", "ran"]  # retries=1: two runs
    dead = sorted(d.error.split("\n", 1)[0] for d in queue_pool.dead_letters())
    assert len(dead) == 2 and dead[0].endswith("ValueError: boom") and "NotACall: GeneralConsumer runs" in dead[1]
    assert flat(consumer_pool.results()) == [3]
    assert consumer_pool.stats.dead == 2 and consumer_pool.stats.failed == 3


def test_a_poison_item_with_early_acks_runs_once_and_is_counted(client: Client, tmp_path: Path) -> None:
    log = tmp_path / "boom.log"
    queue_pool = QueuePool(client, 1)
    queue_pool.submit(boom, str(log))
    consumer_pool = ConsumerPool(client, queue_pool, n_consumers=1, retries=3)  # early_ack=True: no retry possible
    consumer_pool.join()
    assert lines(log) == ["ran"]
    assert queue_pool.dead_letters() == []  # settled on delivery: nothing left on the servers
    assert consumer_pool.stats.failed == 1 and consumer_pool.stats.dead == 1 and consumer_pool.stats.retried == 0
    assert flat(consumer_pool.results()) == []


# --- clients ---------------------------------------------------------------------------------------
def test_clients_of_a_cluster_and_of_addresses() -> None:
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster:
        with Client(cluster) as shared:
            assert shared.threads_per_worker == 1
            QueuePool(shared, 1).put_many([1, 2, 3])
        by_address = Client(address=cluster.scheduler_address)
        queue_pool = QueuePool(by_address, 3)
        queue_pool.put_many([5, 6])
        consumer_pool = ConsumerPool(by_address, queue_pool, ConsumerClass=DummyConsumer)
        consumer_pool.join()
        assert consumer_pool.nb_consumed() == 2
        with pytest.raises(NotImplementedError):  # DummyConsumer keeps no results
            consumer_pool.results()
        by_address.close()
        assert all(p.poll() is None for p in cluster.pool.servers.processes)  # the cluster's servers outlive its clients
        assert sum(cluster.pool.stats()[q].pending for q in queue_pool.queue_names) == 0


# --- bad input -------------------------------------------------------------------------------------
def test_bad_input_is_a_clear_error(client: Client) -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*dashbord"):
        Client(dashbord_address=":0")
    with pytest.raises(TypeError, match="address must be"):
        Client(address=7)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="client must be"):
        QueuePool(object(), 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_queues must be >= 1"):
        QueuePool(client, 0)
    with pytest.raises(TypeError, match="n_queues must be an int"):
        QueuePool(client, "2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="correct durability"):
        QueuePool(client, 1, durability="durable")  # type: ignore[arg-type]
    queue_pool = QueuePool(client, 1)
    with pytest.raises(TypeError, match="not callable"):
        queue_pool.submit(5)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="GeneralConsumer"):
        queue_pool.submit(add, 1, 2, worker_class=DummyConsumer)
    with pytest.raises(TypeError, match=r"item 1 must be a tuple \(func, \*args\)"):
        queue_pool.batch_submit([(add, 1, 2), [add, 1, 2]])  # type: ignore[list-item]
    with pytest.raises(SerializationError):
        queue_pool.put(threading.Lock())
    assert queue_pool[0].qsize() == 0  # nothing of the bad calls was put
    with pytest.raises(TypeError, match="subclass of ConsumerBaseClass"):
        ConsumerPool(client, queue_pool, ConsumerClass=int)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="does not implement process_item"):
        ConsumerPool(client, queue_pool, ConsumerClass=ConsumerBaseClass)
    with pytest.raises(TypeError, match="queue_pool must be"):
        ConsumerPool(client, "queues")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_consumers must be >= 1"):
        ConsumerPool(client, queue_pool, n_consumers=0)
    with pytest.raises(TypeError, match="early_ack must be"):
        ConsumerPool(client, queue_pool, early_ack="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timestep"):
        ConsumerPool(client, queue_pool).join(timestep=-1)


# --- the reviewer's defects (each test fails without its fix) -----------------------------------------
def finish_on_go(log: str, go: str) -> str:
    """Say it started, hold the item until `go` exists (bounded), then say it finished."""
    with open(log, "a") as f:
        f.write("started\n")
    deadline = time.monotonic() + 30
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(log, "a") as f:
        f.write("finished\n")
    return "done"


def test_join_with_early_acks_waits_for_the_items_still_running(client: Client, tmp_path: Path) -> None:
    """join waits on the consumers for an item still running, acked on delivery.

    Acked on delivery, a running item is no longer pending on the servers: join waits on the
    consumers for it (a join that stopped them instead would kill it after their shutdown timeout).
    """
    log, go = tmp_path / "runs.log", tmp_path / "go"
    queue_pool = QueuePool(client, 1)
    queue_pool.submit(finish_on_go, str(log), str(go))
    consumer_pool = ConsumerPool(client, queue_pool, n_consumers=1)  # early_ack=True, daskqueue's default
    inner = consumer_pool._pool
    inner.options = dataclasses.replace(inner.options, shutdown_timeout=0.5)  # a wrong stop kills the item at once
    consumer_pool.start()
    wait_for(lambda: lines(log), timeout=20, what="the item started")
    assert queue_pool[0].qsize() == 0  # drained, as far as the servers know
    with pytest.raises(TimeoutError, match="1 acked on delivery still running"):  # Conveyor's join, with a timeout
        consumer_pool._pool.join(timeout=0.5)
    go.touch()
    consumer_pool.join()
    assert lines(log) == ["started", "finished"]
    assert flat(consumer_pool.results()) == ["done"] and consumer_pool.stats.processed == 1


class Unstorable(ConsumerBaseClass):
    """Returns what no server could store: a lock, or more bytes than a result may have."""

    def process_item(self, item: int | str) -> Any:
        return threading.Lock() if item == "lock" else b"x" * int(item)


@pytest.mark.parametrize("early_ack", [False, True])
def test_what_process_item_returns_never_fails_the_item(client: Client, early_ack: bool) -> None:
    limit = min(c.connect().server_limits.max_item_bytes for c in client.pool.queues.clients)
    queue_pool = QueuePool(client, 1)
    queue_pool.put_many(["lock", limit + 1, 3])
    consumer_pool = ConsumerPool(client, queue_pool, ConsumerClass=Unstorable, n_consumers=1, early_ack=early_ack)
    consumer_pool.join()
    assert consumer_pool.stats.processed == 3 and consumer_pool.stats.failed == 0
    assert queue_pool.dead_letters() == []
    stored = [v for _, r in client.pool.queues.results(queue_pool.queue_names[0]) if (v := decode_result(r)) is not None]
    assert stored == ([] if early_ack else [b"xxx"])  # only what can be stored, and only with late acks


def test_early_ack_consumers_extend_no_leases_and_ordinary_ones_check_results_only_when_big(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = client.pool
    handles = pool.map(double, range(5), _queue="hot-path")

    def no_call(*args: object) -> None:
        raise AssertionError("not expected on this path")

    monkeypatch.setattr(consumer_module, "result_fits", no_call)  # small results: the size check alone
    assert Consumer(pool.queues, ["hot-path"], until_empty=True, concurrency=2).run().processed == 5
    assert pool.gather(handles, timeout=10) == [2 * i for i in range(5)]
    monkeypatch.setattr(ack_modes_module, "due_extensions", no_call)  # acked on delivery: no lease to extend
    pool.map(double, range(5), _queue="hot-path-early")
    assert Consumer(pool.queues, ["hot-path-early"], until_empty=True, early_ack=True).run().processed == 5


def double(x: int) -> int:
    return 2 * x


class FailingStop(ConsumerHooks):
    def __init__(self, how: str) -> None:
        self.how = how

    def stop(self) -> object:
        if self.how == "raises":
            raise ValueError("stop went wrong")
        if self.how == "unreadable":
            return Unreadable()
        return threading.Lock()  # cannot be pickled to the pool


def _refuse() -> None:
    raise RuntimeError("cannot be rebuilt in the pool process")


class Unreadable:
    """Pickles in the consumer process; unpickling it (in the pool) raises."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _refuse, ()


@pytest.mark.parametrize("how", ["raises", "unpicklable", "unreadable"])
def test_a_failing_hook_stop_loses_no_counts_and_says_why(client: Client, how: str) -> None:
    pool = client.pool
    pool.map(double, range(4), _queue=f"hooks-{how}")
    consumer_pool = ConveyorConsumerPool(pool, 1, queues=[f"hooks-{how}"], hooks=FailingStop(how))
    consumer_pool.join(timeout=30)
    assert consumer_pool.stats.processed == 4
    [said] = consumer_pool.farewells[0]
    assert isinstance(said, HookFailure)
    want = {"raises": "ValueError: stop went wrong", "unpicklable": "pickle", "unreadable": "cannot be rebuilt"}[how]
    assert want in said.error
    assert consumer_pool.processes == []  # stopped, none left running: a later join starts them anew


class BadInit(ConsumerBaseClass):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        raise ValueError("bad config in consumer __init__")

    def process_item(self, item: Any) -> None:
        pass


def test_a_consumer_class_that_cannot_be_made_says_why(client: Client) -> None:
    queue_pool = QueuePool(client, 1)
    queue_pool.put(1)
    consumer_pool = ConsumerPool(client, queue_pool, ConsumerClass=BadInit, n_consumers=1)
    with pytest.raises(ConveyorError, match="ValueError: bad config in consumer __init__"):
        consumer_pool.join()


def test_nb_consumed_counts_this_pools_consumers_only(client: Client) -> None:
    queue_pool = QueuePool(client, 2)
    queue_pool.put_many(list(range(6)))
    first = ConsumerPool(client, queue_pool, ConsumerClass=Doubler, n_consumers=1)
    first.join()
    queue_pool.put_many([10, 11])
    second = ConsumerPool(client, queue_pool, ConsumerClass=Doubler, n_consumers=1)
    second.join()
    assert first.nb_consumed() == 6 and second.nb_consumed() == 2
    assert "2 received" in repr(second)
