"""ndkale's `kale.task.Task` over `conveyor.Task`: ndkale's class attributes, hooks and `publish`.

ndkale's hooks are called from Conveyor's: `before_run` -> `_setup_task_environment`, `_pre_run`,
`_check_blacklist`; `after_run` -> `_post_run`; `on_failure` -> the classmethod `handle_failure`;
`cleanup` -> `_clean_task_environment`. Whether a failure is retried is what `handle_failure`
returns (ndkale's rules: never for `EXCEPTION_LIST`, up to `max_retries`, None or 0 for none);
the kale worker then nacks it after the class's `_get_delay_sec_for_retry(retry_num)` seconds
(ndkale's `(1 << retry) * _retry_delay_multiple` capped at `SQS_MAX_TASK_DELAY_SEC`). Settings are
never read when a class is defined, only when a task is published or fails. Importing this module
lets the worker find a task by its `module.Class` name (importing the module), as ndkale did, and
through TASK_MAPPER.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import signal
import threading
import time
import uuid
from typing import Any, ClassVar

import conveyor.tasks.definition as definition
from conveyor.compat.kale import exceptions, publisher, settings
from conveyor.compat.kale.message import KaleMessage
from conveyor.constants import DEFAULT_QUEUE
from conveyor.errors import TaskOptionError
from conveyor.message import Message
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.policy import Backoff, Jitter
from conveyor.tasks.registry import RegisteredTask, registry
from conveyor.tasks.runner import fail_without_retry

log = logging.getLogger(__name__)

PERMANENT_FAILURE_UNRECOVERABLE = "unrecoverable"
PERMANENT_FAILURE_NO_RETRY = "no_retries"
PERMANENT_FAILURE_RETRIES_EXCEEDED = "max_retries"

publisher_inst: publisher.Publisher | None = None


def _publish(cls: type[Task], /, app_data: Any, *args: Any, **kwargs: Any) -> str:
    """Publish a run with any picklable `app_data`; `delay_sec=` delays it. Returns the task id."""
    task_id = cls._get_task_id(*args, **kwargs)
    payload = {"args": args, "kwargs": kwargs, "app_data": app_data}
    cls._get_publisher().publish(cls, task_id, payload, delay_sec=kwargs.get("delay_sec"))
    return task_id


class _Setting:
    """A class attribute that reads a kale setting when read.

    ndkale reads it at class definition; here no settings are read then. `_retry_delay_multiple` is
    RETRY_DELAY_MULTIPLE_SEC unless set.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        return getattr(settings.current(), self.name)


