"""ndkale's publisher (`kale.publisher.Publisher`) over a Conveyor `QueuePool`, and the pool itself.

Where the servers are: MESSAGE_QUEUE_ENDPOINT_URL, ndkale's setting, given Conveyor servers as
`tcp://host:port` (several comma-separated: a pool over them); CONVEYOR_TOKEN is their token, if
they use one. There is no default server: a publisher and a worker in different processes must
meet at one address, so an unset endpoint is an error that says what to set.

What ndkale's message body carried besides the call (the task id, app_data, the retry and failure
counts, who published it and when) travels in the Conveyor message's app_data under
APP_DATA_KEY (`KaleEntry`).

A task's retry is a re-publish, as in ndkale 2.2.4 (`Task.republish`). While the worker asks a
failed task's `handle_failure` whether to retry it, a re-publish of that task (same task and task
id) is held (`HeldRetries`) and only published if `handle_failure` returns True: False means no
retry, as the compat has always had it, even if `handle_failure` called its base class's first.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from conveyor.client.pool import QueuePool
from conveyor.client.sharded import ShardedQueues
from conveyor.compat.kale import queue_info, settings
from conveyor.compat.kale.exceptions import (
    ImproperlyConfiguredException,
    InvalidTaskDelayException,
    InvalidTimeLimitTaskException,
)
from conveyor.tasks.publish import publish_calls

APP_DATA_KEY = "__kale__"  # Conveyor's app_data is a dict: a kale task's KaleEntry travels under this key


@dataclass(frozen=True)
class KaleEntry:
    """What ndkale's message body held besides the call: ids, app_data, counts, publisher, time."""

    task_id: Any = None
    app_data: Any = None
    retry_num: int = 0
    failure_num: int = 0
    publisher_data: str | None = None
    enqueued_time: float | None = None

    def pack(self) -> dict[str, Any]:
        """As a Conveyor app_data dict (plain data but for app_data itself)."""
        entry = {
            "id": self.task_id,
            "app_data": self.app_data,
            "retry_num": self.retry_num,
            "failure_num": self.failure_num,
            "_publisher": self.publisher_data,
            "_enqueued_time": self.enqueued_time,
        }
        return {APP_DATA_KEY: entry}

    @classmethod
    def unpack(cls, app_data: Mapping[str, Any] | None) -> KaleEntry | None:
        """The entry a delivery's app_data carries; None if it carries none (not published as a kale task).

        Messages published by the compat before ndkale 2.2.4's counts carry `[task_id, app_data]`.
        """
        if not isinstance(app_data, Mapping) or APP_DATA_KEY not in app_data:
            return None
        entry = app_data[APP_DATA_KEY]
        if isinstance(entry, (list, tuple)):
            return cls(*entry[:2])
        return cls(
            entry.get("id"),
            entry.get("app_data"),
            entry.get("retry_num") or 0,
            entry.get("failure_num") or 0,
            entry.get("_publisher"),
            entry.get("_enqueued_time"),
        )


