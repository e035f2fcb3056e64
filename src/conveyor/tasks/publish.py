"""Publishing task messages: the `Publisher` protocol, the default pool, message building and checks.

The `Publisher` protocol is what a queue pool implements; the checks are those done before anything
is put.

Publishing validates everything before anything is put: publish options, the arguments against
the task's signature, that the arguments serialize, and that the time limit stays below the
queue's visibility timeout. `conveyor.tasks.definition` builds `publish` and `publish_many` on this.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import InitVar, dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from conveyor.constants import H_CONTENT_TYPE, H_IDEMPOTENCY_KEY, H_TASK
from conveyor.errors import ConveyorError, NoPublisherError, TaskArgumentError, TaskFailedError, TaskOptionError
from conveyor.gc_policy import gc_paused
from conveyor.message import Message, Status, make_message
from conveyor.tasks.envelope import FunctionRef, adhoc_task_name, decode_result, encode_call, function_ref
from conveyor.tasks.options import TaskOptions, check_priority

if TYPE_CHECKING:
    from conveyor.protocol.requests import CancelOutcome
    from conveyor.tasks.queue_config import QueueConfig


class Publisher(Protocol):
    """Where published messages go; the queue pool implements it (tests: one store per queue)."""

    def put(self, queue: str, messages: Sequence[Message]) -> list[int]:
        """Put messages on `queue`; returns their ids, in order.

        The messages of one publish may share one headers dict: read it, do not change it in place.
        """
        ...

    def queue_config(self, queue: str) -> QueueConfig | None:
        """The queue's configuration (for the visibility-timeout check), or None if unknown."""
        ...


class ResultReader(Protocol):
    """What a `TaskHandle` asks of the pool it was published to; `QueuePool` implements it."""

    def gather(self, handles: Sequence[TaskHandle], timeout: float | None = None) -> list[Any]:
        """The results of these tasks, in order, once all have finished."""
        ...

    def task_status(self, handle: TaskHandle) -> Status | None:
        """Where the task's message is (None: no such message)."""
        ...

    def cancel(self, handles: Sequence[TaskHandle]) -> list[CancelOutcome]:
        """Take these tasks off their queues if they have not started; what became of each, in order."""
        ...


@dataclass(frozen=True)
class TaskHandle:
    """A published task: its message id, queue and task name, and the pool it went to.

    `result(timeout=...)` waits for its result (as Celery's `AsyncResult.get()` and Dramatiq's
    `get_result` do); `status()` says where its message is; `cancel()` takes it off its queue if it
    has not started (as Celery's `revoke()`). The pool is not part of the handle's
    value: equal, hashed, printed and pickled by (id, queue, task); a handle that crossed to another
    process reads through that process's default pool.
    """

    id: int
    queue: str
    task: str
    source: InitVar[Publisher | None] = None

    def __post_init__(self, source: Publisher | None) -> None:
        object.__setattr__(self, "_pool", source)

    @property
    def pool(self) -> Publisher | None:
        """The pool it was published to (None: unknown here, e.g. after pickling)."""
        pool: Publisher | None = self.__dict__.get("_pool")
        return pool

    def __reduce__(self) -> tuple[type[TaskHandle], tuple[int, str, str]]:
        return TaskHandle, (self.id, self.queue, self.task)

    def result(self, timeout: float | None = None) -> Any:
        """The task's return value, once it has finished.

        Raises `TaskFailedError` if it ended in the dead letters, `TimeoutError` if it has not finished
        within `timeout` seconds (None: no limit), and the pool's error when the consumers started on
        it cannot start. Waiting, it warns while no live consumer serves the task's queue.
        """
        return self._reader().gather([self], timeout)[0]

    def status(self) -> Status | None:
        """READY, DELIVERED, ACKED or FAILED (None: no such message, e.g. purged)."""
        return self._reader().task_status(self)

    def cancel(self) -> CancelOutcome:
        """Take the task off its queue if it has not started: CANCELLED, or why not (running, finished, ...).

        A cancelled task becomes a dead letter ("cancelled before it ran"), so `result()` raises
        `TaskFailedError`; a running task is not stopped.
        """
        return self._reader().cancel([self])[0]

    def _reader(self) -> ResultReader:
        pool = self.pool if self.pool is not None else get_default_pool()
        if pool is None or not callable(getattr(pool, "gather", None)) or not callable(getattr(pool, "task_status", None)):
            raise NoPublisherError(
                f"{self}: no pool to read its result from (it was published to {pool!r}); "
                "use QueuePool.gather, or set_default_pool(pool)"
            )
        return cast("ResultReader", pool)


def task_handles(ids: Sequence[int], queue: str, task: str, source: Publisher | None) -> list[TaskHandle]:
    """The handles of a batch, each equal to `TaskHandle(id, queue, task, source)`, built cheaply.

    Built without the frozen dataclass's `__init__` (which costs more than encoding a small message),
    with the collector paused (`gc_paused`: every handle outlives the collections it would trigger).
    """
    new = object.__new__
    out = []
    with gc_paused():
        for i in ids:
            h = new(TaskHandle)
            h.__dict__.update(id=int(i), queue=queue, task=task, _pool=source)
            out.append(h)
    return out


