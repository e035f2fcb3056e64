"""A queue server's Prometheus metrics and the HTTP endpoint that serves them.

A queue server's Prometheus metrics (`conveyor serve --metrics-port`): what they are, read from
the server's own state at each scrape, and the HTTP endpoint that serves them.

The endpoint runs on the server's event loop (aiohttp), so a scrape reads the queues between two
requests, never during one. It follows the server's rules: its host (loopback unless told
otherwise), its TLS, and its token, which a scrape sends as a bearer token. The names follow
Prometheus's conventions; docs/metrics.md lists them.
"""

from __future__ import annotations

import ssl
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from conveyor.constants import METRICS_PATH, REQUEST_SECONDS_BUCKETS
from conveyor.protocol.histograms import Histogram
from conveyor.protocol.http import HttpService, bearer_ok, serve_app
from conveyor.protocol.report import FIGURES, ConsumerReport, Counts, Shown, has_ended, queues_served
from conveyor.protocol.throttle import Throttle
from conveyor.server.budget import MemoryBudget
from conveyor.server.queues import QueueHost
from conveyor.server.task_tallies import COUNTED

if TYPE_CHECKING:
    from aiohttp import web
    from prometheus_client.core import Metric

# prometheus_client and aiohttp are imported where used: only a server with metrics pays for them

# the counters of each queue: Store.totals field, help text
QUEUE_TOTALS = (
    ("put", "Messages put (an idempotent put's repeats not counted)."),
    ("delivered", "Deliveries: each counts an attempt of its message."),
    ("acked", "Messages acked (finished, with their result)."),
    ("nacked", "Nacks taken: the message went back to ready, or to the dead letters."),
    ("released", "Deliveries given back unstarted (by a consumer, a client, or a reply too big): no attempt counted."),
    ("expired", "Leases that ran out, or ended with their consumer's connection."),
    ("dead_lettered", "Messages that became dead letters (out of attempts, or failed for good)."),
)


class RequestTimes:
    """Per declared operation, a histogram of its requests' time in the server."""

    def __init__(self) -> None:
        self.by_op: dict[str, Histogram] = {}

    def observe(self, op: str, seconds: float) -> None:
        h = self.by_op.get(op)
        if h is None:
            h = self.by_op[op] = Histogram(REQUEST_SECONDS_BUCKETS)
        h.observe(seconds)


class ServerCollector:
    """The metric families of one server, built afresh at each scrape.

    The metric families of one server, built afresh at each scrape from `host()` (None: not
    started), its request times, `connections()` (how many clients are connected) and its memory
    budget.
    """

    def __init__(
        self, host: Callable[[], QueueHost | None], times: RequestTimes, connections: Callable[[], int], memory: MemoryBudget
    ) -> None:
        self._host, self._times, self._connections, self._memory = host, times, connections, memory

    def describe(self) -> Iterable[Metric]:
        return []  # nothing to check at registration: the families depend on what is hosted then

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

        host = self._host()
        if host is None:
            return
        yield from _queues(host)
        requests = HistogramMetricFamily(
            "conveyor_request_duration_seconds",
            "Time a request took in the server, from read to reply (a get's wait included).",
            labels=["op"],
        )
        for op, h in sorted(self._times.by_op.items()):
            requests.add_metric([op], h.cumulative(), h.sum)
        yield requests
        yield GaugeMetricFamily("conveyor_server_connections", "Client connections open.", value=self._connections())
        memory = self._memory
        yield GaugeMetricFamily(
            "conveyor_server_memory_held_bytes",
            "Bytes held for requests and unsent replies beyond each connection's first MiB (what the memory budget bounds).",
            value=memory.used,
        )
        yield GaugeMetricFamily(
            "conveyor_server_memory_budget_bytes", "The memory budget (--memory-budget-mib).", value=memory.limit
        )
        yield GaugeMetricFamily(
            "conveyor_server_memory_waiting",
            "Requests and replies waiting for room in the memory budget, or for their clients to take earlier replies.",
            value=memory.waiting,
        )
        yield from _consumers(host)
        yield from _tasks(host)


