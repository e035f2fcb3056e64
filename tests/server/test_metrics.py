"""A server's Prometheus metrics (`conveyor serve --metrics-port`), every value checked.

Scraped over real HTTP after a known workload and parsed with prometheus_client's own parser; every
value checked. Also the consumers' figures (from their reports), the token and TLS rules, and the
CLI.

The metrics are `conveyor.server.metrics`.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conveyor.client.pool import QueuePool
from conveyor.client.queue_client import QueueClient
from conveyor.constants import COUNT_SERVES, ERR_UNKNOWN_OP, H_TASK, REQUEST_SECONDS_BUCKETS, TASK_LABELS, TASK_SECONDS_BUCKETS
from conveyor.errors import ConveyorError
from conveyor.message import Message, Status
from conveyor.protocol.histograms import Histogram
from conveyor.protocol.http import MAX_HTTP_CONNECTIONS
from conveyor.protocol.tls import ClientTLS, self_signed, server_context
from conveyor.server.queue_server import QueueServer
from conveyor.worker import Consumer

from ..support import worker_tasks as wt
from ..support.servers import RawConnection, ThreadServer, frame, thread_server, wait_for

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str, token: str | None = None, context: ssl.SSLContext | None = None) -> Samples:
    """Every sample of the endpoint, by (name, labels)."""
    req = urllib.request.Request(url, headers={} if token is None else {"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10, context=context) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadServer]:
    with thread_server(data_dir=tmp_path / "data", metrics_port=0, sweep_interval_s=0.05) as s:
        yield s


def test_a_scrape_after_a_known_workload_shows_every_value(server: ThreadServer) -> None:
    assert server.server.metrics_address is not None
    c = QueueClient(server.address, timeout=10)
    c.declare("work", max_attempts=2)
    c.put("work", [Message(payload=b"p%d" % i) for i in range(10)])  # put 1
    c.put("work", [Message(payload=b"later", not_before=4e9)])  # put 2: delayed
    got = c.get("work", 4, lease_s=30)
    assert c.ack("work", [m.id for m in got[:2]], [b"r0", b"r1"]) == [True, True]
    assert c.nack("work", [got[2].id], ["retry me"]) == [True]  # back to ready: an attempt left
    assert c.nack("work", [got[3].id], ["no more"], final=True) == [True]  # a dead letter at once
    short = c.get("work", 1, lease_s=0.2)
    assert len(short) == 1
    wait_for(lambda: c.stats("work")["work"].delivered == 0, 10, "the short lease to expire")
    released = c.get("work", 2, lease_s=30)
    assert c.release("work", [m.id for m in released]) == [True, True]
    s = scrape(server.server.metrics_address)
    stats = c.stats("work")["work"]
    # 11 put; 4 + 1 + 2 = 7 deliveries; 2 acked; 2 nacked (one dead); 1 expired; 2 released
    for name, want in (
        ("put", 11),
        ("delivered", 7),
        ("acked", 2),
        ("nacked", 2),
        ("released", 2),
        ("expired", 1),
        ("dead_lettered", 1),
    ):
        assert value(s, f"conveyor_queue_{name}_total", queue="work") == want, name
    # as they stand: gauges; what ended so (acked, dead letters) is counted by the counters above
    states = {dict(lb)["state"]: v for (name, lb), v in s.items() if name == "conveyor_queue_messages"}
    assert states == {"ready": 7, "delivered": 0, "delayed": 1}
    assert (stats.ready, stats.delayed, stats.acked, stats.failed) == (7, 1, 2, 1)
    assert value(s, "conveyor_queue_disk_bytes", queue="work") == stats.bytes_on_disk > 0
    assert value(s, "conveyor_queue_consumers", queue="work") == 0  # none reports
    assert value(s, "conveyor_queues_unavailable") == 0
    assert value(s, "conveyor_server_connections") == 1
    # one histogram per operation used: the requests this client made, each counted once
    made = {"declare": 1, "put": 2, "get": 3, "ack": 1, "nack": 2, "release": 1}
    for op, n in made.items():
        assert value(s, "conveyor_request_duration_seconds_count", op=op) == n, op
        assert value(s, "conveyor_request_duration_seconds_bucket", op=op, le="+Inf") == n
        counts = [value(s, "conveyor_request_duration_seconds_bucket", op=op, le=repr(b)) for b in REQUEST_SECONDS_BUCKETS]
        assert counts == sorted(counts)  # cumulative
        assert 0 < value(s, "conveyor_request_duration_seconds_sum", op=op) < 10
    assert value(s, "conveyor_request_duration_seconds_count", op="stats") >= 1  # the wait's polls
    c.close()


def test_counters_only_grow_and_a_dropped_queue_leaves_the_scrape(server: ThreadServer) -> None:
    c = QueueClient(server.address, timeout=10)
    c.put("a", [Message(payload=b"x")] * 3)
    c.put("map-job1", [Message(payload=b"y", headers={H_TASK: "row"})])  # a map job's queue, its task run
    c.ack("map-job1", [m.id for m in c.get("map-job1", 1, consumer="c")])
    url = server.server.metrics_address
    assert url is not None
    first = scrape(url)
    assert value(first, "conveyor_queue_put_total", queue="a") == 3
    assert any(dict(lb).get("queue") == "map-job1" for _, lb in first)
    c.put("a", [Message(payload=b"x")] * 2)
    assert value(scrape(url), "conveyor_queue_put_total", queue="a") == 5
    assert c.drop("map-job1")
    assert not [(name, lb) for name, lb in scrape(url) if dict(lb).get("queue") == "map-job1"]  # none of its series left
    c.close()


def test_each_family_is_typed_for_what_it_counts(server: ThreadServer) -> None:
    """A `_total` is a counter and a counter is a `_total`; what stands now is a gauge."""
    c = QueueClient(server.address, timeout=10)
    c.put("q", [Message(payload=b"x", headers={H_TASK: "t"})] * 2)
    c.ack("q", [c.get("q", 1, consumer="c")[0].id])
    c.report("c", {"processed": 1})
    with urllib.request.urlopen(server.server.metrics_address or "", timeout=10) as r:
        text = r.read().decode()
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE "))
    for name, kind in types.items():
        assert (kind == "counter") == name.endswith("_total"), (name, kind)
    for name in ("conveyor_queue_acked_total", "conveyor_queue_dead_lettered_total", "conveyor_task_runs_total"):
        assert types[name] == "counter", name
    for name in ("conveyor_queue_messages", "conveyor_queue_consumers", "conveyor_consumer_running"):
        assert types[name] == "gauge", name
    assert types["conveyor_task_duration_seconds"] == "histogram"
    c.close()


def test_each_queue_consumer_task_name_and_operation_adds_the_series_the_docs_say(server: ThreadServer) -> None:
    docs = " ".join((ROOT / "docs" / "metrics.md").read_text().split())  # as words, however the lines wrap
    c = QueueClient(server.address, timeout=10)
    c.declare("first")
    c.ack("first", [])  # each operation this test uses has been asked once already
    c.report("c-0", {"processed": 0, **Histogram(TASK_SECONDS_BUCKETS).as_counts()})
    url = server.server.metrics_address or ""
    n = len(scrape(url))
    c.declare("second")
    assert len(scrape(url)) - n == 12 and "Each queue adds 12 series" in docs
    n = len(scrape(url))
    c.report("c-1", {"processed": 3, **Histogram(TASK_SECONDS_BUCKETS).as_counts()})
    assert len(scrape(url)) - n == 23 and "each consumer 23" in docs
    n = len(scrape(url))
    c.put("first", [Message(payload=b"x", headers={H_TASK: "t"})])
    c.ack("first", [c.get("first", 1, consumer="c")[0].id])
    assert len(scrape(url)) - n == 20 + 2 * 21 and "each task name with a label of its own 20" in docs  # and put, get
    assert "at most 11 of those" in docs and TASK_LABELS + 1 == 11
    assert "each operation that was requested 21" in docs
    c.close()


def test_the_task_label_names_the_most_run_tasks_and_the_rest_as_other(tmp_path: Path) -> None:
    """At most `task_labels` task names get a label of their own (the most run); the others count as `other`.

    A name that runs more than a labelled one takes its label at the next scrape; no counter goes
    down for it.
    """
    with thread_server(metrics_port=0, task_labels=2) as s:
        c = QueueClient(s.address, timeout=10)
        url = s.server.metrics_address or ""

        def run(task: str, n: int, fail: int = 0) -> None:
            c.put("q", [Message(payload=b"x", headers={H_TASK: task})] * n)
            got = c.get("q", n, consumer="c")
            c.ack("q", [m.id for m in got[fail:]])
            c.nack("q", [m.id for m in got[:fail]], ["boom"] * fail, final=True)  # no retry to run later

        def runs(samples: Samples) -> dict[tuple[str, str], float]:
            return {
                (dict(lb)["task"], dict(lb)["state"]): v
                for (name, lb), v in samples.items()
                if name == "conveyor_task_runs_total"
            }

        run("a", 5, fail=1)
        run("b", 3)
        run("c", 1)
        first = scrape(url)
        got = runs(first)
        assert {t for t, _ in got} == {"a", "b", "other"}
        assert (got["a", "acked"], got["a", "failed"], got["b", "acked"], got["other", "acked"]) == (4, 1, 3, 1)
        assert got["a", "retried"] == got["a", "expired"] == got["a", "dead-lettered"] == 0
        assert value(first, "conveyor_task_duration_seconds_count", task="a") == 5  # acked and failed runs are timed
        run("c", 10)  # now c runs more than b: it takes b's label
        second = runs(scrape(url))
        assert {t for t, _ in second} == {"a", "c", "other"}
        assert second["c", "acked"] == 11  # its count since the server started
        # c's runs before this scrape counted as other's (c had no label then); b's past runs stay out of it
        assert second["other", "acked"] == got["other", "acked"] + 10
        run("b", 2)
        run("z", 1)
        third = runs(scrape(url))
        assert third["other", "acked"] == second["other", "acked"] + 3  # b's and z's new runs
        assert len({t for t, _ in third}) == 3
        c.close()


def test_unknown_operations_make_no_labels(server: ThreadServer) -> None:
    """A client can send any op name; only declared operations become label values."""
    raw = RawConnection(server.address)
    raw.send(frame({"op": "ping", "id": 1}) + frame({"op": "no_such_op", "id": 2}))
    assert "error" not in raw.read() and raw.read()["error"] == ERR_UNKNOWN_OP
    raw.close()
    s = scrape(server.server.metrics_address or "")
    ops = {dict(labels)["op"] for name, labels in s if name == "conveyor_request_duration_seconds_count"}
    assert ops == {"ping"}


def test_the_consumers_figures_come_from_their_reports_and_leave_with_them(server: ThreadServer) -> None:
    url = server.server.metrics_address or ""

    def reported() -> Samples | None:
        s = scrape(url)
        keys = [labels for name, labels in s if name == "conveyor_consumer_processed_total"]
        done = keys and value(s, "conveyor_consumer_processed_total", **dict(next(iter(keys)))) == 33
        return s if done and value(s, "conveyor_consumer_failed_total", **dict(next(iter(keys)))) == 3 else None

    with QueuePool.connect([server.address]) as pool:
        handles = wt.sleeps.publish_many([(0.002,)] * 30 + [(0.2,)] * 3, _pool=pool)
        failing = wt.always_fails.publish("/dev/null", _pool=pool)  # fails 3 times (max_retries=2): a dead letter
        c = Consumer(pool.queues, ["jobs"], concurrency=4, task_modules=["tests.support.worker_tasks"], name="c-1")
        running = threading.Thread(target=c.run)
        running.start()
        try:
            assert len(pool.gather(handles)) == 33
            wait_for(lambda: pool.queues.status("jobs", [failing.id]) == [Status.FAILED], 20, "the failing task's end")
            s = wait_for(reported, 10, "the consumer's report of all its tasks")
        finally:
            c.stop()
            running.join(30)
    # its last report, sent before run() returned, said it stops: its series are gone at once, not
    # WORKER_GONE_S later, and it serves the queue no more
    left = scrape(url)
    assert not [name for name, _ in left if name.startswith("conveyor_consumer_")]
    assert value(left, "conveyor_queue_consumers", queue="jobs") == 0
    (labels,) = [dict(lb) for name, lb in s if name == "conveyor_consumer_processed_total"]
    assert labels["consumer"] == "c-1" and labels["host"]
    assert value(s, "conveyor_consumer_failed_total", **labels) == 3 == c.stats.failed
    assert value(s, "conveyor_consumer_running", **labels) == 0
    assert 0 <= value(s, "conveyor_consumer_last_report_age_seconds", **labels) < 10
    assert value(s, "conveyor_queue_consumers", queue="jobs") == 1  # the queue it serves
    # 36 runs: 30 of 2 ms, 3 of 0.2 s (never under 0.1 s), 3 failures of about nothing
    assert value(s, "conveyor_consumer_task_duration_seconds_count", **labels) == 36
    assert value(s, "conveyor_consumer_task_duration_seconds_bucket", le="+Inf", **labels) == 36
    assert 0 < value(s, "conveyor_consumer_task_duration_seconds_bucket", le="0.1", **labels) <= 33
    assert value(s, "conveyor_consumer_task_duration_seconds_sum", **labels) >= 0.6


def test_a_report_histogram_reads_back_and_bad_ones_are_left_out() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    assert h.cumulative() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    back = Histogram.from_counts(h.as_counts(), (0.1, 1.0))
    assert back is not None and (back.bounds, back.counts, back.sum) == ((0.1, 1.0), [2, 1, 1], 3.65)
    assert Histogram.from_counts(h.as_counts()) is None  # not the bounds consumers use: no labels of its own
    good = h.as_counts()
    for bad in (
        {},
        {k: v for k, v in good.items() if k != "task_seconds_le_inf"},
        {**good, "task_seconds_le_0.1": -1},
        {**good, "task_seconds_le_0.1": 1.5},
        {**good, "task_seconds_sum": "x"},
    ):
        assert Histogram.from_counts(bad, (0.1, 1.0)) is None, bad
    with pytest.raises(ValueError, match="ascending"):
        Histogram((1.0, 0.5))


def test_the_consumers_serving_a_queue_are_counted_per_hosted_queue_only(server: ThreadServer) -> None:
    """Who serves what, from the reports, as one series per queue the server hosts.

    Consumers on queues it does not host, however many, add no series (nor does a consumer, per
    queue).
    """
    c = QueueClient(server.address, timeout=10)
    c.declare("hosted")
    c.declare("idle")
    c.report("a", {COUNT_SERVES + "hosted": 1, **{COUNT_SERVES + f"elsewhere-{i}": 1 for i in range(200)}})
    c.report("b", {COUNT_SERVES + "hosted": 1})
    s = scrape(server.server.metrics_address or "")
    assert {dict(lb)["queue"]: v for (name, lb), v in s.items() if name == "conveyor_queue_consumers"} == {"hosted": 2, "idle": 0}
    assert not [lb for name, lb in s if name.startswith("conveyor_consumer_") and "queue" in dict(lb)]
    c.close()


def test_a_bad_report_histogram_drops_only_itself(server: ThreadServer) -> None:
    c = QueueClient(server.address, timeout=10)
    c.report("odd", {"processed": 5, "task_seconds_le_zz": 1, "task_seconds_le_inf": 2, "task_seconds_sum": 1.0})
    s = scrape(server.server.metrics_address or "")
    assert value(s, "conveyor_consumer_processed_total", consumer="odd", host="") == 5
    assert not any(name.startswith("conveyor_consumer_task_duration") for name, _ in s)
    c.close()


def test_with_a_token_a_scrape_needs_it_as_a_bearer_token() -> None:
    with thread_server(metrics_port=0, token="s3cret") as s:
        url = s.server.metrics_address or ""
        for header in (None, "Bearer wrong", "Basic czNjcmV0", "Bearer"):
            req = urllib.request.Request(url, headers={} if header is None else {"Authorization": header})
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            e.value.close()
            assert e.value.code == 401 and "Bearer" in e.value.headers["WWW-Authenticate"]
        assert value(scrape(url, "s3cret"), "conveyor_server_connections") == 0
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=10)
        e.value.close()
        assert e.value.code == 404


def test_a_token_off_loopback_without_tls_is_refused_for_the_metrics() -> None:
    """Each scrape sends the token as is: over a network, only inside TLS."""
    with pytest.raises(ConveyorError, match="without TLS: each scrape would send the token in clear"):
        QueueServer("0.0.0.0", 0, token="s3cret", metrics_port=0)
    QueueServer("0.0.0.0", 0, token="s3cret")  # the protocol itself never sends the token: allowed, as before


def test_with_tls_the_metrics_are_served_over_https(tmp_path: Path) -> None:
    cert, key, fp = self_signed(tmp_path / "server", ["127.0.0.1"])
    with thread_server(metrics_port=0, token="t0k", tls=server_context(cert, key)) as s:
        url = s.server.metrics_address or ""
        assert url.startswith("https://127.0.0.1:")
        ctx = ssl.create_default_context(cafile=str(cert))
        with QueueClient(s.address, token="t0k", tls=ClientTLS.make(fingerprint=fp)) as c:
            c.put("q", [Message(payload=b"x")])
        assert value(scrape(url, "t0k", ctx), "conveyor_queue_put_total", queue="q") == 1
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP to the TLS port
            urllib.request.urlopen(url.replace("https", "http"), timeout=10)


def test_metrics_are_off_by_default_and_a_taken_port_fails_the_start() -> None:
    with thread_server() as s:
        assert s.server.metrics_address is None
        with thread_server(metrics_port=0) as m:
            port = int((m.server.metrics_address or "").rsplit(":", 1)[1].split("/")[0])
            with pytest.raises(OSError):
                ThreadServer(metrics_port=port)


def test_conveyor_serve_prints_where_its_metrics_are(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "serve", "--port", "0", "--metrics-port", "0", "--stop-with-parent"],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline().split(), proc.stdout.readline().split()
        assert first[:2] == ["listening", "on"] and second[:2] == ["metrics", "on"]
        url = second[2]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        assert value(scrape(url), "conveyor_queues_unavailable") == 0
    finally:
        proc.terminate()
        proc.wait(10)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.stdout.close()


def test_http_connections_over_the_limit_are_closed_and_the_rest_served(server: ThreadServer) -> None:
    """Idle connections cannot use up the server's descriptors.

    Past MAX_HTTP_CONNECTIONS, each new one is closed at once; once some go, scrapes are served
    again.
    """
    url = server.server.metrics_address or ""
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])
    idle = [socket.create_connection((host, port), timeout=10) for _ in range(MAX_HTTP_CONNECTIONS)]
    try:

        def refused() -> bool:
            with socket.create_connection((host, port), timeout=10) as extra:
                extra.settimeout(1.0)
                try:
                    return extra.recv(1) == b""  # closed by the server, nothing said
                except ConnectionResetError:  # closed by the server, harder
                    return True
                except TimeoutError:  # the server is still taking in the idle ones
                    return False

        wait_for(refused, 10, "a connection over the limit closed")
    finally:
        for s in idle[:8]:
            s.close()
    try:
        assert value(wait_for(lambda: _scrape_or_none(url), 10, "a scrape served again"), "conveyor_queues_unavailable") == 0
    finally:
        for s in idle[8:]:
            s.close()


def _scrape_or_none(url: str) -> Samples | None:
    try:
        return scrape(url)
    except (urllib.error.URLError, ConnectionError):
        return None