def outcome(
    handle: TaskHandle, result: bytes | None, status: Status | None, dead_error: Callable[[], str | None]
) -> tuple[bool, Any]:
    """A published task's outcome from its stored result and its status.

    Returns (True, its value) once it has finished, (False, None) while it has not; raises
    `TaskFailedError` (with the error `dead_error()` reads from its dead letter) if it ended in the
    dead letters. Every pool's `gather` decides so.
    """
    if result is not None:
        return True, decode_result(result)
    if status is Status.FAILED:
        raise TaskFailedError(handle, dead_error() or "failed (its dead letter was forgotten)")
    if status is None:
        raise ConveyorError(f"{handle}: no such message (purged, or another pool's id)")
    return False, None


class Args:
    """One call's arguments for `publish_many`: `Args(1, 2, scale=3)`."""

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Args) and (self.args, self.kwargs) == (other.args, other.kwargs)

    # unhashable: Python sets __hash__ = None for a class that defines __eq__ without __hash__

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"Args({', '.join(parts)})"


# --- the default publisher ----------------------------------------------------------------------
_default: Publisher | None = None  # set_default_pool's
_scoped: list[Publisher] = []  # default_pool blocks (conveyor.local() among them), innermost last
_default_lock = threading.Lock()


def set_default_pool(pool: Publisher | None) -> Publisher | None:
    """Make `pool` where `publish` goes without `_pool=` (process-wide; None unsets).

    Returns the previous one. A `default_pool` block open meanwhile still wins until it ends.
    """
    global _default
    with _default_lock:
        old, _default = _default, pool
    return old


def get_default_pool() -> Publisher | None:
    """The pool every API given none uses.

    The innermost open `default_pool` block's, else the one `set_default_pool` set (None: none).
    """
    with _default_lock:
        return _scoped[-1] if _scoped else _default


@contextmanager
def default_pool(pool: Publisher) -> Iterator[Publisher]:
    """Make `pool` the default for a `with` block.

    Blocks may end in any order (other threads' included): each takes only its own pool off, and the
    default is the innermost one still open.
    """
    with _default_lock:
        _scoped.append(pool)
    try:
        yield pool
    finally:
        with _default_lock:
            del _scoped[len(_scoped) - 1 - _scoped[::-1].index(pool)]


def _resolve_pool(pool: Publisher | None, task_name: str) -> Publisher:
    p = pool if pool is not None else get_default_pool()
    if p is None:
        raise NoPublisherError(
            f"cannot publish {task_name!r}: no pool. Pass _pool=..., or call "
            "conveyor.set_default_pool(pool) (or use `with default_pool(pool):`)"
        )
    return p


# --- building messages --------------------------------------------------------------------------
def check_time_limit(task_name: str, options: TaskOptions, config: QueueConfig | None) -> None:
    """Reject a time limit at or above the queue's visibility timeout (as ndkale's publisher does).

    Such a limit would let a running task be delivered again while it still runs.
    """
    if config is not None and options.time_limit is not None and options.time_limit >= config.visibility_timeout_sec:
        raise TaskOptionError(
            f"task {task_name!r}: time_limit {options.time_limit:g} s must be below the visibility timeout "
            f"({config.visibility_timeout_sec:g} s) of queue {options.queue!r}"
        )


def check_publish_options(task_name: str, delay: float | None, priority: int | None, key: str | None) -> None:
    try:
        if delay is not None and not (
            isinstance(delay, (int, float)) and not isinstance(delay, bool) and math.isfinite(delay) and delay >= 0
        ):
            raise TaskOptionError(f"_delay must be a finite number of seconds >= 0 or None, got {delay!r}")
        if priority is not None:
            check_priority(priority)
        if key is not None and (type(key) is not str or not key):
            raise TaskOptionError(f"_key must be a non-empty str or None, got {key!r}")
    except TaskOptionError as e:
        raise TaskOptionError(f"task {task_name!r}: {e}") from None


