"""The public API and the declarations the protocol is made from.

The public API at the top of the package (its heavy parts loaded on first use: `conveyor.lazy`), and
the declarations both sides of the protocol are made from.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import conveyor
from conveyor.protocol import requests
from conveyor.protocol.declarations import OPERATIONS
from conveyor.server.handlers import HANDLERS


def test_the_public_names_resolve() -> None:
    for name in conveyor.__all__:
        assert getattr(conveyor, name) is not None, name
    from conveyor.client.pool import QueuePool
    from conveyor.errors import TaskFailedError
    from conveyor.graph import TaskGraph
    from conveyor.worker import ConsumerPool

    assert (conveyor.QueuePool, conveyor.ConsumerPool, conveyor.TaskFailedError, conveyor.TaskGraph) == (
        QueuePool,
        ConsumerPool,
        TaskFailedError,
        TaskGraph,
    )


def test_import_conveyor_stays_light() -> None:
    code = "import sys, conveyor; print(sorted(m for m in ('pyspark', 'pyarrow', 'pandas') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_names_are_attribute_errors() -> None:
    with warnings.catch_warnings(), pytest.raises(AttributeError, match="no attribute 'Nope'"):
        warnings.simplefilter("error")
        conveyor.Nope  # noqa: B018


def test_every_declared_operation_has_one_handler() -> None:
    assert set(HANDLERS) == set(OPERATIONS)
    assert all(HANDLERS[name][0] is op for name, op in OPERATIONS.items())


def test_requests_carry_only_declared_fields() -> None:
    from conveyor.message import Message
    from conveyor.protocol.task_pages import TaskState

    made = [
        requests.ping(),
        requests.declare("q", kind="durable", lease_s=5.0, max_attempts=3, fsync="batch"),
        requests.queues(),
        requests.put("q", [Message(payload=b"x", priority=2, not_before=1.0, max_attempts=4, headers={"k": "v"})]),
        requests.get("q", 5, lease_s=3.0, wait_s=1.0, tie=True, consumer="c"),
        requests.ack("q", [1, 2], [b"r", None]),
        requests.nack("q", [1], ["boom"], delay_s=2.0, final=True),
        requests.release("q", [1]),
        requests.result("q", [1]),
        requests.status("q", [1]),
        requests.report("w", {"processed": 1}),
        requests.workers(),
        requests.extend_lease("q", [1], 9.0),
        requests.stats(queues=["q"], drained_wait_s=1.0),
        requests.purge("q"),
        requests.cancel("q", [1]),
        requests.drop("q"),
        requests.results("q", 3, 10),
        requests.dead_letters("q", 3, 10),
        requests.forget("q", [1]),
        requests.stored("q", ["k"]),
        requests.put_blob(b"b"),
        requests.get_blob("0" * 64),
        requests.forget_blobs(["0" * 64]),
        requests.bye(),
        requests.wake(["q"]),
        requests.tasks("q", task="t", state=TaskState.ACKED, msg_id=1, limit=5),
        requests.task("q", 1),
    ]
    assert {c.op for c in made} == set(OPERATIONS)
    for c in made:
        declared = {f.key for f in OPERATIONS[c.op].request}
        assert set(c.args) <= declared, (c.op, set(c.args) - declared)


def test_a_value_equal_to_the_default_is_not_sent() -> None:
    assert requests.get("q", 1).args == {"queue": "q"}  # n=1 and wait_s=0 are the server's defaults
    assert requests.nack("q", [1]).args == {"queue": "q", "ids": [1]}
    assert requests.results("q").args == {"queue": "q"}


def test_a_handle_is_its_id_queue_and_task() -> None:
    import pickle

    from conveyor.tasks.publish import TaskHandle, default_pool, get_default_pool

    class Pool:  # not picklable: a handle never takes its pool along
        lock = __import__("threading").Lock()

    h = TaskHandle(7, "q", "t", Pool())  # type: ignore[arg-type]
    assert h == TaskHandle(7, "q", "t") and hash(h) == hash(TaskHandle(7, "q", "t"))
    assert repr(h) == "TaskHandle(id=7, queue='q', task='t')"
    again = pickle.loads(pickle.dumps(h))
    assert again == h and again.pool is None and isinstance(h.pool, Pool)
    a, b = object(), object()
    with default_pool(a):  # type: ignore[arg-type]
        with default_pool(b) as inner:  # type: ignore[arg-type]
            assert get_default_pool() is inner
        assert get_default_pool() is a
    blocks = [default_pool(a), default_pool(b)]  # type: ignore[arg-type]
    for blk in blocks:
        blk.__enter__()
    blocks[0].__exit__(None, None, None)  # the outer block ends first (another thread's, say)
    assert get_default_pool() is b
    blocks[1].__exit__(None, None, None)
    assert get_default_pool() is None