class Task(definition.Task, abstract=True):
    """Base class of kale tasks: implement `run_task`, publish with `MyTask.publish(app_data, ...)`."""

    _retry_delay_multiple: ClassVar[Any] = _Setting("RETRY_DELAY_MULTIPLE_SEC")
    # ndkale's types are wider than conveyor.Task's (None: no retries, no queue yet): Any, and
    # `_task_options` turns them into Conveyor's options
    max_retries: ClassVar[Any] = 4
    target_runtime: ClassVar[float | None] = 50
    time_limit: ClassVar[float | None] = 60
    EXCEPTION_LIST: ClassVar[tuple[type[BaseException], ...]] = (
        exceptions.BlacklistedException,
        KeyError,
        NotImplementedError,
        SyntaxError,
        UnboundLocalError,
    )
    queue: ClassVar[Any] = None
    # ndkale's task ids are the publisher's strings (conveyor.Task's: the message id), app_data anything
    task_id: Any
    app_data: Any

    def __init_subclass__(cls, *, abstract: bool = False, **kwargs: Any) -> None:
        # a subclass that does not implement run_task is a shared base: not registered (as in conveyor.Task)
        super().__init_subclass__(abstract=abstract or cls.run_task is Task.run_task, **kwargs)

    @classmethod
    def _task_options(cls) -> TaskOptions:
        """The options at class definition: no settings read (the backoff is set at publish time)."""
        return TaskOptions(
            queue=cls.queue or DEFAULT_QUEUE,
            time_limit=cls.time_limit,
            max_retries=max(cls.max_retries or 0, 0),
            no_retry=tuple(cls.EXCEPTION_LIST),
        )

    @classmethod
    def _publish_options(cls) -> TaskOptions:
        """The options a publish sends: with ndkale's backoff from the settings now.

        The backoff is for a consumer that does not ask `_get_delay_sec_for_retry` (the kale worker
        does).
        """
        cap = settings.current().SQS_MAX_TASK_DELAY_SEC
        backoff = Backoff(min(cls._retry_delay_multiple, cap), 2, cap, Jitter.NONE)
        return dataclasses.replace(cls.options, retry_backoff=backoff)

    @classmethod
    def _checked_name(cls) -> str:
        if cls.run_task is Task.run_task:
            raise TaskOptionError(f"{cls.__qualname__} does not implement run_task: it cannot be published")
        return super()._checked_name()

    def __init__(self, message_body: Any = None, message: Message | None = None, *args: Any, **kwargs: Any) -> None:
        """From a delivery, or as ndkale's tests build one.

        Conveyor passes the app_data the delivery carried and the message; ndkale's tests build one
        as `MyTask()` or `MyTask({'id': ..., 'payload': {'app_data': ...}})`.
        """
        super().__init__(None, message)
        body = message_body if isinstance(message_body, dict) else {}
        if publisher.APP_DATA_KEY in body:
            self.task_id, self.app_data = body[publisher.APP_DATA_KEY]
        else:
            self.task_id = body.get("id")
            self.app_data = (body.get("payload") or {}).get("app_data")
        self._start_time: float | None = None
        self._end_time: float | None = None
        self._task_latency_sec = 0.0
        self._dequeued_time = time.time()
        self._alarm: _Alarm | None = None

    # --- publishing ------------------------------------------------------------------------------
    @staticmethod
    def _get_publisher() -> publisher.Publisher:
        global publisher_inst
        if publisher_inst is None:
            publisher_inst = publisher.Publisher()
        return publisher_inst

    @classmethod
    def _get_task_id(cls, *args: Any, **kwargs: Any) -> str:
        """A unique id for a published task; override for more descriptive ids."""
        return f"{cls.__name__}_uuid_{uuid.uuid1()}"

    # ndkale's signature (any app_data, returns the task id) is not conveyor.Task's: typed Any
    publish: ClassVar[Any] = classmethod(_publish)

    # --- running: Conveyor's hooks call ndkale's --------------------------------------------------
    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Run with the hooks, under `time_limit` in a main thread.

        In a main thread (a worker's task process) `time_limit` raises `TimeoutException` inside the
        task, as ndkale's SIGALRM did, so `handle_failure` sees it (the limit ends before
        `handle_failure` runs, as in ndkale).
        """
        with _Alarm(self.time_limit) as self._alarm:
            return super().run(*args, **kwargs)

    def before_run(self, *args: Any, **kwargs: Any) -> None:
        self._setup_task_environment()
        self._pre_run(*args, **kwargs)
        self._check_blacklist(*args, **kwargs)

    def after_run(self, result: Any, *args: Any, **kwargs: Any) -> None:
        self._post_run(*args, **kwargs)

    def on_failure(self, exc: Exception, *args: Any, **kwargs: Any) -> None:
        if self._alarm is not None:
            self._alarm.cancel()
        if self._start_time is not None:
            self._end_time = time.time()
            self._task_latency_sec = self._end_time - self._start_time
        kale_id = self.task_id if isinstance(self.task_id, str) else None
        msg_id = self.message.id if self.message is not None else None
        msg = KaleMessage(msg_id, kale_id, self.task_name, args, kwargs, self.app_data, max(self.attempt - 1, 0), self)
        if not type(self).handle_failure(msg, exc):
            fail_without_retry()  # the message fails now, to the dead letters

    def cleanup(self, exc: Exception | None) -> None:
        if self._alarm is not None:  # the time limit is the task's: its clean-up, after success too, is not timed
            self._alarm.cancel()
        self._clean_task_environment(task_id=self.task_id, task_name=self.task_name, exc=exc)

    def run_task(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError()

    @classmethod
    def handle_failure(cls, message: KaleMessage, raised_exception: Exception) -> bool:
        """Whether the failed task will be retried (ndkale's rules; override to add your own)."""
        log.warning("Task %s failed: %s.", message.task_id, raised_exception)
        if isinstance(raised_exception, exceptions.TimeoutException) and message.task_inst is not None:
            message.task_inst._kill_runtime_exceeded()
        if isinstance(raised_exception, tuple(cls.EXCEPTION_LIST)):
            cls._report_permanent_failure(message, raised_exception, PERMANENT_FAILURE_UNRECOVERABLE, True)
            return False
        if cls.max_retries is None or cls.max_retries <= 0:
            cls._report_permanent_failure(message, raised_exception, PERMANENT_FAILURE_NO_RETRY, True)
            return False
        if message.task_retry_num >= cls.max_retries:
            cls._report_permanent_failure(message, raised_exception, PERMANENT_FAILURE_RETRIES_EXCEEDED, False)
            return False
        return True

    @classmethod
    def _get_delay_sec_for_retry(cls, current_retry_num: int) -> float:
        """Seconds the kale worker waits before retry `current_retry_num + 1` (ndkale's backoff).

        Override for your own: the worker calls it on every retry.
        """
        delay: float = min((1 << current_retry_num) * cls._retry_delay_multiple, settings.current().SQS_MAX_TASK_DELAY_SEC)
        return delay

    def _check_blacklist(self, *args: Any, **kwargs: Any) -> None:
        """Raise (BlacklistedException) for a task that must not run."""

    def _dequeued(self, *args: Any, **kwargs: Any) -> None:
        self._dequeued_time = time.time()

    @staticmethod
    def _setup_task_environment() -> None:
        """Set up the environment a task runs in."""

    @staticmethod
    def _clean_task_environment(task_id: Any = None, task_name: str | None = None, exc: Exception | None = None) -> None:
        """Clean up after a task (exc: what it raised, None on success)."""

    def _pre_run(self, *args: Any, **kwargs: Any) -> None:
        self._start_time = time.time()

    def _post_run(self, *args: Any, **kwargs: Any) -> None:
        self._end_time = time.time()
        self._task_latency_sec = self._end_time - (self._start_time or self._end_time)
        if self.target_runtime and self._task_latency_sec >= self.target_runtime:
            self._alert_runtime_exceeded()

    def _alert_runtime_exceeded(self, *args: Any, **kwargs: Any) -> None:
        """Called after a run that took `target_runtime` seconds or more."""

    def _kill_runtime_exceeded(self, *args: Any, **kwargs: Any) -> None:
        """Called from handle_failure when the task was stopped by its time limit."""

    @classmethod
    def _report_permanent_failure(
        cls, message: KaleMessage, exception: BaseException, failure_type: str, log_exception: bool
    ) -> None:
        log.error(
            "PERMANENT_TASK_FAILURE: FAILURE_TYPE=%s TASK_TYPE=%s TASK_ID=%s, TRACEBACK=%s",
            failure_type,
            message.task_name,
            message.task_id,
            exception,
        )


class _Alarm:
    """Raises TimeoutException in this thread `seconds` after entry, until cancelled or left.

    Only a main thread receives signals; elsewhere Conveyor's own time limit stops the task from
    outside.
    """

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.armed = bool(seconds) and threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
        self._previous: Any = None

    def __enter__(self) -> _Alarm:
        if self.armed:
            self._previous = signal.signal(signal.SIGALRM, self._expired)
            signal.setitimer(signal.ITIMER_REAL, self.seconds or 0)
        return self

    def _expired(self, signum: int, frame: object) -> None:
        if self.armed:
            raise exceptions.TimeoutException(f"task ran past its time_limit of {self.seconds:g} s")

    def cancel(self) -> None:
        if self.armed:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)

    def __exit__(self, *exc: object) -> None:
        self.cancel()


def _resolve(name: str) -> RegisteredTask | None:
    """A kale task by the name a message carries: through TASK_MAPPER, else by importing its module.

    None if there is none (the registry then raises UnknownTaskError, never retried).
    """
    path = settings.current().TASK_MAPPER.get(name, name)
    module, _, attr = path.rpartition(".")
    if not module:
        return None
    try:
        found = getattr(importlib.import_module(module), attr, None)
    except ImportError:
        return None
    if isinstance(found, type) and issubclass(found, Task) and found.task_name == path:
        return found if found.run_task is not Task.run_task else None
    return None


registry.add_resolver(_resolve)
