"""Defining tasks: `@task` functions and `Task` classes (ndkale style).

They register by name and publish through a `Publisher` (see conveyor.tasks.publish).

Publish options are keyword-only with a leading underscore (`_delay`, `_priority`, `_key`,
`_pool`) so they never collide with a task's own arguments. See docs/tasks.md.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Generic, ParamSpec, TypeVar, overload

from conveyor.constants import DEFAULT_MAX_RETRIES, DEFAULT_QUEUE
from conveyor.errors import TaskOptionError
from conveyor.message import Message
from conveyor.tasks.envelope import Call
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.policy import DEFAULT_BACKOFF, BackoffSpec, backoff_delay
from conveyor.tasks.publish import (
    ArgCheck,
    Args,
    Publisher,
    TaskHandle,
    arg_check,
    build_message,
    calls_of,
    default_pool,
    get_default_pool,
    publish_calls,
    set_default_pool,
)
from conveyor.tasks.registry import Registry
from conveyor.tasks.registry import registry as default_registry
from conveyor.tasks.runner import is_async_callable, run_message

__all__ = [
    "Args",
    "Publisher",
    "Task",
    "TaskFunction",
    "TaskHandle",
    "backoff_delay",
    "build_message",
    "default_pool",
    "get_default_pool",
    "run_message",
    "set_default_pool",
    "task",
]

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


# --- function tasks -----------------------------------------------------------------------------
class TaskFunction(Generic[P, R]):
    """A function made a task by `@task`: still callable directly, and publishable.

    task_name: its registered name. options: its TaskOptions. fn: the plain function.
    """

    def __init__(
        self, fn: Callable[P, R], options: TaskOptions, name: str | None = None, registry: Registry | None = None
    ) -> None:
        if not callable(fn):
            raise TaskOptionError(f"@task needs a callable, got {type(fn).__name__}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.options = options
        self.is_async = is_async_callable(fn)  # run_call returns its coroutine: awaited on the worker's loop
        self.task_name = name if name is not None else f"{fn.__module__}.{fn.__qualname__}"
        self._sig = arg_check(fn, drop_first=False)
        self._registry = default_registry if registry is None else registry
        self._registry.register(self.task_name, self)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def publish(
        self,
        *args: Any,
        _delay: float | None = None,
        _priority: int | None = None,
        _key: str | None = None,
        _pool: Publisher | None = None,
        **kwargs: Any,
    ) -> TaskHandle:
        """Publish one call.

        `_delay` s before it may run, `_priority` overrides the task's, `_key` is an idempotency
        key, `_pool` the publisher (else the default pool).
        """
        return publish_calls(self.task_name, self.options, self._sig, [(args, kwargs, None)], _delay, _priority, _key, _pool)[0]

    def publish_many(
        self,
        items: Iterable[tuple[Any, ...] | Args],
        *,
        _delay: float | None = None,
        _priority: int | None = None,
        _pool: Publisher | None = None,
    ) -> list[TaskHandle]:
        """Publish many calls in one put: each item a tuple of positional arguments or an `Args(...)`."""
        return publish_calls(
            self.task_name, self.options, self._sig, calls_of(items, self.task_name), _delay, _priority, None, _pool
        )

    def run_call(self, call: Call, message: Message | None = None) -> R:
        return self.fn(*call.args, **call.kwargs)

    def __reduce__(self) -> tuple[Callable[[str], TaskFunction[Any, Any]], tuple[str]]:
        # by name: unpickling yields the registered object instead of registering a copy
        return _registered_function, (self.task_name,)

    def __repr__(self) -> str:
        return f"<task {self.task_name} queue={self.options.queue!r}>"


def _registered_function(name: str) -> TaskFunction[Any, Any]:
    t = default_registry.get(name)
    if not isinstance(t, TaskFunction):
        raise TypeError(f"task {name!r} is not a function task")
    return t


@overload
def task(fn: Callable[P, R], /) -> TaskFunction[P, R]: ...
@overload
def task(
    *,
    queue: str = ...,
    priority: int = ...,
    time_limit: float | None = ...,
    max_retries: int = ...,
    retry_backoff: BackoffSpec = ...,
    no_retry: tuple[type[BaseException], ...] = ...,
    name: str | None = ...,
    registry: Registry | None = ...,
) -> Callable[[Callable[P, R]], TaskFunction[P, R]]: ...
def task(
    fn: Callable[P, R] | None = None,
    /,
    *,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    time_limit: float | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    retry_backoff: BackoffSpec = DEFAULT_BACKOFF,
    no_retry: tuple[type[BaseException], ...] = (),
    name: str | None = None,
    registry: Registry | None = None,
) -> TaskFunction[P, R] | Callable[[Callable[P, R]], TaskFunction[P, R]]:
    """Make a function a task, bare (`@task`) or with options (`@task(queue="io", max_retries=5)`).

    Options are checked here (TaskOptionError). `name` overrides the registered name
    (default `module.qualname`); `registry` registers elsewhere than the process-wide registry.
    """
    options = TaskOptions(
        queue=queue,
        priority=priority,
        time_limit=time_limit,
        max_retries=max_retries,
        retry_backoff=retry_backoff,
        no_retry=no_retry,
    )

    def wrap(f: Callable[P, R]) -> TaskFunction[P, R]:
        return TaskFunction(f, options, name, registry)

    return wrap if fn is None else wrap(fn)


# --- class tasks (ndkale style) -----------------------------------------------------------------
class Task:
    """Base class of class tasks: implement `run_task`, publish with `MyTask.publish(app_data, ...)`.

    Options are class attributes (`queue`, `priority`, `time_limit`, `max_retries`,
    `retry_backoff`, `no_retry`), checked when the class is defined. A subclass registers as
    `module.qualname`, or `class MyTask(Task, name="..."):`; one that does not override `run_task`
    (a shared base) or passes `abstract=True` is not registered.

    A run, `run(*args, **kwargs)`, calls the hooks in this order:
      before_run(*args, **kwargs) -> run_task(*args, **kwargs) -> after_run(result, *args, **kwargs)
      -> cleanup(None); and returns run_task's result.
    If any of the first three raises: on_failure(exc, *args, **kwargs) -> cleanup(exc) -> re-raise.
    An exception inside on_failure or (after a failure) cleanup is logged and noted on the original
    error, never raised in its place. A time limit stops a task from outside: its hooks do not run.
    """

    queue: ClassVar[str] = DEFAULT_QUEUE
    priority: ClassVar[int] = 0
    time_limit: ClassVar[float | None] = None
    max_retries: ClassVar[int] = DEFAULT_MAX_RETRIES
    retry_backoff: ClassVar[BackoffSpec] = DEFAULT_BACKOFF
    no_retry: ClassVar[tuple[type[BaseException], ...]] = ()
    options: ClassVar[TaskOptions] = TaskOptions()
    task_name: ClassVar[str] = ""
    is_async: ClassVar[bool] = False  # run() is plain: its hooks run around a plain run_task
    _sig: ClassVar[ArgCheck | None] = None

    def __init_subclass__(
        cls, *, name: str | None = None, abstract: bool = False, registry: Registry | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        try:
            cls.options = cls._task_options()
        except TaskOptionError as e:
            raise TaskOptionError(f"task class {cls.__module__}.{cls.__qualname__}: {e}") from None
        cls.task_name = name if name is not None else f"{cls.__module__}.{cls.__qualname__}"
        cls._sig = arg_check(cls.run_task, drop_first=True)
        if not abstract and cls.run_task is not Task.run_task:
            (default_registry if registry is None else registry).register(cls.task_name, cls)

    @classmethod
    def _task_options(cls) -> TaskOptions:
        """The options the class attributes give; a subclass with attributes of its own (the ndkale compat's) overrides this."""
        return TaskOptions(
            queue=cls.queue,
            priority=cls.priority,
            time_limit=cls.time_limit,
            max_retries=cls.max_retries,
            retry_backoff=cls.retry_backoff,
            no_retry=cls.no_retry,
        )

    def __init__(self, app_data: dict[str, Any] | None = None, message: Message | None = None) -> None:
        """app_data: the data published with the task. message: the delivery (None when run directly)."""
        self.app_data = app_data
        self.message = message
        self.task_id = message.id if message is not None else None
        self.attempt = message.attempts if message is not None else 0

    @classmethod
    def publish(
        cls,
        app_data: dict[str, Any] | None,
        *args: Any,
        _delay: float | None = None,
        _priority: int | None = None,
        _key: str | None = None,
        _pool: Publisher | None = None,
        **kwargs: Any,
    ) -> TaskHandle:
        """Publish one run of this task with `app_data` (a dict, or None) and its arguments."""
        return publish_calls(
            cls._checked_name(), cls.options, cls._sig, [(args, kwargs, app_data)], _delay, _priority, _key, _pool
        )[0]

    @classmethod
    def publish_many(
        cls,
        app_data: dict[str, Any] | None,
        items: Iterable[tuple[Any, ...] | Args],
        *,
        _delay: float | None = None,
        _priority: int | None = None,
        _pool: Publisher | None = None,
    ) -> list[TaskHandle]:
        """Publish many runs sharing `app_data` in one put (items as for `TaskFunction.publish_many`)."""
        name = cls._checked_name()
        return publish_calls(name, cls.options, cls._sig, calls_of(items, name, app_data), _delay, _priority, None, _pool)

    @classmethod
    def _checked_name(cls) -> str:
        if cls is Task or cls.run_task is Task.run_task:
            raise TaskOptionError(f"{cls.__qualname__} does not implement run_task: it cannot be published")
        return cls.task_name

    @classmethod
    def run_call(cls, call: Call, message: Message | None = None) -> Any:
        return cls(call.app_data, message).run(*call.args, **call.kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task with its hooks (see the class docstring for the order)."""
        try:
            self.before_run(*args, **kwargs)
            result = self.run_task(*args, **kwargs)
            self.after_run(result, *args, **kwargs)
        except Exception as exc:
            self._guarded(exc, "on_failure", self.on_failure, exc, *args, **kwargs)
            self._guarded(exc, "cleanup", self.cleanup, exc)
            raise
        self.cleanup(None)
        return result

    def _guarded(self, exc: Exception, hook: str, fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as e:
            log.exception("task %s: %s hook raised while handling %r", self.task_name, hook, exc)
            add_note = getattr(exc, "add_note", None)  # Python 3.11+
            if add_note is not None:
                add_note(f"(the {hook} hook also raised {type(e).__name__}: {e})")

    def run_task(self, *args: Any, **kwargs: Any) -> Any:
        """The task's work; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement run_task")

    def before_run(self, *args: Any, **kwargs: Any) -> None:
        """Called just before run_task (ndkale's `_pre_run`)."""

    def after_run(self, result: Any, *args: Any, **kwargs: Any) -> None:
        """Called after run_task returned `result`; not after a failure (ndkale's `_post_run`)."""

    def on_failure(self, exc: Exception, *args: Any, **kwargs: Any) -> None:
        """Called when before_run, run_task or after_run raised `exc` (ndkale's `handle_failure`).

        Whether the message is retried is decided by `max_retries` and `no_retry`.
        """

    def cleanup(self, exc: Exception | None) -> None:
        """Called last in every run, with the exception or None (ndkale's `_clean_task_environment`)."""
