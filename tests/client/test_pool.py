"""QueuePool over real server processes: routing, ids, stats, assignment, join, clean shutdown."""

from __future__ import annotations

import inspect
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client.pool import QueuePool
from conveyor.client.sharded import ShardedQueues
from conveyor.constants import SHARD_SHIFT
from conveyor.errors import ConveyorError, RequestError
from conveyor.message import Message
from conveyor.server.local_servers import LocalServers
from conveyor.server.processes import spawn_server, stop_server

from ..support.servers import wait_for


@pytest.fixture(scope="module")
def pool() -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=2, batch_size=100) as p:
        yield p


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    return request.node.name.replace("[", "-").replace("]", "")[:100]


def msgs(n: int, **kw: object) -> list[Message]:
    return [Message(payload=b"m%d" % i, **kw) for i in range(n)]  # type: ignore[arg-type]


def test_puts_spread_round_robin_and_ids_name_their_shard(pool: QueuePool, queue: str) -> None:
    ids = pool.put(queue, msgs(450))
    shards = [pool.queues.split_id(i)[0] for i in ids]
    assert shards[:100] == [shards[0]] * 100 and shards[100] != shards[0]  # whole batches per shard
    assert sorted({s: shards.count(s) for s in shards}.values()) == [200, 250]
    assert all(pool.queues.global_id(*pool.queues.split_id(i)) == i for i in ids)
    per = pool.queues.shard_stats(queue)
    assert sorted(p[queue].ready for p in per) == [200, 250]
    assert pool.stats(queue)[queue].ready == 450


def test_end_to_end_get_ack_nack_results_dead_letters(pool: QueuePool, queue: str) -> None:
    ids = pool.put(queue, msgs(300, max_attempts=1))
    seen: dict[int, bytes] = {}
    while got := pool.queues.get(queue, 64, lease_s=30):
        for m in got:
            seen[m.id] = m.payload
        fail = [m.id for m in got if m.payload.endswith(b"7")]
        ok = [m.id for m in got if not m.payload.endswith(b"7")]
        assert all(pool.queues.ack(queue, ok, [b"r-" + seen[i] for i in ok]))
        assert all(pool.queues.nack(queue, fail, [f"bad {i}" for i in fail]))
    assert sorted(seen) == sorted(ids)
    results = dict(pool.queues.results(queue))
    assert len(results) == 270 and all(r == b"r-" + seen[i] for i, r in results.items())
    dls = pool.dead_letters(queue)
    assert sorted(d.message.id for d in dls) == sorted(i for i in ids if seen[i].endswith(b"7"))
    assert all(d.error == f"bad {d.message.id}" for d in dls)
    st = pool.join(queue, timeout=10, progress=False)[queue]
    assert (st.acked, st.failed, st.pending) == (270, 30, 0)
    assert pool.queues.forget(queue, ids) == 300
    assert list(pool.queues.results(queue)) == []


def test_nack_extend_and_purge_route_to_the_right_shard(pool: QueuePool, queue: str) -> None:
    pool.put(queue, msgs(250))
    got = pool.queues.get(queue, 10, lease_s=30)
    assert pool.queues.extend_lease(queue, [m.id for m in got], 60) == [True] * 10
    assert pool.queues.nack(queue, [m.id for m in got], delay_s=[0.0] * 10) == [True] * 10
    assert pool.purge(queue) == 250
    assert pool.stats(queue)[queue].pending == 0


