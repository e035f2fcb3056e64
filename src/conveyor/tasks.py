"""Defining and publishing tasks: `@task` functions, `Task` classes (ndkale style), and the
`Publisher` protocol a queue pool implements to receive their messages.

Publishing validates everything before anything is put: publish options, the arguments against
the task's signature, that the arguments serialize, and that the time limit stays below the
queue's visibility timeout. Publish options are keyword-only with a leading underscore
(`_delay`, `_priority`, `_key`, `_pool`) so they never collide with a task's own arguments.
See docs/tasks.md.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, ParamSpec, Protocol, TypeVar, overload

from .constants import DEFAULT_MAX_RETRIES, DEFAULT_QUEUE, H_IDEMPOTENCY_KEY, H_TASK
from .errors import ConveyorError, NoPublisherError, TaskArgumentError, TaskOptionError
from .message import Message
from .options import DEFAULT_BACKOFF, BackoffSpec, TaskOptions, backoff_delay, check_priority
from .registry import Registry
from .registry import registry as default_registry
from .runner import run_message
from .serialization import Call, FunctionPickler, FunctionRef, adhoc_task_name, encode_call, function_ref

if TYPE_CHECKING:
    from .worker.settings import QueueConfig

__all__ = ["Args", "Publisher", "Task", "TaskFunction", "TaskHandle", "adhoc_message", "backoff_delay", "build_message",
           "default_pool", "get_default_pool", "run_message", "set_default_pool", "task"]  # fmt: skip

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


class Publisher(Protocol):
    """Where published messages go; the queue pool implements it (tests: one store per queue)."""

    def put(self, queue: str, messages: Sequence[Message]) -> list[int]:
        """Put messages on `queue`; returns their ids, in order."""
        ...

    def queue_config(self, queue: str) -> QueueConfig | None:
        """The queue's configuration (for the visibility-timeout check), or None if unknown."""
        ...


@dataclass(frozen=True, slots=True)
class TaskHandle:
    """A published task: its message id, queue and task name."""

    id: int
    queue: str
    task: str


class Args:
    """One call's arguments for `publish_many`: `Args(1, 2, scale=3)`."""

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Args) and (self.args, self.kwargs) == (other.args, other.kwargs)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"Args({', '.join(parts)})"


# --- the default publisher ----------------------------------------------------------------------
_default: Publisher | None = None
_default_lock = threading.Lock()


def set_default_pool(pool: Publisher | None) -> Publisher | None:
    """Make `pool` where `publish` goes without `_pool=` (process-wide; None unsets). Returns the previous."""
    global _default
    with _default_lock:
        old, _default = _default, pool
    return old


def get_default_pool() -> Publisher | None:
    return _default


@contextmanager
def default_pool(pool: Publisher) -> Iterator[Publisher]:
    """`set_default_pool(pool)` for a `with` block, restoring the previous one after it."""
    old = set_default_pool(pool)
    try:
        yield pool
    finally:
        set_default_pool(old)


def _resolve_pool(pool: Publisher | None, task_name: str) -> Publisher:
    p = pool if pool is not None else _default
    if p is None:
        raise NoPublisherError(f"cannot publish {task_name!r}: no pool. Pass _pool=..., or call "
                               "conveyor.tasks.set_default_pool(pool) (or use `with default_pool(pool):`)")  # fmt: skip
    return p


# --- building messages --------------------------------------------------------------------------
def check_time_limit(task_name: str, options: TaskOptions, config: QueueConfig | None) -> None:
    """A time limit at or above the queue's visibility timeout would let a running task be
    delivered again while it still runs: reject it (as ndkale's publisher does)."""
    if config is not None and options.time_limit is not None and options.time_limit >= config.visibility_timeout_sec:
        raise TaskOptionError(
            f"task {task_name!r}: time_limit {options.time_limit:g} s must be below the visibility timeout "
            f"({config.visibility_timeout_sec:g} s) of queue {options.queue!r}"
        )