def _queues(host: QueueHost) -> Iterable[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    messages = GaugeMetricFamily(
        "conveyor_queue_messages",
        "Messages now, by state: ready, delayed (not before a time), delivered (leased to a consumer).",
        labels=["queue", "state"],
    )
    disk = GaugeMetricFamily(
        "conveyor_queue_disk_bytes", "Bytes the queue's files take (0 for a transient queue).", labels=["queue"]
    )
    totals = [(f, CounterMetricFamily(f"conveyor_queue_{f}", doc, labels=["queue"])) for f, doc in QUEUE_TOTALS]
    consumers = GaugeMetricFamily("conveyor_queue_consumers", "Live consumers that report serving the queue.", labels=["queue"])
    # per queue hosted here, not per consumer and queue: a report naming queues without end adds no series
    serving = Counter(q for counts in _live(host).values() for q in queues_served(counts))
    for name, q in sorted(host.queues.items()):
        if q.dropped:
            continue
        s = q.store.stats()
        for state, n in (("ready", s.ready), ("delayed", s.delayed), ("delivered", s.delivered)):
            messages.add_metric([name, state], n)
        disk.add_metric([name], s.bytes_on_disk)
        consumers.add_metric([name], serving[name])
        for f, family in totals:
            family.add_metric([name], getattr(q.store.totals, f))
    yield messages
    yield disk
    yield consumers
    for _, family in totals:
        yield family
    yield GaugeMetricFamily(
        "conveyor_queues_unavailable",
        "Queues whose store could not be opened (see the server's log).",
        value=len(host.unavailable),
    )


def _consumers(host: QueueHost) -> Iterable[Metric]:
    """From the consumers' reports (each reports to every server: aggregate with max by consumer).

    Each figure of the report counted since the consumer started is a counter, each as it stands a
    gauge (`conveyor.protocol.report`).
    """
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    labels = ["consumer", "host"]
    kinds = {Shown.TOTAL: CounterMetricFamily, Shown.NOW: GaugeMetricFamily}
    figures = {
        name: kinds[f.shown](f"conveyor_consumer_{name}", f.help, labels=labels)
        for name, f in FIGURES.items()
        if f.shown in kinds
    }
    seen = GaugeMetricFamily(
        "conveyor_consumer_last_report_age_seconds", "Seconds since the consumer's last report.", labels=labels
    )
    runtimes = HistogramMetricFamily(
        "conveyor_consumer_task_duration_seconds", "How long the consumer's tasks ran.", labels=labels
    )
    for name, counts in sorted(_live(host).items()):
        r = ConsumerReport.from_counts(name, counts)
        at = [r.consumer, r.host]
        for figure, n in r.figures(*kinds).items():
            figures[figure].add_metric(at, n)
        seen.add_metric(at, r.seen)
        if r.task_seconds is not None:
            runtimes.add_metric(at, r.task_seconds.cumulative(), r.task_seconds.sum)
    yield from figures.values()
    yield seen
    yield runtimes


def _live(host: QueueHost) -> dict[str, Counts]:
    """The consumers heard from lately but those whose last report said they stop: their series end with them."""
    return {name: counts for name, counts in host.workers().items() if not has_ended(counts)}


def _tasks(host: QueueHost) -> Iterable[Metric]:
    """Per task name labelled (the most run; the rest as TASK_LABEL_OTHER), its settled deliveries and run times."""
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    runs = CounterMetricFamily(
        "conveyor_task_runs_total",
        "Deliveries of the task settled, by how they ended: acked, retried, failed (a dead letter), "
        "expired (its lease ended: back in its queue) or dead-lettered (its lease ended on its last attempt).",
        labels=["task", "state"],
    )
    seconds = HistogramMetricFamily(
        "conveyor_task_duration_seconds",
        "From a delivery of the task to its ack or nack, as the server saw them.",
        labels=["task"],
    )
    for task, t in host.tallies.labelled().items():
        for state, n in zip(COUNTED, t.runs, strict=True):
            runs.add_metric([task, state.value], n)
        seconds.add_metric([task], t.seconds.cumulative(), t.seconds.sum)
    yield runs
    yield seconds


async def start_endpoint(
    collector: ServerCollector, host: str, port: int, key: bytes | None, tls: ssl.SSLContext | None, throttle: Throttle
) -> tuple[HttpService, int]:
    """Serve `collector` at METRICS_PATH on host:port (0: a free port); (the service to clean up, the port).

    With `key`, a scrape must send `Authorization: Bearer <token>`; `throttle` slows wrong ones.
    """
    from aiohttp import web
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # a Collector is anything with collect()

    async def metrics(request: web.Request) -> web.Response:
        given = request.headers.get("Authorization", "")  # none is no guess: refused at once
        if key is not None and not (given and await throttle.check(request.remote, lambda: bearer_ok(given, key))):
            return web.Response(
                status=401,
                text="a token is required: send 'Authorization: Bearer <token>'\n",
                headers={"WWW-Authenticate": 'Bearer realm="conveyor"'},
            )
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(registry), headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get(METRICS_PATH, metrics)
    return await serve_app(app, host, port, tls)
