"""The dashboard's task pages: a queue's task records, one task's detail, and cancelling, asked for on demand.

Unlike the stats (`PoolWatch` asks every server each second), task records are fetched only when the
page asks (a queue's Tasks section open, a task's page open), on connections of their own with a
short timeout, at most a page's worth of records each. A server that does not answer is named in
the answer (`partial`), and the others' records are shown.

Ids are pool-wide and written `shard:n` (`format_id`), as every command shows them. Payloads and
results are shown decoded only where that runs no code (`conveyor.tasks.preview`: msgpack decoded,
a pickle only named with its size). Everything here is plain JSON-ready data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.client.queue_client import QueueClient
from conveyor.client.sharded import ShardedQueues, format_id, parse_id
from conveyor.client.transport import parse_address
from conveyor.constants import SHARD_SHIFT, TASK_PAGE_MAX
from conveyor.errors import ConveyorError, RequestError
from conveyor.message import Status
from conveyor.protocol.task_pages import Preview, TaskDetail, TaskRecord, TaskState
from conveyor.protocol.tls import netloc
from conveyor.server.task_records import error_summary
from conveyor.tasks.preview import Shown, show_call, show_result

LOOKUP_TIMEOUT_S = 3.0  # a server's answer to a page's request, or it is named unreachable
MAX_TASKS = 200  # records of each kind (running, recent) one page shows at most
DEFAULT_TASKS = 50


class TaskLookup:
    """The task records of a pool's servers, fetched when asked, with a short timeout."""

    def __init__(self, clients: Sequence[QueueClient]) -> None:
        # connections of its own: a slow lookup holds up neither the stats nor the pool's callers
        self.pool = ShardedQueues([c.sibling(LOOKUP_TIMEOUT_S, LOOKUP_TIMEOUT_S) for c in clients])
        self._where = {c.address: netloc(*parse_address(c.address)) for c in clients}

    def close(self) -> None:
        self.pool.close()

    def parse_id(self, given: object) -> int:
        """A pool-wide id from the page (`shard:n`, or the integer); ValueError for any other, or a shard not in this pool."""
        if type(given) is int:
            n = given
        elif isinstance(given, str):
            n = parse_id(given)
        else:
            raise ValueError(f"an id is shard:n, as ids are shown, not {given!r:.40}")
        if not 0 < n < len(self.pool.clients) << SHARD_SHIFT:
            raise ValueError(
                f"id {format_id(n) if n >= 0 else n} names no message of this pool's {len(self.pool.clients)} server(s)"
            )
        return n

    def page(
        self, queue: str, name: str = "", state: TaskState | None = None, msg_id: int = 0, limit: int = DEFAULT_TASKS
    ) -> dict[str, Any]:
        """The running and recent tasks of `queue`, newest first, at most `limit` of each.

        `name` keeps those whose task name holds it (any case): the servers filter by state and id,
        and the name is matched here over every record they keep (up to TASK_PAGE_MAX of each
        kind), so a part of a name finds them.
        """
        got = self.pool.tasks(queue, state=state, msg_id=msg_id, limit=TASK_PAGE_MAX if name else limit)
        running, recent, total = got.running, got.recent, got.running_total
        if name:
            wanted = name.casefold()
            running = [r for r in running if wanted in r.task.casefold()]
            recent = [r for r in recent if wanted in r.task.casefold()]
            total = len(running)
        unreachable = {self._where.get(a, a): e for a, e in got.unreachable.items()}
        return {
            "queue": queue,
            "running": [_record(r) for r in running[:limit]],
            "recent": [_record(r) for r in recent[:limit]],
            "running_total": total,
            "partial": {"unreachable": sorted(unreachable), "servers": len(self.pool.clients), "errors": unreachable}
            if unreachable
            else None,
        }

    def task(self, queue: str, msg_id: int) -> dict[str, Any]:
        """One task's page: its status, previews of its argument and result, its error, history and headers."""
        shard, _ = ShardedQueues.split_id(msg_id)
        try:
            d = self.pool.task(queue, msg_id)
        except RequestError:  # answered: no such queue, say
            raise
        except (ConveyorError, OSError) as e:
            where = self._where.get(self.pool.clients[shard].address, "")
            raise ConveyorError(f"the server of shard {shard} ({where}) did not answer: {type(e).__name__}: {e}") from e
        return _detail(d)

    def cancel(self, queue: str, ids: list[int]) -> dict[str, Any]:
        """Take these messages off `queue` before they run (ready or delayed ones); what became of each."""
        outcomes = self.pool.cancel(queue, ids)
        return {"outcomes": {format_id(i): o.value for i, o in zip(ids, outcomes, strict=True)}}


def _record(r: TaskRecord) -> dict[str, Any]:
    return {
        "id": format_id(r.id),
        "task": r.task,
        "state": r.state.value,
        "consumer": r.consumer,
        "attempt": r.attempt,
        "delivered_at": r.delivered_at,
        "finished_at": r.finished_at,
        "runtime_s": round(r.runtime_s, 3),
        "error": r.error,
        "error_line": error_line(r.error),
    }


def error_line(error: str | None) -> str:
    """The line of an error that a table shows (the rest on a click): the servers' summary of it."""
    return error_summary(error) if error else ""


def _shown(s: Shown, p: Preview) -> dict[str, Any]:
    return {"encoding": s.encoding, "text": s.text, "decoded": s.decoded, "size": p.size}


def _detail(d: TaskDetail) -> dict[str, Any]:
    return {
        "queue": d.queue,
        "id": format_id(d.id),
        "status": None if d.status is None else d.status.name.lower(),
        "cancellable": d.status is Status.READY,  # ready or delayed: what `cancel` takes off
        "task": d.task,
        "content_type": d.content_type,
        "enqueued_at": d.enqueued_at,
        "payload": None if d.payload is None else _shown(show_call(d.payload, d.content_type), d.payload),
        "result": None if d.result is None else _shown(show_result(d.result), d.result),
        "error": d.error,
        "records": [_record(r) for r in d.records],
        "history": [
            {
                "at": e.at,
                "what": e.what,
                "consumer": e.consumer,
                "attempt": e.attempt,
                "error": e.error,
                "error_line": error_line(e.error),
            }
            for e in d.history()
        ],
        "headers": d.headers,
    }