class HeldRetries:
    """While a failed task's `handle_failure` runs: its re-publishes, held until it has decided.

    A context manager around the `handle_failure` call; `Publisher.publish` of the same task and
    task id inside it is held, not sent. Then `publish()` sends what was held (`handle_failure`
    returned True), or nothing is (it returned False, or raised).
    """

    def __init__(self, task_name: str | None, task_id: Any) -> None:
        self.task_name, self.task_id = task_name, task_id
        self.held: list[Callable[[], object]] = []
        self._token: contextvars.Token[HeldRetries | None] | None = None

    def holds(self, task_class: Any, task_id: Any) -> bool:
        """Whether a publish of `task_class` with `task_id` is this task's retry."""
        return task_id == self.task_id and getattr(task_class, "task_name", None) == self.task_name

    def __enter__(self) -> HeldRetries:
        self._token = _held.set(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._token is not None:
            _held.reset(self._token)
            self._token = None

    def publish(self) -> int:
        """Send the held re-publishes (outside the context); how many there were."""
        for send in self.held:
            send()
        return len(self.held)


_held: contextvars.ContextVar[HeldRetries | None] = contextvars.ContextVar("kale_held_retries", default=None)

_pool: QueuePool | None = None
_pool_lock = threading.Lock()


def endpoints(url: str) -> list[str]:
    """The `host:port` addresses of MESSAGE_QUEUE_ENDPOINT_URL (`tcp://h:p[,tcp://h:p...]`)."""
    if not url.strip():
        raise ImproperlyConfiguredException(
            "MESSAGE_QUEUE_ENDPOINT_URL is not set: set it to the Conveyor servers, 'tcp://HOST:PORT' (comma-separated "
            "for several), e.g. of `conveyor serve --port 7700`"
        )
    out = []
    for part in url.split(","):
        part = part.strip()
        u = urlsplit(part if "://" in part else "tcp://" + part)
        if u.scheme != "tcp" or not u.hostname or u.port is None:
            raise ImproperlyConfiguredException(
                f"MESSAGE_QUEUE_ENDPOINT_URL: {part!r} is not a Conveyor server address 'tcp://HOST:PORT' "
                "(SQS and ElasticMQ URLs are not served by Conveyor)"
            )
        out.append(u.netloc)
    return out


def get_pool() -> QueuePool:
    """This process's pool over the configured servers (made on first use).

    It is told the queue YAML's configurations so that publishing checks time limits against them.
    """
    global _pool
    with _pool_lock:
        if _pool is None:
            s = settings.current()
            queues = ShardedQueues.connect(endpoints(s.MESSAGE_QUEUE_ENDPOINT_URL), s.CONVEYOR_TOKEN)
            _pool = QueuePool(queues, queue_configs=queue_info.served_configs())
        return _pool


def reset_pool() -> None:
    """Forget (and close) this process's pool: the next use connects anew, after new settings."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.close()


def _accepts(task_class: Any, kwarg: str) -> bool:
    """Whether the task's run_task takes `kwarg` (by name or through **kwargs)."""
    params = inspect.signature(task_class.run_task).parameters.values()
    return any(p.kind is p.VAR_KEYWORD or (p.name == kwarg and p.kind is not p.POSITIONAL_ONLY) for p in params)


class Publisher:
    """Publishes kale tasks (ndkale's `Publisher`); `Task.publish` uses one.

    `task_class` is a `conveyor.compat.kale.task.Task` subclass (typed Any: that module imports this
    one).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to set up: the pool is this process's (`get_pool`), made on first publish.

        Arguments are accepted for ndkale's signature (its SQS connection's), and unused.
        """

    def publish(
        self,
        task_class: Any,
        task_id: Any,
        payload: Mapping[str, Any],
        current_retry_num: int | None = None,
        current_failure_num: int | None = None,
        delay_sec: float | None = None,
    ) -> int | None:
        """Publish `payload` ({'args', 'kwargs', 'app_data'}) as a run of `task_class`, visible after `delay_sec` seconds.

        `current_retry_num` and `current_failure_num` are the counts the run starts with (ndkale's;
        0 for a new task). Returns the Conveyor message id, or None for a retry held while its
        task's `handle_failure` decides (`HeldRetries`).
        """
        held = _held.get()
        if held is not None and held.holds(task_class, task_id):
            held.held.append(
                functools.partial(self.publish, task_class, task_id, payload, current_retry_num, current_failure_num, delay_sec)
            )
            return None
        if delay_sec is not None and not (
            isinstance(delay_sec, (int, float))
            and not isinstance(delay_sec, bool)
            and math.isfinite(delay_sec)
            and delay_sec >= 0
        ):
            raise InvalidTaskDelayException(f"Invalid task delay_sec {delay_sec!r}: a number of seconds >= 0")
        name = task_class._checked_name()  # a class that can be published: it implements run_task
        if task_class.queue is None:
            raise ImproperlyConfiguredException(f"task {name} has no queue: set its `queue` class attribute")
        pool = get_pool()
        queue = queue_info.QueueInfo().get_queue(task_class.queue)
        limit = task_class.time_limit
        if limit is not None and limit >= queue.visibility_timeout_sec:
            raise InvalidTimeLimitTaskException(
                f"Invalid task time limit: {limit:g} >= {queue.visibility_timeout_sec:g} from {settings.current().QUEUE_CONFIG}"
            )
        args = tuple(payload.get("args") or ())
        kwargs = dict(payload.get("kwargs") or {})
        if "delay_sec" in kwargs and not _accepts(task_class, "delay_sec"):
            del kwargs["delay_sec"]  # ndkale hands it to run_task too; one that cannot take it never sees it
        s = settings.current()
        entry = KaleEntry(
            task_id,
            payload.get("app_data"),
            current_retry_num or 0,
            current_failure_num or 0,
            s.PUBLISHER_STR_FUNC(),
            s.TIMESTAMP_FUNC(),
        )
        app_data = entry.pack()
        options = task_class._publish_options()
        if queue.name != options.queue:  # QUEUE_CLASS decorates the name: the task goes to the queue so named
            options = dataclasses.replace(options, queue=queue.name)
        handles = publish_calls(name, options, task_class._sig, [(args, kwargs, app_data)], delay_sec or None, None, None, pool)
        return handles[0].id
