"""What the dashboard shows, gathered from a pool's servers.

What the dashboard shows, gathered from a pool's servers: `PoolWatch` asks each server for its stats
once a second, each in a thread of its own (a server that is down or slow delays no other), and
keeps the minutes of history the charts draw. Everything it hands out is plain JSON-ready data.

While a server does not answer, every figure summed over the servers covers only those that do:
the overview says so (`partial`, and each queue's), and keeps the server's last answer, shown apart,
instead of its share. Queues Conveyor keeps for itself (`INTERNAL_QUEUE_PREFIX`) are marked so the
page can leave them out.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from conveyor.client.pool import QueuePool
from conveyor.client.queue_client import QueueClient
from conveyor.client.sharded import ShardedQueues, format_id, summed_stats
from conveyor.client.transport import parse_address
from conveyor.constants import H_TASK, INTERNAL_QUEUE_PREFIX
from conveyor.dashboard.task_lookup import TaskLookup, error_line
from conveyor.errors import ConveyorError
from conveyor.message import DeadLetter, printable
from conveyor.protocol import requests as calls
from conveyor.protocol.report import SEEN, ConsumerReport, Counts, Rows
from conveyor.protocol.requests import QueueStats, ServerStats
from conveyor.protocol.tls import netloc

POLL_S = 1.0  # how often each server is asked
ACTION_TIMEOUT_S = 10.0  # a page of dead letters, a requeue: answered within this, or an error shown
POLL_TIMEOUT_S = 2.0  # a server that does not answer within this is shown down (its last figures kept apart)
HISTORY_S = 600.0  # how far back the charts go
LATE_S = 5.0  # a consumer reports every 2 s: one not heard from for this long is marked late
GONE_KEPT_S = 300.0  # a consumer that stopped reporting (finished, or lost) stays listed this long
RATE_WINDOW_S = 30.0  # a consumer's rate: tasks processed over about this long
SLOW_FRACTION = 0.3  # a busy consumer below this fraction of its peers' median rate is marked slow
SLOW_MIN_TASKS = 10  # ... when its peers finish at least this many tasks in RATE_WINDOW_S
RATE_MIN_SPAN_S = 15.0  # a rate is given once a consumer's reports span this long
PREVIEW_BYTES = 120  # of a dead letter's payload, shown as text
MAP_PREFIX = "map-"  # the queues of conveyor.spark.map jobs
_COUNTS = ("ready", "delivered", "delayed", "acked", "failed", "bytes_on_disk", "put_rate", "ack_rate")


@dataclass(frozen=True, slots=True)
class _Heard:
    """A consumer's latest report, and when (time.monotonic()) it was sent, as the server that had it saw it."""

    at: float
    report: ConsumerReport


