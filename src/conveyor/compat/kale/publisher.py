"""ndkale's publisher (`kale.publisher.Publisher`) over a Conveyor `QueuePool`, and the pool itself.

Where the servers are: MESSAGE_QUEUE_ENDPOINT_URL, ndkale's setting, given Conveyor servers as
`tcp://host:port` (several comma-separated: a pool over them); CONVEYOR_TOKEN is their token, if
they use one. There is no default server: a publisher and a worker in different processes must
meet at one address, so an unset endpoint is an error that says what to set.
"""

from __future__ import annotations

import inspect
import math
import threading
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

APP_DATA_KEY = "__kale__"  # Conveyor's app_data is a dict: a kale task's [task_id, app_data] travel under this key

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
            _pool = QueuePool(queues, queue_configs=queue_info.load_configs())
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

    def publish(
        self,
        task_class: Any,
        task_id: str,
        payload: dict[str, Any],
        current_retry_num: int | None = None,
        delay_sec: float | None = None,
    ) -> int:
        """Publish `payload` ({'args', 'kwargs', 'app_data'}) as a run of `task_class`, visible after `delay_sec` seconds.

        Returns the Conveyor message id. `current_retry_num` is accepted for ndkale's signature:
        Conveyor counts attempts itself.
        """
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
        app_data = {APP_DATA_KEY: [task_id, payload.get("app_data")]}
        handles = publish_calls(
            name, task_class._publish_options(), task_class._sig, [(args, kwargs, app_data)], delay_sec or None, None, None, pool
        )
        return handles[0].id