def test_cancel_routes_each_id_to_its_shard_and_says_what_became_of_it(pool: QueuePool, queue: str) -> None:
    from conveyor.protocol.requests import CancelOutcome as C
    from conveyor.tasks.publish import TaskHandle

    ids = pool.put(queue, msgs(150))  # 100 on one shard, 50 on the other
    [running] = pool.queues.get(queue, 1, shards=[pool.queues.split_id(ids[-1])[0]], lease_s=30)
    assert pool.queues.cancel(queue, [*ids[:2], running.id, ids[-1]]) == [C.CANCELLED, C.CANCELLED, C.RUNNING, C.CANCELLED]
    assert sorted(d.message.id for d in pool.dead_letters(queue)) == sorted([*ids[:2], ids[-1]])
    with pytest.raises(ConveyorError, match="cancelled before it ran"):
        TaskHandle(ids[-1], queue, "t", pool).result(timeout=10)
    with pytest.raises(ValueError, match="names shard 7"):
        pool.queues.cancel(queue, [pool.queues.global_id(7, 1)])
    assert pool.stats(queue)[queue].failed == 3


def test_handles_are_cancelled_across_queues_in_their_order(pool: QueuePool, queue: str) -> None:
    from conveyor.protocol.requests import CancelOutcome as C
    from conveyor.tasks.publish import TaskHandle

    other = f"{queue}-other"
    a, b = pool.put(queue, msgs(3)), pool.put(other, msgs(2))
    pool.queues.ack(other, [m.id for m in pool.queues.get(other, 1, lease_s=30)])  # one of `other`'s finished
    handles = [TaskHandle(i, q, "t", pool) for q, ids in [(other, b), (queue, a)] for i in ids]
    got = pool.cancel([*handles, TaskHandle(a[0] + 10**5, queue, "t", pool)])  # the last: on a[0]'s shard, never put
    assert got.count(C.FINISHED) == 1 and got.count(C.CANCELLED) == 4 and got[-1] is C.UNKNOWN
    assert handles[2].cancel() is C.FAILED  # a dead letter already: its own handle says so
    with pytest.raises(ConveyorError, match="cancelled before it ran"):
        handles[2].result(timeout=10)
    assert pool.stats(queue)[queue].failed == 3 and pool.stats(other)[other].failed == 1


def test_ids_read_and_written_as_shard_colon_n() -> None:
    from conveyor.client.sharded import format_id, parse_id

    for shard, local in [(0, 0), (0, 17), (1, 4), (3, (1 << SHARD_SHIFT) - 1), ((1 << (63 - SHARD_SHIFT)) - 1, 1)]:
        i = ShardedQueues.global_id(shard, local)
        assert format_id(i) == f"{shard}:{local}" and parse_id(format_id(i)) == i and parse_id(str(i)) == i
    assert parse_id(" 2:9 ") == ShardedQueues.global_id(2, 9)
    for bad in ["", "x", "1:", ":1", "-1", "1:-2", "+5", "1_000", "1:2:3", f"0:{1 << SHARD_SHIFT}", f"{1 << 15}:0", str(1 << 63)]:
        with pytest.raises(ValueError, match="is not a message id: give shard:n"):
            parse_id(bad)


def test_get_from_assigned_shards_and_stealing(pool: QueuePool, queue: str) -> None:
    assert pool.queues.assign(0, 2) == [0] and pool.queues.assign(1, 2) == [1]
    assert pool.queues.assign(3, 4) == [1]
    assert pool.queues.assign(0, 1) == [0, 1]
    with pytest.raises(ValueError):
        pool.queues.assign(2, 2)
    [i] = pool.put(queue, msgs(1))
    shard = pool.queues.split_id(i)[0]
    other = 1 - shard
    assert pool.queues.get(queue, 1, shards=[other]) == []
    [m] = pool.queues.get(queue, 1, shards=[other, shard])  # an empty assigned shard: take from the next
    assert m.id == i


def test_long_poll_across_shards(pool: QueuePool, queue: str) -> None:
    t0 = time.monotonic()
    assert pool.queues.get(queue, 1, wait_s=0.6) == []
    assert time.monotonic() - t0 >= 0.59


def get_all(pool: QueuePool, queue: str, n: int) -> list[Message]:
    """Exactly `n` messages, from whichever shards hold them (a get serves one shard at a time)."""
    got: list[Message] = []
    wait_for(lambda: got.extend(pool.queues.get(queue, n - len(got))) or len(got) == n, what=f"{n} messages")
    return got


