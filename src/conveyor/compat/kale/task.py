"""ndkale 2.2.4's `kale.task.Task` over `conveyor.Task`: ndkale's class attributes, hooks, `publish` and retries.

`run` is ndkale's (its hooks around `run_task`, `_clean_task_environment` given the exception);
`run_call`, Conveyor's entry point, does what ndkale's worker did with a message: `should_run_task`
and `run` under `time_limit`, then `handle_failure` on a failure. Retries are ndkale 2.2.4's:
decided on `task_failure_num` (never for `EXCEPTION_LIST`, up to `max_retries`, None or 0 for
none) and made by re-publishing the task (`republish`) after `_get_delay_sec_for_retry(retry_num)`
seconds (`(1 << retry) * _retry_delay_multiple` capped at `SQS_MAX_TASK_DELAY_SEC`). Settings are
never read when a class is defined, only when a task is published, run or fails. Importing this
module lets the worker find a task by its `module.Class` name (importing the module), as ndkale
did, and through TASK_MAPPER.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

import conveyor.tasks.definition as definition
from conveyor.compat.kale import exceptions, publisher, settings, timeout
from conveyor.compat.kale.message import KaleMessage
from conveyor.constants import DEFAULT_QUEUE
from conveyor.errors import TaskOptionError
from conveyor.message import Message
from conveyor.tasks.envelope import Call
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

        The worker passes the app_data the delivery carried (its `KaleEntry`) and the message;
        ndkale's tests build one as `MyTask()` or from ndkale's message body,
        `MyTask({'id': ..., 'payload': {'app_data': ...}, '_publisher': ..., '_enqueued_time': ...})`.
        """
        super().__init__(None, message)
        body = message_body if isinstance(message_body, Mapping) else {}
        self._entry = publisher.KaleEntry.unpack(body)
        if self._entry is not None:
            self.task_id, self.app_data = self._entry.task_id, self._entry.app_data
            self._publisher_data, self._enqueued_time = self._entry.publisher_data, self._entry.enqueued_time or 0
        else:
            self.task_id = body.get("id")
            self.app_data = (body.get("payload") or {}).get("app_data")
            self._publisher_data = body.get("_publisher")
            self._enqueued_time = body.get("_enqueued_time", 0)
        self._dequeued_time: float | None = None
        self._start_time: float | None = None
        self._end_time: float | None = None
        self._task_latency_sec = 0.0
        self._dequeued()

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

    @classmethod
    def republish(cls, message: KaleMessage, failure_count: int) -> None:
        """Publish the task of `message` again: its retry, or a run put off by `should_run_task`.

        As ndkale 2.2.4: same task id, arguments and app_data; `task_retry_num` one more (it always
        counts), `task_failure_num` as given; visible after `_get_delay_sec_for_retry(retry_num)`.
        """
        payload = {"args": message.task_args, "kwargs": message.task_kwargs, "app_data": message.task_app_data}
        delay_sec = cls._get_delay_sec_for_retry(message.task_retry_num)
        cls._get_publisher().publish(
            cls,
            message.task_id,
            payload,
            current_retry_num=message.task_retry_num + 1,
            current_failure_num=failure_count,
            delay_sec=delay_sec,
        )

    # --- running: what ndkale's worker did with a message ------------------------------------------
    @classmethod
    def run_call(cls, call: Call, message: Message | None = None) -> None:
        """Run one delivery, as ndkale's worker ran a message (Conveyor's entry point).

        Under `time_limit` (in a main thread): `should_run_task`, then `run`. A run put off by
        `should_run_task` is re-published (`republish`, the failure count unchanged) and this
        delivery acked. A failure goes to `handle_failure` (`_handle_failure`). The result of
        `run_task` is dropped, as ndkale did: only whether it raised counts.
        """
        task = cls(call.app_data, message)
        kale_msg = task._kale_message(call.args, call.kwargs)
        try:
            with timeout.Alarm(task.time_limit):
                if not task.should_run_task(*call.args, **call.kwargs):
                    cls.republish(kale_msg, kale_msg.task_failure_num)
                    log.info("Task %s put off by should_run_task: re-published", kale_msg.task_id)
                    return
                task.run(*call.args, **call.kwargs)
        except Exception as exc:
            task._handle_failure(kale_msg, exc)

    def _kale_message(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> KaleMessage:
        """The KaleMessage of this delivery, `task_inst` this task.

        Its counts are those it was published with, plus the deliveries Conveyor itself made again
        (the task's process died, it ran past its queue's visibility timeout, or `handle_failure`
        retried it without re-publishing): each counts as a retry and a failure.
        """
        entry = self._entry if self._entry is not None else publisher.KaleEntry(self.task_id, self.app_data)
        again = max(self.attempt - 1, 0)
        msg = KaleMessage(
            sqs_message_id=self.message.id if self.message is not None else None,
            sqs_queue_name=self.message.queue if self.message is not None else None,
            task_class=type(self),
            task_id=self.task_id,
            payload={"args": args, "kwargs": kwargs, "app_data": self.app_data},
            current_retry_num=entry.retry_num + again,
            current_failure_num=entry.failure_num + again,
            enqueued_time=entry.enqueued_time,
            publisher_data=entry.publisher_data,
        )
        msg.task_inst = self
        return msg

    def _handle_failure(self, message: KaleMessage, exc: Exception) -> None:
        """After a failed run: ask the class's `handle_failure`, then settle the delivery as it said.

        False: no retry, the delivery fails now (to its queue's dead letters). True with a
        re-publish (held meanwhile, `publisher.HeldRetries`): the retry is sent and this delivery
        acked, as ndkale deleted it. True without one: Conveyor retries this delivery (a nack,
        after `_get_delay_sec_for_retry`). An exception inside `handle_failure`, or a retry that
        cannot be published, is logged and noted on `exc`; Conveyor then retries the delivery, so
        the task is not lost.
        """
        cls = type(self)
        held = publisher.HeldRetries(cls.task_name, message.task_id)
        trouble: Exception | None = None
        try:
            with held:
                retried = bool(cls.handle_failure(message, exc))
        except Exception as e:
            trouble, retried = e, True
            log.exception("task %s: handle_failure raised while handling %r", cls.task_name, exc)
        if trouble is None and not retried:
            if held.held:  # ndkale would have sent it as well as dead-lettering the task: a retry it did not want
                log.info("task %s: handle_failure returned False after re-publishing: the re-publish is dropped", cls.task_name)
            fail_without_retry()
            raise exc
        if trouble is None:
            try:
                if held.publish():
                    return  # the retry is a new message: this delivery is done
            except Exception as e:
                trouble = e
                log.exception("task %s: its retry could not be published: the delivery is retried instead", cls.task_name)
        if trouble is not None:
            exc.add_note(f"(handling the failure raised {type(trouble).__name__}: {trouble}; the delivery is retried)")
        raise exc

    def run(self, *args: Any, **kwargs: Any) -> None:
        """Run the task with ndkale's hooks; raises what the task raised.

        `_setup_task_environment`, `_pre_run`, `_check_blacklist`, `run_task`, `_post_run`, then
        `_clean_task_environment(task_id=..., task_name=...)`. If any of them raises, the latency is
        recorded and `_clean_task_environment(task_id=..., task_name=..., exc=exc)` runs (an error in
        it is logged and noted on `exc`), then `exc` is raised. `handle_failure` is the worker's to
        call (`run_call`), as in ndkale.
        """
        try:
            self._setup_task_environment()
            self._pre_run(*args, **kwargs)
            self._check_blacklist(*args, **kwargs)
            self.run_task(*args, **kwargs)
            self._post_run(*args, **kwargs)
        except Exception as exc:
            self._end_time = time.time()
            if self._start_time is not None:
                self._task_latency_sec = self._end_time - self._start_time
            clean = functools.partial(self._clean_task_environment, task_id=self.task_id, task_name=self.task_name, exc=exc)
            self._guarded(exc, "_clean_task_environment", clean)
            raise
        self._clean_task_environment(task_id=self.task_id, task_name=self.task_name)

    def run_task(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError()

    def should_run_task(self, *args: Any, **kwargs: Any) -> bool:
        """Whether to run this delivery now; False re-publishes it for later (`republish`) instead."""
        return True

    @classmethod
    def handle_failure(cls, message: KaleMessage, raised_exception: Exception, increment_failure_num: bool = True) -> bool:
        """Whether the failed task will be retried (ndkale 2.2.4's rules); override to add your own.

        Never for an `EXCEPTION_LIST` exception, nor with `max_retries` None or 0, nor once
        `message.task_failure_num` has reached `max_retries`. Otherwise the task is re-published
        (`republish`) with its failure count one more, or the same with `increment_failure_num=False`
        (a failure that should not count), and True returned.
        """
        log.warning("Task %s failed: %s.", message.task_id, raised_exception)
        task_inst = getattr(message, "task_inst", None)
        if isinstance(raised_exception, exceptions.TimeoutException) and task_inst is not None:
            task_inst._kill_runtime_exceeded()
        if isinstance(raised_exception, tuple(cls.EXCEPTION_LIST)):
            cls._report_permanent_failure(message, raised_exception, PERMANENT_FAILURE_UNRECOVERABLE, True)
            return False
        if cls.max_retries is None or cls.max_retries <= 0:
            cls._report_permanent_failure(message, raised_exception, PERMANENT_FAILURE_NO_RETRY, True)
            return False
        if message.task_failure_num >= cls.max_retries:
            cls._report_permanent_failure(message, raised_exception, PERMANENT_FAILURE_RETRIES_EXCEEDED, False)
            return False
        cls.republish(message, message.task_failure_num + 1 if increment_failure_num else message.task_failure_num)
        return True

    @classmethod
    def _get_delay_sec_for_retry(cls, current_retry_num: int) -> float:
        """Seconds before retry `current_retry_num + 1` may run (ndkale's backoff); override for your own.

        `republish` asks it, in the process that ran the task; the worker asks it too for a delivery
        Conveyor retries itself.
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
        """Clean up after a task; `exc` is what it raised (not passed after a success, as ndkale)."""

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
