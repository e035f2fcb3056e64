"""A connection's patience (`connect_timeout`): how long a request waits for a server to accept it.

Against a port nobody listens on and a server that accepts nothing.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from conveyor.client.queue_client import QueueClient
from conveyor.errors import ConnectionLostError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def refused() -> str:
    """An address nobody listens on: each connect is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def deaf() -> Iterator[str]:
    """An address whose backlog is full: the kernel drops further connection requests unanswered.

    As a host that is down or behind a firewall does.
    """
    with socket.socket() as server, socket.socket() as first:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        first.connect(server.getsockname())  # fills the backlog: nothing accepts it
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"


def test_a_patience_of_0_makes_one_attempt(refused: str) -> None:
    """A patience of 0 makes one attempt per request, which says why it failed.

    The patience of an owner that retries on its own terms (a consumer, its settler).
    """
    c = QueueClient(refused, connect_timeout=0)
    t0 = time.monotonic()
    with pytest.raises(ConnectionLostError, match="Connection refused"):
        c.ping()
    assert time.monotonic() - t0 < 2.0
    assert c.unreachable_s() > 0  # counted as out of reach from this failure on


def test_a_server_that_accepts_nothing_holds_a_request_for_its_patience_not_its_timeout(deaf: str) -> None:
    """Each attempt to connect waits at most the patience left (not the 30 s a reply may take)."""
    c = QueueClient(deaf, connect_timeout=1.0, timeout=30.0)
    t0 = time.monotonic()
    with pytest.raises(ConnectionLostError, match="cannot connect"):
        c.ping()
    took = time.monotonic() - t0
    assert took < 10.0, f"the request waited {took:.1f} s"