def test_requeue_dead_letters_puts_them_back_on_their_shards_with_fresh_attempts(pool: QueuePool, queue: str) -> None:
    ms = [Message(payload=b"d%d" % i, priority=i % 3, max_attempts=4, headers={"task": "t", "key": f"k{i}"}) for i in range(6)]
    ids = pool.put(queue, ms)
    assert {pool.queues.split_id(i)[0] for i in ids} == {0, 1}  # keys spread them over both shards
    got = get_all(pool, queue, 6)
    pool.queues.nack(queue, [m.id for m in got], [f"error {m.id}" for m in got], final=True)
    dead = {d.message.id: d.message for d in pool.dead_letters(queue)}
    assert sorted(dead) == sorted(ids)
    pick = [ids[0], ids[1], 12345]  # an id that is no dead letter is skipped
    assert pool.requeue_dead_letters(queue, pick) == 2
    assert sorted(d.message.id for d in pool.dead_letters(queue)) == sorted(ids[2:])
    back = get_all(pool, queue, 2)
    assert not set(ids) & {m.id for m in back}  # new ids
    for m in back:
        old = next(d for d in dead.values() if d.payload == m.payload)
        assert pool.queues.split_id(m.id)[0] == pool.queues.split_id(old.id)[0]  # on the shard it died on
        assert (m.priority, m.max_attempts, m.attempts) == (old.priority, 4, 1)
        assert m.headers == {"task": "t"}  # the key would make the server take it for the dead one
    pool.queues.ack(queue, [m.id for m in back])
    assert pool.requeue_dead_letters(queue) == 4 and pool.dead_letters(queue) == []
    assert sorted(m.payload for m in get_all(pool, queue, 4)) == [b"d2", b"d3", b"d4", b"d5"]
    assert pool.requeue_dead_letters(queue) == 0
    with pytest.raises(ValueError, match="names shard 5"):
        pool.requeue_dead_letters(queue, [5 << SHARD_SHIFT])


def test_ids_from_another_pool_size_are_refused(pool: QueuePool, queue: str) -> None:
    with pytest.raises(ValueError, match="names shard 5, but this pool has 2"):
        pool.queues.ack(queue, [5 << SHARD_SHIFT | 1])


def test_missing_queue_everywhere_is_an_error(pool: QueuePool) -> None:
    with pytest.raises(RequestError, match="no queue named 'never-made' on any of the 2 servers"):
        pool.stats("never-made")
    with pytest.raises(RequestError, match="no queue named"):
        list(pool.queues.results("never-made"))


def test_join_times_out_with_a_count(pool: QueuePool, queue: str) -> None:
    pool.put(queue, msgs(3))
    with pytest.raises(TimeoutError, match="3 messages still pending"):
        pool.join(queue, timeout=0.3, progress=False)
    pool.purge(queue)


def test_join_hears_of_the_last_ack_at_once(pool: QueuePool, queue: str) -> None:
    pool.put(queue, msgs(150))  # on both shards
    got = []
    while batch := pool.queues.get(queue, 100, lease_s=30):
        got += batch
    pool.queues.ack(queue, [m.id for m in got[1:]])
    timer = threading.Timer(0.3, lambda: pool.queues.ack(queue, [got[0].id]))
    timer.start()
    t0 = time.monotonic()
    st = pool.join(queue, timeout=20, poll_s=15, progress=False)[queue]  # polling would take 15 s
    timer.join()
    assert time.monotonic() - t0 < 10 and (st.acked, st.pending) == (150, 0)


def test_join_draws_a_progress_bar_when_asked(pool: QueuePool, queue: str, capsys: pytest.CaptureFixture[str]) -> None:
    pool.put(queue, msgs(5))
    while got := pool.queues.get(queue, 5):
        pool.queues.ack(queue, [m.id for m in got])
    pool.join(queue, timeout=10, progress=True)
    assert "draining" in capsys.readouterr().err