class MessageTemplate:
    """What the messages of one task published in one go share, worked out once.

    Queue, priority, start time, attempts, headers: worked out once, so that a batch pays per call
    only for encoding it.
    """

    __slots__ = ("_merged", "headers", "max_attempts", "not_before", "priority", "queue", "task_name")

    def __init__(
        self,
        task_name: str,
        options: TaskOptions,
        *,
        delay: float | None = None,
        priority: int | None = None,
        key: str | None = None,
        now: float | None = None,
    ) -> None:
        self.task_name = task_name
        self.queue = options.queue
        self.priority = options.priority if priority is None else priority
        self.not_before = ((time.time() if now is None else now) + delay) if delay else 0.0
        self.max_attempts = options.max_attempts
        self.headers = {H_TASK: task_name, **options.headers()}
        if key is not None:
            self.headers[H_IDEMPOTENCY_KEY] = key
        self._merged: dict[str, dict[str, str]] = {}  # the headers of a message, by its content type

    def message(self, args: tuple[Any, ...], kwargs: dict[str, Any], app_data: dict[str, Any] | None = None) -> Message:
        """The message of one call.

        Raises SerializationError if an argument cannot be serialized. The messages of one template
        with the same content type share one headers dict (built once).
        """
        payload, own = encode_call(self.task_name, args, kwargs, app_data)
        ct = own[H_CONTENT_TYPE]
        headers = self._merged.get(ct)
        if headers is None:
            headers = self._merged[ct] = {**own, **self.headers}
        return make_message(0, self.queue, payload, self.priority, 0, 0.0, self.not_before, 0.0, self.max_attempts, headers)


def build_message(
    task_name: str,
    options: TaskOptions,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    app_data: dict[str, Any] | None = None,
    *,
    delay: float | None = None,
    priority: int | None = None,
    key: str | None = None,
    now: float | None = None,
) -> Message:
    """The message for one call: envelope payload, priority, delay, attempts and headers.

    Raises SerializationError if an argument cannot be serialized. Publish options are not
    checked here (see `TaskFunction.publish`).
    """
    template = MessageTemplate(task_name, options, delay=delay, priority=priority, key=key, now=now)
    return template.message(args, kwargs, app_data)


class ArgCheck:
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


def arg_check(func: Callable[..., Any], drop_first: bool) -> ArgCheck | None:
    """An ArgCheck for `func` (without its first parameter: `self`), or None if it has no signature."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # no signature to check against (some builtins)
        return None
    if drop_first:
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    return ArgCheck(sig)


CallArgs = tuple[tuple[Any, ...], dict[str, Any], dict[str, Any] | None]  # (args, kwargs, app_data)


def publish_calls(
    task_name: str,
    options: TaskOptions,
    sig: ArgCheck | None,
    calls: Iterable[CallArgs],
    delay: float | None,
    priority: int | None,
    key: str | None,
    pool: Publisher | None,
    before_put: Callable[[], object] | None = None,
) -> list[TaskHandle]:
    """Check, encode and put calls of one task in one batch; nothing is put if any check fails.

    `before_put()` runs once everything is checked, before the put (an ad-hoc task stores
    its function there).
    """
    check_publish_options(task_name, delay, priority, key)
    target = _resolve_pool(pool, task_name)
    template = MessageTemplate(task_name, options, delay=delay, priority=priority, key=key)
    messages = []
    with gc_paused():
        for args, kwargs, app_data in calls:
            if sig is not None:
                sig.check(task_name, args, kwargs)
            if app_data is not None and not isinstance(app_data, dict):
                raise TaskArgumentError(f"task {task_name!r}: app_data must be a dict or None, got {type(app_data).__name__}")
            messages.append(template.message(args, kwargs, app_data))
    if not messages:
        return []
    check_time_limit(task_name, options, target.queue_config(options.queue))
    if before_put is not None:
        before_put()
    ids = target.put(options.queue, messages)
    if len(ids) != len(messages):
        raise ConveyorError(f"publisher returned {len(ids)} ids for {len(messages)} messages")
    return task_handles(ids, options.queue, task_name, target)


def publish_adhoc(
    func: Callable[..., Any],
    calls: Iterable[tuple[tuple[Any, ...], dict[str, Any]]],
    options: TaskOptions,
    delay: float | None,
    priority: int | None,
    key: str | None,
    pool: Publisher,
    store_function: Callable[[FunctionRef], object],
) -> list[TaskHandle]:
    """Publish calls of an ad-hoc callable (`pool.submit`, `pool.map`): `publish_calls` under its digest.

    The function is cloudpickled once per function object; its messages carry only the digest, and
    `store_function(ref)` puts its bytes where a worker's fetch by digest finds them, once the calls
    are checked and before they are put. Its arguments are not checked against its signature.
    """
    ref = function_ref(func)
    arguments = ((args, kwargs, None) for args, kwargs in calls)
    return publish_calls(
        adhoc_task_name(ref.digest),
        options,
        None,
        arguments,
        delay,
        priority,
        key,
        pool,
        lambda: store_function(ref),
    )


def calls_of(items: Iterable[Any], task_name: str, app_data: dict[str, Any] | None = None) -> Iterator[CallArgs]:
    """`publish_many` items (tuples of positional arguments, or Args) as calls."""
    for i, it in enumerate(items):
        if isinstance(it, Args):
            yield it.args, it.kwargs, app_data
        elif type(it) is tuple:
            yield it, {}, app_data
        else:
            raise TaskArgumentError(
                f"task {task_name!r}: publish_many item {i} must be a tuple of positional "
                f"arguments or an Args(...), got {type(it).__name__}"
            )