class ServerWatch:
    """One server's latest answer (or error), refreshed every POLL_S in a daemon thread."""

    def __init__(self, client: QueueClient, stop: threading.Event) -> None:
        self.client = client.sibling(POLL_TIMEOUT_S, POLL_TIMEOUT_S)  # not the pool's: its timeouts may be long
        self.address = client.address
        self.stats: ServerStats | None = None
        self.error: str | None = None
        self.answered_at: float | None = None  # time.monotonic() of the last answer
        self.where = netloc(*parse_address(self.address))  # host:port, as the page names it
        self._stop = stop
        self.thread = threading.Thread(target=self._run, name=f"dashboard-{self.address}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.stats, self.error, self.answered_at = self.client.call(calls.server_stats()), None, time.monotonic()
            except (ConveyorError, OSError) as e:  # down, out of reach, or no answer within the client's timeout
                self.error = f"{type(e).__name__}: {e}"
            self._stop.wait(max(0.0, POLL_S - (time.monotonic() - t0)))
        self.client.close()

    @property
    def up(self) -> bool:
        return self.error is None and self.stats is not None

    @property
    def queues(self) -> dict[str, QueueStats]:
        """Its queues as last heard, or none while it is down."""
        return self.stats.queues if self.up and self.stats else {}

    @property
    def last_queues(self) -> dict[str, QueueStats]:
        """Its queues as last heard, also while it is down (none if it never answered)."""
        return self.stats.queues if self.stats else {}

    @property
    def workers(self) -> dict[str, Counts]:
        """The consumers it heard from, as last heard, or none while it is down."""
        return self.stats.workers if self.up and self.stats else {}


class PoolWatch:
    """The pool as the dashboard shows it: servers, queues, consumers, map jobs and a history.

    The pool as the dashboard shows it: servers, queues (summed and per shard), consumers, map jobs,
    and a history of each queue's ready count and rates.
    """

    def __init__(self, pool: QueuePool) -> None:
        # connections of its own, with short timeouts: a server that dies holds up no page for long,
        # and the pool's own callers are never held up by the page
        self.pool = ShardedQueues([c.sibling(ACTION_TIMEOUT_S, POLL_TIMEOUT_S) for c in pool.queues.clients])
        self._stop = threading.Event()
        self.servers = [ServerWatch(c, self._stop) for c in pool.queues.clients]
        self.tasks = TaskLookup(pool.queues.clients)  # asked only when the page asks
        self._seen: dict[str, _Heard] = {}  # consumer -> its last report, also once it stopped reporting
        self._done: dict[str, deque[tuple[float, int]]] = {}  # consumer -> (when, processed) over RATE_WINDOW_S
        # map job queue -> consumer -> (messages, rows) it settled, kept while the queue lives (also once it is gone)
        self._rows: dict[str, dict[str, Rows]] = {}
        # (when, whether some server was down then, queue -> (ready, put rate, ack rate) summed over those up)
        self._history: deque[tuple[float, bool, dict[str, tuple[int, float, float]]]] = deque()
        self._lock = threading.Lock()
        self._sampler = threading.Thread(target=self._sample_loop, name="dashboard-history", daemon=True)
        self._sampler.start()

    def close(self) -> None:
        """Stop asking the servers (each thread ends within a poll's timeout) and close the connections."""
        self._stop.set()
        for t in (self._sampler, *(w.thread for w in self.servers)):
            t.join(POLL_TIMEOUT_S + 1.0)
        self.pool.close()
        self.tasks.close()

    def _sample_loop(self) -> None:
        while not self._stop.wait(POLL_S):
            now = time.time()
            sample = {q: (s.ready, s.put_rate, s.ack_rate) for q, s in self.queues().items()}
            partial = not all(w.up for w in self.servers)  # after the sums: a server down meanwhile marks them
            with self._lock:
                self._history.append((now, partial, sample))
                while self._history and self._history[0][0] < now - HISTORY_S:
                    self._history.popleft()

    def queues(self) -> dict[str, QueueStats]:
        """Each queue summed over the servers that answer."""
        return summed_stats(w.queues for w in self.servers)

    def overview(self) -> dict[str, Any]:
        """Everything the page shows but the dead letters and the history.

        Ages are judged on the monotonic clock (a step of the wall clock neither keeps a dead consumer
        listed nor marks a live one late); only `time`, for people, is the wall clock's. With a server
        down, `partial` names it: every sum (a queue's counts, a job's progress) is over the others.
        A queue says `partial` when a server down held it at its last answer, or never answered; its
        `shards` keep that server's last counts, `stale` and their age.
        """
        now = time.monotonic()
        up = [w.up for w in self.servers]  # looked at once: the sums and the marks below agree
        servers = [
            {
                "shard": k,
                "address": w.address,
                "up": up[k],
                "error": w.error,
                "last_answer_s": None if w.answered_at is None else round(now - w.answered_at, 1),
            }
            for k, w in enumerate(self.servers)
        ]
        per_shard: dict[str, dict[str, dict[str, Any]]] = {}
        for k, w in enumerate(self.servers):
            age = None if w.answered_at is None else round(now - w.answered_at, 1)
            for q, s in w.last_queues.items():
                per_shard.setdefault(q, {})[str(k)] = _counts(s) if up[k] else {**_counts(s), "stale": True, "age_s": age}
        live = summed_stats(w.last_queues for k, w in enumerate(self.servers) if up[k])
        down = [k for k in range(len(self.servers)) if not up[k]]
        unknown = any(self.servers[k].stats is None for k in down)  # a server never heard: any queue may be on it
        queues = [
            {
                "name": q,
                **_counts(live.get(q) or QueueStats(q)),
                "internal": internal(q),
                "partial": unknown or any(str(k) in per_shard[q] for k in down),
                "shards": per_shard[q],
            }
            for q in sorted(per_shard)
        ]
        partial = {"unreachable": [self.servers[k].where for k in down], "servers": len(self.servers)} if down else None
        consumers = self._consumers(now)
        with self._lock:
            if all(up):  # a queue no server has is over: forget its rows
                for q in self._rows.keys() - {q["name"] for q in queues}:
                    del self._rows[q]
            rows = {q: (sum(r.messages for r in by.values()), sum(r.rows for r in by.values())) for q, by in self._rows.items()}
        jobs = [_job(q, rows.get(q["name"], (0, 0))) for q in queues if q["name"].startswith(MAP_PREFIX)]
        return {
            "time": time.time(),
            "partial": partial,
            "servers": servers,
            "queues": queues,
            "consumers": consumers,
            "jobs": jobs,
        }

    def _consumers(self, now: float) -> list[dict[str, Any]]:
        """Every consumer heard from lately, and those that stopped within GONE_KEPT_S, with a status.

        One whose last report says it ended is `finished`; one that stopped reporting without
        saying so (killed, cut off) is `lost` once no server lists it. `now`, and every time kept
        here, are time.monotonic()'s.
        """
        heard: dict[str, _Heard] = {}
        for w in self.servers:
            if w.answered_at is None:  # not answered yet: no consumer heard of
                continue
            for name, counts in w.workers.items():
                r = ConsumerReport.from_counts(name, counts)
                at = w.answered_at - r.seen  # when it last reported, as that server saw it
                if name not in heard or at > heard[name].at:
                    heard[name] = _Heard(at, r)
        answering = any(w.up for w in self.servers)
        out = []
        with self._lock:
            self._seen.update(heard)
            for name, h in heard.items():
                for q, settled in h.report.rows.items():
                    self._rows.setdefault(q, {})[name] = settled
            for name, h in heard.items():
                done = self._done.setdefault(name, deque())
                if done and h.report.processed < done[-1][1]:  # started again under the same name: count anew
                    done.clear()
                if not done or h.at > done[-1][0]:
                    done.append((h.at, h.report.processed))
                while len(done) > 2 and done[1][0] < h.at - RATE_WINDOW_S:
                    done.popleft()
            for name in [n for n, h in self._seen.items() if now - h.at > GONE_KEPT_S]:
                del self._seen[name]
                self._done.pop(name, None)
            rates = {n: _rate(self._done.get(n)) for n in self._seen}
            working = {n for n, h in heard.items() if not h.report.ended}  # the peers a rate is judged against
            for name, h in sorted(self._seen.items()):
                ago = now - h.at
                if h.report.ended:
                    status = "finished"
                elif not answering:  # with no server answering, nothing is known of any other
                    status = "unknown"
                else:
                    status = "lost" if name not in heard else "late" if ago > LATE_S else "ok"
                peers = [r for n, r in rates.items() if n != name and n in working and r is not None]
                rate = rates[name]
                # judged only on a long enough span, and peers fast enough that a shortfall means something
                behind = (
                    rate is not None
                    and bool(peers)
                    and (m := statistics.median(peers)) * RATE_WINDOW_S >= SLOW_MIN_TASKS
                    and rate < SLOW_FRACTION * m
                )
                if status == "ok" and h.report.running and behind:
                    status = "slow"  # busy, yet far behind the others
                out.append(
                    {
                        "name": name,
                        "host": h.report.host,
                        **h.report.figures(),
                        SEEN: round(ago, 1),
                        "rate": None if rate is None else round(rate, 2),
                        "status": status,
                    }
                )
        return out

    def history(self, queue: str | None = None, with_internal: bool = False) -> dict[str, list[float]]:
        """Per second over the last HISTORY_S: time, ready, put and ack rates, of one queue or of all.

        All: the user's queues, and with `with_internal` the internal ones too. `partial` is 1 for a
        second when some server was down (its queues not in the sums), else 0.
        """
        with self._lock:
            samples = list(self._history)
        out: dict[str, list[float]] = {"time": [], "partial": [], "ready": [], "put_rate": [], "ack_rate": []}
        for t, partial, per in samples:
            if queue is not None:
                rows = [per[queue]] if queue in per else []
            else:
                rows = [r for q, r in per.items() if with_internal or not internal(q)]
            out["time"].append(t)
            out["partial"].append(int(partial))
            for key, i in (("ready", 0), ("put_rate", 1), ("ack_rate", 2)):
                out[key].append(round(sum(r[i] for r in rows), 2))
        return out

    def dead_letters(self, queue: str, cursor: str = "", limit: int = 50) -> dict[str, Any]:
        """One page of a queue's dead letters, shard after shard; `next` resumes after it ("" at the end).

        A shard is left for the next only once it has nothing more (a reply may hold fewer than
        asked). Shards down, or failing the request, are passed over and named in `skipped`.
        """
        shard, after = (int(x) for x in cursor.split(":")) if cursor else (0, 0)
        items: list[dict[str, Any]] = []
        skipped: list[str] = []
        while shard < len(self.pool.clients) and len(items) < limit:
            w = self.servers[shard]
            page: list[DeadLetter] = []
            if not w.up:
                skipped.append(w.address)
            elif queue in w.queues:  # not there: the queue has nothing on it
                try:
                    page = self.pool.clients[shard].dead_letters(queue, after, limit - len(items))
                except (ConveyorError, OSError):
                    skipped.append(w.address)
            for d in page:
                m = d.message
                items.append(
                    {
                        "id": format_id(ShardedQueues.global_id(shard, m.id)),
                        "attempts": m.attempts,
                        "failed_at": d.failed_at,
                        "task": m.headers.get(H_TASK, ""),
                        "error": d.error,
                        "error_line": error_line(d.error),
                        "payload": printable(m.payload, PREVIEW_BYTES),
                    }
                )
                after = m.id
            if not page:
                shard, after = shard + 1, 0
        more = f"{shard}:{after}" if shard < len(self.pool.clients) else ""
        return {"queue": queue, "items": items, "next": more, "skipped": skipped}

    def requeue(self, queue: str, ids: list[int] | None) -> dict[str, Any]:
        """Put dead letters back (the pool's own requeue) on the servers that answer.

        Put dead letters back (the pool's own requeue): these pool-wide ids, or all (None) on the
        servers that answer (those down are named in `skipped`).
        """
        down = [w.address for w in self.servers if not w.up]
        if ids is None:  # every dead letter of the shards that answer, named (a shard down fails no other)
            ids = [
                ShardedQueues.global_id(k, d.message.id)
                for k, w in enumerate(self.servers)
                if queue in w.queues
                for d in self.pool.clients[k].iter_dead_letters(queue)
            ]
        return {"requeued": self.pool.requeue_dead_letters(queue, ids) if ids else 0, "skipped": down}


def internal(queue: str) -> bool:
    """Whether `queue` is one Conveyor keeps for itself (a Spark job's records), not the user's."""
    return queue.startswith(INTERNAL_QUEUE_PREFIX)


def _counts(s: QueueStats) -> dict[str, Any]:
    d = asdict(s)
    return {k: round(d[k], 2) if isinstance(d[k], float) else d[k] for k in _COUNTS}


def _job(q: dict[str, Any], reported: tuple[int, int]) -> dict[str, Any]:
    """A map job's progress from its queue, in messages and in rows.

    A map job's progress from its queue: messages (each up to `rows_per_message` rows) done of put,
    and in rows: the rows its consumers reported settled (`reported`: messages, rows), plus those of
    the messages settled or left since, at the rows per message reported (None before any report).
    Exact once every message is settled and reported.
    """
    total = q["ready"] + q["delayed"] + q["delivered"] + q["acked"] + q["failed"]
    done = q["acked"] + q["failed"]
    rate = q["ack_rate"]
    left = total - done
    m, r = reported
    per = r / m if m else None
    return {
        "queue": q["name"],
        "partial": q["partial"],
        "total": total,
        "done": done,
        "failed": q["failed"],
        "rate": rate,
        "eta_s": round(left / rate, 1) if rate > 0 and left else (0.0 if not left else None),
        "rows_done": None if per is None else r + round(max(done - m, 0) * per),
        "rows_total": None if per is None else r + round(max(total - m, 0) * per),
        "rows_rate": None if per is None else round(rate * per, 2),
    }


def _rate(done: deque[tuple[float, int]] | None) -> float | None:
    """Tasks processed per second between the first and the last report kept (None: they span under RATE_MIN_SPAN_S yet)."""
    if done is None or len(done) < 2 or done[-1][0] - done[0][0] < RATE_MIN_SPAN_S:
        return None
    return (done[-1][1] - done[0][1]) / (done[-1][0] - done[0][0])
