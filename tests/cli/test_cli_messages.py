"""The commands about messages, against real servers and a real worker: call, cancel, purge, and ids as shard:n.

`conveyor call` is `conveyor.cli.call`, `conveyor cancel` `conveyor.cli.cancel`, `conveyor purge`
`conveyor.cli.purge`; the ids they print and take go through `conveyor.cli.message_ids`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.client.pool import QueuePool
from conveyor.client.sharded import format_id, parse_id
from conveyor.constants import CANCELLED_ERROR
from conveyor.message import Message, Status

from ..support.servers import wait_for

ROOT = Path(__file__).resolve().parents[2]
SHARD_ID = re.compile(r"\d+:\d+")


def conveyor(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`conveyor ARGS`, from the repository's directory (where `tests.support.worker_tasks` imports)."""
    kw.setdefault("cwd", ROOT)
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args], capture_output=True, text=True, timeout=kw.pop("timeout", 120), env=env, **kw
    )


@pytest.fixture
def pool() -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=2, batch_size=2) as p:  # puts of more than 2 messages reach both shards
        yield p


@pytest.fixture
def worker(pool: QueuePool) -> Iterator[subprocess.Popen[str]]:
    """A worker on queue 'jobs' with the tasks of tests.support.worker_tasks, until the test ends."""
    args = ["worker", "--connect", ",".join(pool.addresses), "--tasks", "tests.support.worker_tasks", "-Q", "jobs", "-c", "2"]
    env = {**os.environ, "CONVEYOR_CALL_TEST": "seen by the worker"}
    proc = subprocess.Popen([sys.executable, "-m", "conveyor", *args], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    yield proc
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_call_publishes_by_name_and_wait_prints_what_a_real_worker_returned(
    pool: QueuePool, worker: subprocess.Popen[str]
) -> None:
    connect = ["--connect", ",".join(pool.addresses), "-Q", "jobs", "--wait", "--timeout", "60"]
    out = conveyor("call", *connect, "tests.support.worker_tasks.add", "2", "3")
    assert out.returncode == 0, out.stderr
    msg_id, result = out.stdout.splitlines()
    assert SHARD_ID.fullmatch(msg_id) and result == "5"
    assert pool.queues.status("jobs", [parse_id(msg_id)]) == [Status.ACKED]
    out = conveyor("call", *connect, "tests.support.worker_tasks.add", "--kwargs", '{"a": 1.5, "b": 2}')
    assert out.returncode == 0 and out.stdout.splitlines()[1] == "3.5", out.stderr
    out = conveyor("call", *connect, "tests.support.worker_tasks.env_of_worker", "CONVEYOR_CALL_TEST")  # not JSON: the text
    assert out.returncode == 0 and out.stdout.splitlines()[1] == '"seen by the worker"', out.stderr
    out = conveyor("call", *connect, "tests.support.worker_tasks.fails_for_good")
    assert out.returncode == 1 and SHARD_ID.fullmatch(out.stdout.strip()), out.stderr
    assert out.stderr.startswith(f"{out.stdout.strip()} failed: tests.support.worker_tasks.Unfixable: no retry can mend this")
    out = conveyor("call", *connect, "no.such.task", "1")  # what the worker does with a name it does not know
    assert out.returncode == 1, out.stderr
    assert "unknown task 'no.such.task'" in out.stderr and "conveyor worker --tasks MODULE" in out.stderr
    [dead] = [d for d in pool.dead_letters("jobs") if format_id(d.message.id) == out.stdout.strip()]
    assert dead.message.attempts == 1  # dead-lettered at once: no retry can mend it


def test_call_wait_gives_up_after_its_timeout_and_leaves_the_task_queued(pool: QueuePool) -> None:
    started = time.monotonic()
    out = conveyor("call", "--connect", ",".join(pool.addresses), "-Q", "idle", "t.nobody", "--wait", "--timeout", "0.5")
    assert out.returncode == 124 and f"{out.stdout.strip()}: no result within 0.5 s" in out.stderr
    assert time.monotonic() - started < 60 and pool.stats("idle")["idle"].ready == 1


def test_call_with_a_countdown_is_delayed_and_cancel_makes_it_a_requeueable_dead_letter(pool: QueuePool) -> None:
    connect = ["--connect", ",".join(pool.addresses)]
    out = conveyor(
        "call", *connect, "-Q", "later", "--countdown", "600", "--priority", "3", "t.later", '{"k": [1, "x"]}', "plain"
    )
    assert out.returncode == 0, out.stderr
    msg_id = out.stdout.strip()
    assert pool.stats("later")["later"].delayed == 1
    out = conveyor("cancel", *connect, "-Q", "later", msg_id)
    assert out.returncode == 0 and out.stdout == f"{msg_id}: cancelled\n", out.stderr
    [dead] = pool.dead_letters("later")
    assert format_id(dead.message.id) == msg_id and dead.error == CANCELLED_ERROR and dead.message.priority == 3
    out = conveyor("dead-letters", *connect, "-Q", "later")
    row = next(line for line in out.stdout.splitlines() if msg_id in line)
    assert CANCELLED_ERROR in row and "t.later" in row
    out = conveyor("dead-letters", *connect, "-Q", "later", "--requeue", "--yes", msg_id)
    assert out.returncode == 0 and out.stdout == "later: requeued 1 dead letter(s)\n", out.stderr
    st = pool.stats("later")["later"]
    assert st.delayed + st.ready == 1 and pool.dead_letters("later") == []  # a new message: its old id stays failed


def test_cancel_cancels_ready_and_delayed_messages_and_says_why_not_for_the_others(pool: QueuePool) -> None:
    ids = pool.put("q", [Message(payload=b"m%d" % i) for i in range(4)])
    [late] = pool.put("q", [Message(payload=b"late", not_before=time.time() + 600)])
    [running] = pool.queues.get("q", 1, lease_s=60)
    [done] = pool.queues.get("q", 1, lease_s=60)
    pool.queues.ack("q", [done.id])
    ready = [i for i in ids if i not in (running.id, done.id)]
    assert {pool.queues.split_id(i)[0] for i in ids} == {0, 1}
    unknown = pool.queues.global_id(1, 999)
    given = [format_id(ready[0]), str(ready[1]), format_id(late), format_id(running.id), format_id(done.id), format_id(unknown)]
    out = conveyor("cancel", "--connect", ",".join(pool.addresses), "-Q", "q", *given)
    assert out.returncode == 1, out.stderr  # not every id was cancelled
    assert out.stdout.splitlines() == [
        f"{format_id(ready[0])}: cancelled",
        f"{format_id(ready[1])}: cancelled",  # given as the integer, shown as shard:n
        f"{format_id(late)}: cancelled",
        f"{format_id(running.id)}: delivered to a consumer (running, or about to): not cancelled",
        f"{format_id(done.id)}: finished already: not cancelled",
        f"{format_id(unknown)}: no such message in this queue: not cancelled",
    ]
    assert pool.queues.status("q", [*ready, late, running.id]) == [Status.FAILED] * 3 + [Status.DELIVERED]
    assert pool.queues.ack("q", [running.id]) == [True]  # its task went on: its ack counts
    out = conveyor("cancel", "--connect", ",".join(pool.addresses), "-Q", "q", format_id(ready[0]))
    assert out.returncode == 1 and out.stdout.strip().endswith("a dead letter already: not cancelled")
    assert pool.stats("q")["q"].pending == 0


def test_cancel_and_call_refuse_bad_input_and_change_nothing(pool: QueuePool) -> None:
    connect = ["--connect", ",".join(pool.addresses)]
    [i] = pool.put("q", [Message(payload=b"x")])
    for args, said in [
        (["cancel", *connect, "-Q", "q", "0:x"], "'0:x' is not a message id: give shard:n"),
        (["cancel", *connect, "-Q", "q", "7:1"], "names shard 7, but this pool has 2"),
        (["cancel", *connect, "-Q", "q"], "Missing argument 'IDS...'"),
        (["cancel", *connect, format_id(i)], "Missing option '-Q' / '--queue'"),
        (["call", *connect, "t.x", "--kwargs", "{not json"], "not JSON"),
        (["call", *connect, "t.x", "--kwargs", "[1, 2]"], "a JSON object of argument names to values"),
        (["call", *connect, "t.x", "--countdown", "-1"], "--countdown"),
        (["call", *connect, "t.x", "--priority", "x"], "--priority"),
        (["dead-letters", *connect, "-Q", "q", format_id(i)], "give --requeue with them"),
    ]:
        out = conveyor(*args, timeout=60)
        assert out.returncode == 2 and said in out.stderr, (args, out.stderr)
    out = conveyor("cancel", *connect, "-Q", "nope", format_id(i))
    assert out.returncode == 1 and "no queue named 'nope'" in out.stderr
    assert pool.stats() == {"q": pool.stats()["q"]} and pool.stats("q")["q"].ready == 1


def test_purge_asks_then_drops_what_waits_and_says_how_many(pool: QueuePool) -> None:
    connect = ["--connect", ",".join(pool.addresses)]
    pool.put("jobs", [Message(payload=b"m%d" % i) for i in range(5)])
    pool.put("jobs", [Message(payload=b"late", not_before=time.time() + 600)])
    [running] = pool.queues.get("jobs", 1, lease_s=60)
    out = conveyor("purge", *connect, "jobs", input="n\n")
    assert out.returncode == 1 and "Drop every message waiting in jobs?" in out.stderr and "Aborted" in out.stderr
    assert pool.stats("jobs")["jobs"].pending == 6  # asked first; kept
    out = conveyor("purge", *connect, "jobs", "nope", "--yes")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["jobs: purged 5 message(s)", "nope: no such queue"]
    st = pool.stats("jobs")["jobs"]
    assert (st.ready, st.delayed, st.delivered) == (0, 0, 1)  # the delivered one is left to its consumer
    assert pool.queues.ack("jobs", [running.id]) == [True]
    wait_for(lambda: pool.stats("jobs")["jobs"].pending == 0, what="the queue drained")