def _check_publish_options(task_name: str, delay: float | None, priority: int | None, key: str | None) -> None:
    try:
        if delay is not None and not (isinstance(delay, (int, float)) and not isinstance(delay, bool)
                                      and math.isfinite(delay) and delay >= 0):  # fmt: skip
            raise TaskOptionError(f"_delay must be a finite number of seconds >= 0 or None, got {delay!r}")
        if priority is not None:
            check_priority(priority)
        if key is not None and (type(key) is not str or not key):
            raise TaskOptionError(f"_key must be a non-empty str or None, got {key!r}")
    except TaskOptionError as e:
        raise TaskOptionError(f"task {task_name!r}: {e}") from None


def build_message(task_name: str, options: TaskOptions, args: tuple[Any, ...], kwargs: dict[str, Any],
                  app_data: dict[str, Any] | None = None, *, delay: float | None = None, priority: int | None = None,
                  key: str | None = None, now: float | None = None) -> Message:  # fmt: skip
    """The message for one call: envelope payload, priority, delay, attempts and headers.

    Raises SerializationError if an argument cannot be serialized. Publish options are not
    checked here (see `TaskFunction.publish`).
    """
    payload, headers = encode_call(task_name, args, kwargs, app_data)
    headers[H_TASK] = task_name
    headers.update(options.headers())
    if key is not None:
        headers[H_IDEMPOTENCY_KEY] = key
    not_before = ((time.time() if now is None else now) + delay) if delay else 0.0
    return Message(queue=options.queue, payload=payload, priority=options.priority if priority is None else priority,
                   not_before=not_before, max_attempts=options.max_attempts, headers=headers)  # fmt: skip


def adhoc_message(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  options: TaskOptions | None = None, *, delay: float | None = None, priority: int | None = None,
                  key: str | None = None, pickler: FunctionPickler | None = None) -> tuple[Message, FunctionRef]:  # fmt: skip
    """The message of an ad-hoc call (`pool.submit(func, ...)`) and the function's pickled bytes.

    The message names the function by digest only; the caller stores `ref.data` where a worker's
    `fetch(ref.digest)` finds it. The function is pickled once per function object.
    """
    ref = function_ref(func) if pickler is None else pickler.ref(func)
    opts = options if options is not None else TaskOptions()
    name = adhoc_task_name(ref.digest)
    _check_publish_options(name, delay, priority, key)
    return build_message(name, opts, tuple(args), dict(kwargs), delay=delay, priority=priority, key=key), ref


