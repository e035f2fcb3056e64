"""Settler: a consumer's acks, nacks, releases, lease extensions and reports, sent from a thread of their own.

Over connections of its own, so that an ack waiting for its fsync never holds up the next fetch.
Whatever piles up while a request is out goes in the next one (one call per queue and kind, split
to fit the servers' limits), and a request that fails because a server is restarting or its disk is
full is retried until it goes through (an ack that arrives late, after the lease, still counts if no
one else finished the message). Only `close` sets a limit: what could not be sent by then is given
up (counted in `unsettled`), and comes back when its lease ends.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from conveyor.client.backend import QueueBackend
from conveyor.client.transport import Transport
from conveyor.constants import ERR_STORE, H_TASK
from conveyor.errors import ConnectionLostError, ConveyorError, RequestError, TaskError
from conveyor.message import Message
from conveyor.protocol.requests import Counts
from conveyor.worker.executors import Completion

log = logging.getLogger("conveyor.worker")

RETRY_S = 0.5  # first wait between tries while a server does not answer (or its disk is full)
MAX_RETRY_S = 5.0
COALESCE_S = 0.05  # after the first settlement, how long to gather more before sending
# the same while the consumer's queues are busy: a request costs the server and the consumer about
# the same CPU whatever it carries, so under load fewer, larger acks leave more for the tasks (an
# idle consumer, a flush and close hurry them: the end of the work is not delayed)
BUSY_COALESCE_S = 0.25
# a report is only counts, sent again `report_every_s` later: a server out of reach holds the settler
# (the acks behind it, a consumer's stop) at most this long per report, not a connection's whole patience
REPORT_CONNECT_S = 1.0
_STOP = object()
_SETTLES = ("ack", "nack")  # the kinds that finish or return a message (a consumer counts those not sent)


class Settler:
    """Queues settlements for a background thread; `flush()` waits until all were sent."""

    def __init__(self, pool: QueueBackend, report: Callable[[], tuple[str, Counts]] | None = None,
                 report_every_s: float = 2.0) -> None:  # fmt: skip
        self._pool: QueueBackend = pickle.loads(pickle.dumps(pool))  # connections of its own
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._report = report
        self._report_every_s = report_every_s
        self._pending = 0
        self._cond = threading.Condition()
        self._hurry = threading.Event()  # send without gathering more (a flush waits, or the consumer is idle)
        self.busy = False  # set by the consumer while its queues are busy: gather for BUSY_COALESCE_S
        self.errors = 0
        self._owed = 0  # acks and nacks queued and neither sent nor given up yet
        self._given_up = 0  # acks and nacks given up
        self.unsettled = 0  # set by close: acks and nacks not sent (their messages come back when their leases end)
        self._give_up_at = float("inf")  # set by close: stop retrying after this
        self._thread = threading.Thread(target=self._loop, name="conveyor-settler", daemon=True)
        self._thread.start()

    # --- what a consumer queues ---------------------------------------------------------
    def put(self, items: list[tuple[Any, ...]]) -> None:
        """Queue settlements, each one of `ack`, `nack`, `release` or `extend` below."""
        if items:
            with self._cond:
                self._pending += len(items)
                self._owed += sum(1 for item in items if item[0] in _SETTLES)
            self._items.put(items)

    @staticmethod
    def ack(queue_name: str, msg_id: int, result: bytes | None) -> tuple[Any, ...]:
        return ("ack", queue_name, False, msg_id, result)

    @staticmethod
    def nack(queue_name: str, msg_id: int, error: str, delay_s: float, final: bool) -> tuple[Any, ...]:
        return ("nack", queue_name, final, msg_id, (error, delay_s))

    @staticmethod
    def release(queue_name: str, msg_id: int) -> tuple[Any, ...]:
        return ("release", queue_name, False, msg_id, None)

    @staticmethod
    def extend(queue_name: str, msg_id: int, lease_s: float) -> tuple[Any, ...]:
        return ("extend", queue_name, lease_s, msg_id, None)

    def hurry(self) -> None:
        """Send what is queued without gathering more (nothing else is coming soon). With nothing
        queued, nothing to hurry: the next settlements gather as usual."""
        with self._cond:
            if self._pending:
                self._hurry.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far was sent; False on timeout."""
        self.hurry()
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Send what is queued and a last report, and stop. Gives up after `timeout` s (what was not
        sent by then comes back to the queues when its lease ends) and returns."""
        self._give_up_at = deadline = time.monotonic() + timeout
        self.flush(timeout)
        self._items.put(_STOP)
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        with self._cond:  # what is still queued or under way when the time is up counts as not sent
            self.unsettled = self._given_up + self._owed

    # --- the thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._run()
        finally:
            self._pool.close()

    def _run(self) -> None:
        next_report = 0.0
        while True:
            now = time.monotonic()
            if self._report is not None and now >= next_report:
                self._send_report()
                next_report = now + self._report_every_s
            try:
                first = self._items.get(timeout=max(next_report - time.monotonic(), 0.01) if self._report else None)
            except queue.Empty:
                continue
            if first is not _STOP:
                # let settlements arriving together go in one request
                self._hurry.wait(BUSY_COALESCE_S if self.busy else COALESCE_S)
            self._hurry.clear()
            lists = [first]
            while True:
                try:
                    lists.append(self._items.get_nowait())
                except queue.Empty:
                    break
            stop = any(i is _STOP for i in lists)
            batch = [item for items in lists if items is not _STOP for item in items]
            self._send(batch)
            with self._cond:
                self._pending -= len(batch)
                self._cond.notify_all()
            if stop:
                if self._report is not None:
                    self._send_report()
                return

    def _send(self, batch: list[tuple[Any, ...]]) -> None:
        groups: dict[tuple[str, str, Any], list[tuple[int, Any]]] = {}
        for kind, q, extra, msg_id, data in batch:
            groups.setdefault((kind, q, extra), []).append((msg_id, data))
        for (kind, q, extra), items in groups.items():
            ids = [i for i, _ in items]
            wait = RETRY_S
            while True:
                try:
                    if kind == "ack":
                        self._pool.ack(q, ids, [d for _, d in items])
                    elif kind == "nack":
                        self._pool.nack(q, ids, [d[0] for _, d in items], [d[1] for _, d in items], final=extra)
                    elif kind == "release":
                        self._pool.release(q, ids)
                    else:
                        self._pool.extend_lease(q, ids, extra)
                    self._done(kind, len(ids))
                    break
                except (ConnectionLostError, TimeoutError, RequestError) as e:
                    self.errors += 1
                    if isinstance(e, RequestError) and e.kind != ERR_STORE:
                        self._lost(kind, ids, q, e)  # refused (a queue gone): retrying cannot help
                        break
                    if time.monotonic() >= self._give_up_at:
                        self._lost(kind, ids, q, e)
                        break
                    # a server restarting, or a full disk: the same settlements again, less and less often
                    log.warning("could not %s %d message(s) on %r (%s); retrying in %.1f s", kind, len(ids), q, e, wait)
                    time.sleep(wait)
                    wait = min(wait * 2, MAX_RETRY_S)
                except Exception as e:  # anything else (a bug, or a settlement no server takes): not retried
                    self.errors += 1
                    self._lost(kind, ids, q, e)
                    break

    def _done(self, kind: str, n: int, given_up: bool = False) -> None:
        if kind in _SETTLES:
            with self._cond:
                self._owed -= n
                self._given_up += n if given_up else 0

    def _lost(self, kind: str, ids: list[int], q: str, e: BaseException) -> None:
        self._done(kind, len(ids), given_up=True)
        log.error("gave up trying to %s %d message(s) on %r (%s: %s): they come back when their leases end",
                  kind, len(ids), q, type(e).__name__, e)  # fmt: skip

    def _send_report(self) -> None:
        assert self._report is not None
        name, counts = self._report()
        transports = [c for c in self._pool.clients if isinstance(c, Transport)]  # the settler's own connections
        patience = [t.connect_timeout for t in transports]
        for t in transports:
            t.connect_timeout = min(t.connect_timeout, REPORT_CONNECT_S)
        try:
            self._pool.report(name, counts)
        except ConveyorError as e:
            log.debug("report failed: %s", e)
        finally:
            for t, p in zip(transports, patience, strict=True):
                t.connect_timeout = p


def ack_on_delivery(pool: QueueBackend, got: list[Message]) -> tuple[list[Message], Exception | None]:
    """Ack `got` now, before any of it runs (a consumer's `early_ack`): at most once, daskqueue's default.

    Sent at once on the consumer's own connections, not by the settler's next batch: a message is
    settled before it starts. One request per queue and server, in turn; returns the messages whose
    ack took, and the error of the first request that failed (None if none). The messages of the
    requests before it were acked: they are returned, to run (an ack that went through is never
    lost). Those of the failed request and after it are not returned: not run here, they come back
    to their queue when their leases end (or, acked by the failed request after all, are lost: at
    most once). One refused (its lease had ended: another consumer has it) is not returned either.
    """
    groups: dict[tuple[str, int], list[Message]] = {}
    for m in got:
        groups.setdefault((m.queue, pool.split_id(m.id)[0]), []).append(m)
    out: list[Message] = []
    for (q, _), ms in groups.items():
        try:
            oks = pool.ack(q, [m.id for m in ms])
        except Exception as e:  # said to the caller, after what was acked starts
            return out, e
        out += [m for m, ok in zip(ms, oks, strict=True) if ok]
    return out, None


def result_fits(c: Completion, pool: QueueBackend, fits: int) -> Completion:
    """`c`, or, when its result is bigger than the server holding its message takes (`fits`: what any
    server takes), a failure of that task alone, not retried: the other results of its batch are acked."""
    if c.result is None or len(c.result) <= fits:
        return c
    m = c.message
    limit = pool.clients[pool.split_id(m.id)[0]].server_limits.max_item_bytes  # its hello said: it was fetched there
    if len(c.result) <= limit:
        return c
    why = (f"ResultTooLarge: the result is {len(c.result):,} bytes, over the server's limit of {limit:,} "
           "bytes (return less, or store it elsewhere and return where)")  # fmt: skip
    return Completion(m, None, TaskError(m.headers.get(H_TASK, "?"), why, False), c.slot)
