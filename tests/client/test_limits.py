"""Limits instead of failures.

Requests split to fit the server, replies that fit the client, one bad task that never hurts its
neighbours, and exception objects that cannot be formatted.

What a reply may hold is `conveyor.server.replies`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conveyor.client.pool import QueuePool
from conveyor.client.queue_client import QueueClient
from conveyor.constants import ERR_TOO_LARGE
from conveyor.errors import RequestError, TaskFailedError
from conveyor.message import Message, Status
from conveyor.protocol.framing import Limits
from conveyor.worker import Consumer

from ..support import worker_tasks as wt
from ..support.servers import thread_server

MODULES = ["tests.support.worker_tasks"]
MB = 1_000_000


@pytest.fixture
def pool() -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=2) as p:
        yield p


def test_a_result_over_the_limit_fails_its_task_alone_and_acks_are_split_to_fit() -> None:
    # servers that take 1 MB per frame and 1.5 MB per request: a batch of acks of 0.3 MB results must be split
    limits = Limits(max_frame_bytes=MB, max_message_bytes=3 * MB // 2)
    with thread_server(limits=limits) as a, thread_server(limits=limits) as b, QueuePool.connect([a.address, b.address]) as pool:
        good = wt.returns_bytes.publish_many([(3 * MB // 10,)] * 40, _pool=pool)
        (big,) = wt.returns_bytes.publish_many([(2 * MB,)], _pool=pool)
        c = Consumer(pool.queues, ["jobs"], concurrency=8, until_empty=True, task_modules=MODULES)
        c.run()
        assert pool.gather(good) == [b"r" * (3 * MB // 10)] * 40
        with pytest.raises(TaskFailedError) as e:
            pool.gather([big])
        assert "ResultTooLarge: the result is 2,000,0" in e.value.error
        assert "over the server's limit of 1,000,000" in e.value.error
        s = c.stats
        assert (s.processed, s.failed, s.dead, s.retried, s.unsettled) == (40, 1, 1, 0, 0), s.summary()
        assert pool.stats("jobs")["jobs"].acked == 40


def test_a_put_is_split_to_fit_the_server_and_a_message_too_big_for_it_is_refused_before_sending() -> None:
    with thread_server(limits=Limits(max_frame_bytes=MB, max_message_bytes=2 * MB)) as s, QueueClient(s.address) as c:
        msgs = [Message(payload=bytes([i]) * (MB // 2)) for i in range(9)]  # 4.5 MB: three requests at least
        ids = c.put("q", msgs)
        assert [m.payload for m in c.get("q", 100)] == [m.payload for m in msgs] and len(set(ids)) == 9
        with pytest.raises(ValueError, match="message 1 does not fit in a request: 1,000,001 bytes"):
            c.put("q", [Message(payload=b"x"), Message(payload=b"x" * (MB + 1))])
        assert c.stats("q")["q"].ready == 0  # nothing of the refused put was sent


def test_replies_stop_at_what_the_client_takes() -> None:
    """A client with small frame and reply limits gets big messages and results a few at a time.

    A client that takes 2 MB per frame and 3 MB per reply gets big messages, results and dead
    letters a few at a time; none is lost to the transport, none dead-lettered unprocessed.
    """
    small = Limits(max_frame_bytes=2 * MB, max_message_bytes=3 * MB)
    with thread_server() as s, QueueClient(s.address) as c, QueueClient(s.address, limits=small) as little:
        payloads = [bytes([i]) * MB for i in range(12)]
        ids = c.put("q", [Message(payload=p, max_attempts=1) for p in payloads])
        got = []
        while len(got) < 12:
            part = little.get("q", 40, lease_s=60)
            assert 1 <= len(part) <= 3
            got += part
        assert [m.payload for m in got] == payloads
        assert little.ack("q", ids[:6], payloads[:6]) == [True] * 6
        assert little.result("q", ids[:6]) == payloads[:6]  # asked again for what did not fit
        assert list(little.iter_results("q", page=1000)) == list(zip(ids[:6], payloads[:6], strict=True))
        assert little.nack("q", ids[6:], ["bad"] * 6) == [True] * 6  # one attempt each: dead letters
        pages = []
        after = 0
        while page := little.dead_letters("q", after):
            pages.append(len(page))
            after = page[-1].message.id
        assert sum(pages) == 6 and max(pages) <= 3
        # a message no reply to this client can hold: a clear error, and it stays queued for another
        (huge,) = c.put("q", [Message(payload=b"h" * (5 * MB // 2))])
        with pytest.raises(RequestError) as e:
            little.get("q", 10)
        assert e.value.kind == ERR_TOO_LARGE and "of 2,500,000 bytes (and 0 of headers) does not fit in a reply" in str(e.value)
        assert c.status("q", [huge]) == [Status.READY]
        assert [m.id for m in c.get("q", 10)] == [huge]


def test_a_get_of_a_million_stops_at_a_page() -> None:
    with thread_server() as s, QueueClient(s.address) as c:
        c.put("q", [Message(payload=b"p" * 1000) for _ in range(40_000)])  # 40 MB
        got = c.get("q", 1_000_000)
        assert 10_000 < len(got) < 20_000  # about 16 MiB of it


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_exceptions_that_cannot_be_formatted_are_settled_and_the_rest_runs(pool: QueuePool, mode: str) -> None:
    """A task whose exception cannot be formatted, or that raises SystemExit, fails with what can be said.

    One slot, with the bad tasks first: a task whose exception cannot say what it is, or that raises
    SystemExit, fails with what can be said; the 40 tasks behind it run, and the consumer ends.
    """
    bad = wt.raises_unprintable.publish(_pool=pool)
    exits = wt.exits.publish(3, _pool=pool)
    good = wt.add.publish_many([(i, 1) for i in range(40)], _pool=pool)
    c = Consumer(pool.queues, ["jobs"], concurrency=1, until_empty=True, pool=mode, task_modules=MODULES)  # type: ignore[arg-type]
    c.run()
    assert pool.gather(good) == [i + 1 for i in range(40)]
    with pytest.raises(TaskFailedError) as e:
        pool.gather([bad])
    assert e.value.error.startswith(
        "tests.support.worker_tasks.Unprintable: <the message of this tests.support.worker_tasks.Unprintable"
    )
    with pytest.raises(TaskFailedError, match="SystemExit: 3"):
        pool.gather([exits])
    assert (c.stats.processed, c.stats.failed) == (40, 2)
