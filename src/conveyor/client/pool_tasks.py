"""Tasks through a pool: the `Publisher` protocol, ad-hoc calls (`submit`, `map`) and `gather`.

A mixin of `QueuePool`, kept apart from the routing: this is what users of tasks see. An ad-hoc
callable is cloudpickled once per function object and stored on every shard as a blob keyed by
its sha256; its messages carry only the digest, and workers fetch and cache the function.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from conveyor.constants import DEFAULT_QUEUE
from conveyor.errors import ConveyorError, TaskFailedError
from conveyor.protocol.message import Status
from conveyor.tasks.envelope import adhoc_task_name, decode_result, function_ref
from conveyor.tasks.options import BackoffSpec, TaskOptions
from conveyor.tasks.publish import TaskHandle, _check_publish_options, build_message, check_time_limit

if TYPE_CHECKING:
    from conveyor.client.pool import QueuePool
    from conveyor.protocol.operations import QueueInfo
    from conveyor.worker.settings import QueueConfig

QUEUE_INFO_TTL_S = 5.0  # how long a pool trusts what the servers said about a queue's settings


class PoolTasks:
    """Task methods of `QueuePool` (see `conveyor.tasks.definition` for defining tasks)."""

    _queue_configs: dict[str, QueueConfig]
    _queue_info: tuple[float, dict[str, QueueInfo]]
    _blobs_sent: set[str]

    def _init_tasks(self) -> None:
        self._queue_configs = {}
        self._queue_info = (0.0, {})
        self._blobs_sent = set()

    def use_queues(self, configs: Iterable[QueueConfig]) -> None:
        """Queue configurations (from the queue YAML) that publishing checks time limits against."""
        self._queue_configs.update((c.name, c) for c in configs)

    # --- Publisher ---------------------------------------------------------------------------
    def queue_config(self: QueuePool, queue: str) -> QueueConfig | None:  # type: ignore[misc]
        """The queue's configuration: from `use_queues`, else its lease on the servers as the visibility timeout."""
        from conveyor.worker.settings import QueueConfig

        if queue in self._queue_configs:
            return self._queue_configs[queue]
        when, infos = self._queue_info
        if time.monotonic() - when > QUEUE_INFO_TTL_S:
            infos = {i.name: i for c in self.clients for i in c.queues()}
            self._queue_info = (time.monotonic(), infos)
        info = infos.get(queue)
        return None if info is None else QueueConfig(name=queue, visibility_timeout_sec=info.lease_s)

    # --- ad-hoc callables -------------------------------------------------------------------
    def submit(self: QueuePool, func: Callable[..., Any], /, *args: Any, _queue: str = DEFAULT_QUEUE,  # type: ignore[misc]
               _priority: int | None = None, _delay: float | None = None, _key: str | None = None,
               _time_limit: float | None = None, _max_retries: int = 3, _retry_backoff: BackoffSpec | None = None,
               **kwargs: Any) -> TaskHandle:  # fmt: skip
        """Run `func(*args, **kwargs)` on a worker; returns the handle of its message.

        The function is cloudpickled once (per function object) and stored on the servers; the
        message carries its sha256 only. Keyword arguments with a leading underscore are the
        queue's options, never passed to `func`.
        """
        return self.map(func, [(args, kwargs)], queue=_queue, priority=_priority, delay=_delay, key=_key,
                        time_limit=_time_limit, max_retries=_max_retries, retry_backoff=_retry_backoff,
                        star=True)[0]  # fmt: skip

    def map(self: QueuePool, func: Callable[..., Any], items: Iterable[Any], *, queue: str = DEFAULT_QUEUE,  # type: ignore[misc]
            priority: int | None = None, delay: float | None = None, key: str | None = None,
            time_limit: float | None = None, max_retries: int = 3, retry_backoff: BackoffSpec | None = None,
            star: bool = False) -> list[TaskHandle]:  # fmt: skip
        """Run `func(item)` on the workers for every item (with `star`: items are (args, kwargs)).

        Returns the handles in item order; `gather(handles)` waits for the results.
        """
        opts = TaskOptions(queue=queue, time_limit=time_limit, max_retries=max_retries,
                           **({} if retry_backoff is None else {"retry_backoff": retry_backoff}))  # fmt: skip
        ref = function_ref(func)
        name = adhoc_task_name(ref.digest)
        _check_publish_options(name, delay, priority, key)
        check_time_limit(name, opts, self.queue_config(queue))
        now = time.time()
        calls = ((tuple(a), dict(k)) for a, k in items) if star else (((it,), {}) for it in items)
        messages = [build_message(name, opts, a, k, delay=delay, priority=priority, key=key, now=now) for a, k in calls]
        if not messages:
            return []
        if ref.digest not in self._blobs_sent:
            if self.put_blob(ref.data) != ref.digest:
                raise ConveyorError(f"the servers stored {name} under another digest")
            self._blobs_sent.add(ref.digest)
        ids = self.put(queue, messages)
        return [TaskHandle(i, queue, name) for i in ids]

    # --- results ----------------------------------------------------------------------------
    def gather(self: QueuePool, handles: Sequence[TaskHandle], timeout: float | None = None,  # type: ignore[misc]
               poll_s: float = 0.05) -> list[Any]:  # fmt: skip
        """The results of published tasks, in order, once all have finished.

        Raises TaskFailedError for the first that ended in the dead letters (with its error), and
        TimeoutError after `timeout` seconds.
        """
        out: list[Any] = [None] * len(handles)
        todo = list(range(len(handles)))
        deadline = None if timeout is None else time.monotonic() + timeout
        while todo:
            by_queue: dict[str, list[int]] = {}
            for k in todo:
                by_queue.setdefault(handles[k].queue, []).append(k)
            left = []
            for queue, ks in by_queue.items():
                ids = [handles[k].id for k in ks]
                for k, r, st in zip(ks, self.result(queue, ids), self.status(queue, ids), strict=True):
                    if r is not None:
                        out[k] = decode_result(r)
                    elif st is Status.FAILED:
                        raise TaskFailedError(handles[k], self._dead_error(queue, handles[k].id))
                    elif st is None:
                        raise ConveyorError(f"{handles[k]}: no such message (purged, or another pool's id)")
                    else:
                        left.append(k)
            todo = left
            if todo:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"gather: {len(todo)} of {len(handles)} tasks unfinished after {timeout} s")
                time.sleep(poll_s)
        return out

    def _dead_error(self: QueuePool, queue: str, msg_id: int) -> str:  # type: ignore[misc]
        shard, local = self.split_id(msg_id)
        page = self.clients[shard].dead_letters(queue, after=local - 1, limit=1)
        return page[0].error if page and page[0].message.id == local else "failed (its dead letter was forgotten)"