class _ArgCheck:
    """Checks published arguments against a signature; a fast path for positional-only calls.

    `Signature.bind` costs more than encoding a small message, so calls without keyword
    arguments are checked by counting, which gives the same answer when no keyword-only
    parameter is required; everything else goes through `bind` (which also words the error).
    """

    __slots__ = ("fast", "max_pos", "min_pos", "sig")

    def __init__(self, sig: inspect.Signature) -> None:
        self.sig = sig
        kinds = inspect.Parameter
        params = list(sig.parameters.values())
        positional = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
        self.min_pos = sum(1 for p in positional if p.default is kinds.empty)
        self.max_pos = None if any(p.kind is kinds.VAR_POSITIONAL for p in params) else len(positional)
        self.fast = not any(p.kind is kinds.KEYWORD_ONLY and p.default is kinds.empty for p in params)

    def check(self, task_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        n = len(args)
        if self.fast and not kwargs and n >= self.min_pos and (self.max_pos is None or n <= self.max_pos):
            return
        try:
            self.sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TaskArgumentError(f"task {task_name!r}: arguments do not fit {task_name}{self.sig}: {e}") from None


def _binder(func: Callable[..., Any], drop_first: bool) -> _ArgCheck | None:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # no signature to check against (some builtins)
        return None
    if drop_first:
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    return _ArgCheck(sig)


def _publish(task_name: str, options: TaskOptions, sig: _ArgCheck | None,
             calls: Iterable[tuple[tuple[Any, ...], dict[str, Any], dict[str, Any] | None]],
             delay: float | None, priority: int | None, key: str | None, pool: Publisher | None) -> list[TaskHandle]:  # fmt: skip
    _check_publish_options(task_name, delay, priority, key)
    target = _resolve_pool(pool, task_name)
    now = time.time()
    messages = []
    for args, kwargs, app_data in calls:
        if sig is not None:
            sig.check(task_name, args, kwargs)
        if app_data is not None and not isinstance(app_data, dict):
            raise TaskArgumentError(f"task {task_name!r}: app_data must be a dict or None, got {type(app_data).__name__}")
        messages.append(build_message(task_name, options, args, kwargs, app_data, delay=delay, priority=priority,
                                      key=key, now=now))  # fmt: skip
    if not messages:
        return []
    check_time_limit(task_name, options, target.queue_config(options.queue))
    ids = target.put(options.queue, messages)
    if len(ids) != len(messages):
        raise ConveyorError(f"publisher returned {len(ids)} ids for {len(messages)} messages")
    return [TaskHandle(int(i), options.queue, task_name) for i in ids]


def _calls(items: Iterable[Any], task_name: str, app_data: dict[str, Any] | None = None
           ) -> Iterator[tuple[tuple[Any, ...], dict[str, Any], dict[str, Any] | None]]:  # fmt: skip
    for i, it in enumerate(items):
        if isinstance(it, Args):
            yield it.args, it.kwargs, app_data
        elif type(it) is tuple:
            yield it, {}, app_data
        else:
            raise TaskArgumentError(f"task {task_name!r}: publish_many item {i} must be a tuple of positional "
                                    f"arguments or an Args(...), got {type(it).__name__}")  # fmt: skip


# --- function tasks -----------------------------------------------------------------------------
class TaskFunction(Generic[P, R]):
    """A function made a task by `@task`: still callable directly, and publishable.

    task_name: its registered name. options: its TaskOptions. fn: the plain function.
    """

    def __init__(self, fn: Callable[P, R], options: TaskOptions, name: str | None = None,
                 registry: Registry | None = None) -> None:  # fmt: skip
        if not callable(fn):
            raise TaskOptionError(f"@task needs a callable, got {type(fn).__name__}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.options = options
        self.task_name = name if name is not None else f"{fn.__module__}.{fn.__qualname__}"
        self._sig = _binder(fn, drop_first=False)
        self._registry = default_registry if registry is None else registry
        self._registry.register(self.task_name, self)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def publish(self, *args: Any, _delay: float | None = None, _priority: int | None = None, _key: str | None = None,
                _pool: Publisher | None = None, **kwargs: Any) -> TaskHandle:  # fmt: skip
        """Publish one call. `_delay` s before it may run, `_priority` overrides the task's,
        `_key` is an idempotency key, `_pool` the publisher (else the default pool)."""
        return _publish(self.task_name, self.options, self._sig, [(args, kwargs, None)], _delay, _priority, _key, _pool)[0]

    def publish_many(self, items: Iterable[tuple[Any, ...] | Args], *, _delay: float | None = None,
                     _priority: int | None = None, _pool: Publisher | None = None) -> list[TaskHandle]:  # fmt: skip
        """Publish many calls in one put: each item a tuple of positional arguments or an `Args(...)`."""
        return _publish(self.task_name, self.options, self._sig, _calls(items, self.task_name), _delay, _priority,
                        None, _pool)  # fmt: skip

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
def task(*, queue: str = ..., priority: int = ..., time_limit: float | None = ..., max_retries: int = ...,
         retry_backoff: BackoffSpec = ..., no_retry: tuple[type[BaseException], ...] = ..., name: str | None = ...,
         registry: Registry | None = ...) -> Callable[[Callable[P, R]], TaskFunction[P, R]]: ...  # fmt: skip
def task(fn: Callable[P, R] | None = None, /, *, queue: str = DEFAULT_QUEUE, priority: int = 0,
         time_limit: float | None = None, max_retries: int = DEFAULT_MAX_RETRIES, retry_backoff: BackoffSpec = DEFAULT_BACKOFF,
         no_retry: tuple[type[BaseException], ...] = (), name: str | None = None,
         registry: Registry | None = None) -> TaskFunction[P, R] | Callable[[Callable[P, R]], TaskFunction[P, R]]:  # fmt: skip
    """Make a function a task, bare (`@task`) or with options (`@task(queue="io", max_retries=5)`).

    Options are checked here (TaskOptionError). `name` overrides the registered name
    (default `module.qualname`); `registry` registers elsewhere than the process-wide registry.
    """
    options = TaskOptions(queue=queue, priority=priority, time_limit=time_limit, max_retries=max_retries,
                          retry_backoff=retry_backoff, no_retry=no_retry)  # type: ignore[arg-type]  # fmt: skip

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
    _sig: ClassVar[_ArgCheck | None] = None

    def __init_subclass__(cls, *, name: str | None = None, abstract: bool = False, registry: Registry | None = None,
                          **kwargs: Any) -> None:  # fmt: skip
        super().__init_subclass__(**kwargs)
        try:
            cls.options = TaskOptions(queue=cls.queue, priority=cls.priority, time_limit=cls.time_limit,
                                      max_retries=cls.max_retries, retry_backoff=cls.retry_backoff,  # type: ignore[arg-type]
                                      no_retry=cls.no_retry)  # fmt: skip
        except TaskOptionError as e:
            raise TaskOptionError(f"task class {cls.__module__}.{cls.__qualname__}: {e}") from None
        cls.task_name = name if name is not None else f"{cls.__module__}.{cls.__qualname__}"
        cls._sig = _binder(cls.run_task, drop_first=True)
        if not abstract and cls.run_task is not Task.run_task:
            (default_registry if registry is None else registry).register(cls.task_name, cls)  # type: ignore[arg-type]

    def __init__(self, app_data: dict[str, Any] | None = None, message: Message | None = None) -> None:
        """app_data: the data published with the task. message: the delivery (None when run directly)."""
        self.app_data = app_data
        self.message = message
        self.task_id = message.id if message is not None else None
        self.attempt = message.attempts if message is not None else 0

    @classmethod
    def publish(cls, app_data: dict[str, Any] | None, *args: Any, _delay: float | None = None, _priority: int | None = None,
                _key: str | None = None, _pool: Publisher | None = None, **kwargs: Any) -> TaskHandle:  # fmt: skip
        """Publish one run of this task with `app_data` (a dict, or None) and its arguments."""
        return _publish(cls._checked_name(), cls.options, cls._sig, [(args, kwargs, app_data)], _delay, _priority, _key,
                        _pool)[0]  # fmt: skip

    @classmethod
    def publish_many(cls, app_data: dict[str, Any] | None, items: Iterable[tuple[Any, ...] | Args], *,
                     _delay: float | None = None, _priority: int | None = None,
                     _pool: Publisher | None = None) -> list[TaskHandle]:  # fmt: skip
        """Publish many runs sharing `app_data` in one put (items as for `TaskFunction.publish_many`)."""
        name = cls._checked_name()
        return _publish(name, cls.options, cls._sig, _calls(items, name, app_data), _delay, _priority, None, _pool)

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
        """Called when before_run, run_task or after_run raised `exc` (ndkale's `handle_failure`);
        whether the message is retried is decided by `max_retries` and `no_retry`."""

    def cleanup(self, exc: Exception | None) -> None:
        """Called last in every run, with the exception or None (ndkale's `_clean_task_environment`)."""