def test_a_pool_pickles_as_its_addresses(pool: QueuePool) -> None:
    again = pickle.loads(pickle.dumps(pool))
    try:
        assert again.addresses == pool.addresses and again.servers is None  # its servers stay with the original
        assert again.queues.clients[0].ping()["pong"]
    finally:
        again.close()  # must not stop the servers of the original
    assert pool.queues.clients[0].ping()["pong"]


def test_local_pool_stops_its_servers_and_removes_temporary_data() -> None:
    p = QueuePool.local(n_servers=2)
    procs = p.servers.processes
    tmps = list(p.servers.temporary_dirs)
    assert len(tmps) == 2 and all(d.is_dir() for d in tmps)
    p.put("q", msgs(10))
    p.close()
    assert all(pr.returncode == 0 for pr in procs)  # SIGTERM: a clean stop
    assert not any(d.exists() for d in tmps)


def _free_ports(n: int) -> list[int]:
    """n distinct ports free a moment ago (all bound at once, so that none is picked twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def test_local_servers_listen_on_the_ports_given_and_a_taken_one_is_an_error() -> None:
    ports = _free_ports(2)
    with QueuePool.local(n_servers=2, ports=ports) as p:
        assert p.addresses == [f"tcp://127.0.0.1:{port}" for port in ports]
        assert len(p.put("q", msgs(4))) == 4
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConveyorError, match="exited with code 1 before listening"):
            QueuePool.local(n_servers=2, ports=[_free_ports(1)[0], taken.getsockname()[1]])
    for bad in ([ports[0]], [ports[0], ports[0]], [0, ports[1]], [ports[0], 70000], [True, ports[1]], "ab", 7071):
        with pytest.raises(ValueError, match="ports"):
            QueuePool.local(n_servers=2, ports=bad)


def test_sigterm_stops_cleanly_and_a_restart_serves_the_same_messages(tmp_path: Path) -> None:
    with QueuePool.local(n_servers=2, data_dir=tmp_path) as p:
        ids = p.put("q", msgs(500))
        got = p.queues.get("q", 50, lease_s=0.5)
        p.queues.ack("q", [m.id for m in got[:20]], [b"done"] * 20)
    with QueuePool.local(n_servers=2, data_dir=tmp_path) as p:
        st = p.stats("q")["q"]
        assert (st.acked, st.pending) == (20, 480)
        assert sorted(i for i, _ in p.queues.results("q")) == sorted(m.id for m in got[:20])
        left: set[int] = set()
        wait_for(lambda: left.update(m.id for m in p.queues.get("q", 1000, wait_s=0.2)) or len(left) == 480, what="all back")
        assert left == set(ids) - {m.id for m in got[:20]}


def test_serve_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    proc, _ = spawn_server(tmp_path / "d")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    stop_server(proc)  # what is left to do: close the pipe to its stdin


def test_spawn_reports_a_server_that_cannot_start(tmp_path: Path) -> None:
    proc, address = spawn_server(tmp_path / "d")
    try:
        port = int(address.rsplit(":", 1)[1])
        with pytest.raises(ConveyorError, match="exited with code"):
            spawn_server(tmp_path / "d2", port, stderr=subprocess.DEVNULL)  # the port is taken
        with pytest.raises(ConveyorError, match="exited with code"):
            spawn_server(tmp_path / "d", stderr=subprocess.DEVNULL)  # the data dir is in use
    finally:
        stop_server(proc)
    assert sys.executable


def test_idempotency_keys_hold_across_shards(pool: QueuePool, queue: str) -> None:
    from conveyor.constants import H_IDEMPOTENCY_KEY as KEY

    first = pool.put(queue, [Message(payload=b"%d" % i, headers={KEY: f"k{i}"}) for i in range(40)])
    again = pool.put(queue, [Message(payload=b"retry %d" % i, headers={KEY: f"k{i}"}) for i in range(40)])
    assert again == first and len({pool.queues.split_id(i)[0] for i in first}) == 2  # both shards used
    assert pool.queues.stored(queue, [f"k{i}" for i in range(39, -1, -1)] + ["unseen"]) == [*first[::-1], 0]
    assert pool.stats(queue)[queue].ready == 40
    pool.purge(queue)


# --- the pool's shape: a narrow surface over the sharded client it holds -------------------------
# What users of tasks call, and nothing else: a method added here is a decision (issue 39). Queue
# operations (get, ack, nack, extend_lease, release, report, blobs, ...) belong to `pool.queues`.
# `cancel` (a published task taken off its queue, as Celery's revoke) is the sixteenth.
POOL_METHODS = {
    "connect",
    "local",
    "put",
    "queue_config",
    "submit",
    "map",
    "gather",
    "task_status",
    "cancel",
    "join",
    "stats",
    "dead_letters",
    "requeue_dead_letters",
    "drop",
    "purge",
    "close",
}
POOL_ATTRIBUTES = {"queues", "servers", "attached", "addresses"}


def test_the_pool_constructor_is_explicit() -> None:
    kinds = {p.kind for p in inspect.signature(QueuePool).parameters.values()}
    assert not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}, inspect.signature(QueuePool)
    assert list(inspect.signature(QueuePool).parameters) == ["queues", "servers", "queue_configs"]


def test_the_pool_has_only_the_methods_users_of_tasks_call(pool: QueuePool) -> None:
    public = {name for name, value in inspect.getmembers(QueuePool) if not name.startswith("_") and callable(value)}
    assert public == POOL_METHODS and len(public) <= 16
    shown = {name for name in dir(pool) if not name.startswith("_")}
    assert shown == POOL_METHODS | POOL_ATTRIBUTES
    assert isinstance(pool.queues, ShardedQueues) and isinstance(pool.servers, LocalServers)
    assert pool.servers.addresses == pool.addresses == pool.queues.addresses


def test_no_pickle_round_trip_makes_a_copy_in_src() -> None:
    src = Path(__file__).resolve().parents[2] / "src" / "conveyor"
    found = [str(f) for f in src.rglob("*.py") if "pickle.loads(pickle.dumps(" in f.read_text()]
    assert found == [], "a copy on connections of its own is with_own_connections()"


def test_with_own_connections_gives_a_copy_that_shares_no_socket(pool: QueuePool, queue: str) -> None:
    """A long poll holds the original's connection to shard 0; the copy's requests there are answered meanwhile."""
    queues = pool.queues
    original = queues.clients[0]

    def held_up() -> bool:  # a request of another thread holds the original's connection
        if original._lock.acquire(blocking=False):
            original._lock.release()
            return False
        return True

    got: list[Message] = []
    poll = threading.Thread(target=lambda: got.extend(queues.get(queue, 1, wait_s=60, shards=[0])))
    poll.start()
    own = queues.with_own_connections()
    try:
        wait_for(held_up, what="the long poll on the original's connection")
        assert own.clients[0].ping()["pong"]  # not behind the poll
        assert held_up() and poll.is_alive()
        mine, theirs = own.clients[0]._sock, original._sock
        assert mine is not None and theirs is not None and mine.getsockname() != theirs.getsockname()
        own.clients[0].put(queue, [Message(payload=b"through the copy")])  # what the poll waits for
        poll.join(30)  # bounded: the poll ends with the message, or the test fails here
        assert not poll.is_alive() and [m.payload for m in got] == [b"through the copy"]
        queues.ack(queue, [m.id for m in got])
    finally:
        own.close()
        poll.join(60)
    assert original.ping()["pong"]  # closing the copy left the original's connection alone
