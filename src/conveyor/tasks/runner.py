"""The run side of a task, free of any transport: one delivered message in, result bytes out.

A consumer calls `run_message` (or, on an event loop, `run_message_async`) for each delivered
message, acks with the bytes it returns, and on `TaskError` nacks with `error.error` after
`backoff_delay(message.attempts, backoff_of(message.headers))` seconds, or fails the message at once
when `error.retryable` is False (unknown task, undecodable payload, unserializable result, an
exception the task declared not retryable, or a run that called `fail_without_retry()`).

A task may be a coroutine function (`async def`, or a callable whose `__call__` is one). On a loop
(`run_message_async`, the consumer's `pool="async"`) it is awaited there, many at once; `runs_on_loop`
tells such a message from a plain one, which async slots run with `run_message` in threads of their
own. Outside a loop (`run_message`, thread and process slots) a coroutine function runs on a loop of
its own for that call (`asyncio.run`): it works, without sharing a loop with other calls.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any

from conveyor.constants import H_TASK
from conveyor.errors import ConveyorError, TaskError
from conveyor.message import Message
from conveyor.tasks.envelope import FunctionCache, adhoc_digest, decode_call, encode_error, encode_result
from conveyor.tasks.policy import is_retryable
from conveyor.tasks.registry import Registry
from conveyor.tasks.registry import registry as default_registry

_function_cache = FunctionCache()  # the process-wide cache of ad-hoc callables, when given none
_loop_end: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Callable[[], Awaitable[object]]]] = (
    weakref.WeakKeyDictionary()
)
_loop_end_lock = threading.Lock()


class _Attempt:
    """One run of a message's task: what `current_message()` and the others read while it runs.

    A context manager: it is what they read for the run, and every `Exception` out of the run
    leaves it as a `TaskError`, retryable as the task's options and `fail_without_retry()` say.
    One mutable object, so that `fail_without_retry()` from a copy of the context (a task's thread
    under an event loop, a task's own loop) still reaches the run.
    """

    __slots__ = ("_token", "backend", "final", "message", "name", "no_retry")

    def __init__(self, message: Message, backend: Any) -> None:
        self.message, self.backend = message, backend
        self.name: str = message.headers.get(H_TASK, "?")  # the envelope's, once decoded
        self.no_retry: tuple[type[BaseException], ...] = ()  # the task's, once found
        self.final = False  # fail_without_retry() was called
        self._token: Token[_Attempt | None] | None = None

    def __enter__(self) -> _Attempt:
        self._token = _attempt.set(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._token is not None:
            _attempt.reset(self._token)
        if isinstance(exc, Exception):  # not KeyboardInterrupt, SystemExit, CancelledError: those go on as they are
            raise TaskError(self.name, encode_error(exc), not self.final and is_retryable(exc, self.no_retry), exc) from exc


_attempt: ContextVar[_Attempt | None] = ContextVar("conveyor_attempt", default=None)


def current_message() -> Message | None:
    """The message whose task this thread (or coroutine) is running (None outside a task).

    For a task that acts on its own delivery, e.g. on how many attempts it has had.
    """
    a = _attempt.get()
    return None if a is None else a.message


def worker_backend() -> Any:
    """The queue backend of the worker running this task (None outside a worker).

    Over connections of the worker's own; for a task that puts messages where its own came from.
    """
    a = _attempt.get()
    return None if a is None else a.backend


def fail_without_retry() -> None:
    """Make the running task's message fail now, without retries, if the run fails.

    Called while a task runs (from its `on_failure` hook, say): if the run fails, its message fails
    now, without retries, whatever the exception (the ndkale compat's `handle_failure` returning
    False).
    """
    a = _attempt.get()
    if a is not None:
        a.final = True


def forget_adhoc(name: str) -> None:
    """Drop the ad-hoc task `name`'s callable from the process-wide cache (its job is over here), and what it built.

    A registered task's name: nothing to do.
    """
    digest = adhoc_digest(name)
    if digest is not None:
        _function_cache.forget(digest)


def at_loop_end(close: Callable[[], Awaitable[object]]) -> None:
    """Await `close()` on the running event loop before a consumer's async slots close it.

    For what a task opened on the loop and keeps across calls (an `aiohttp` session in a class's
    instance: its `aclose`), which must be closed there. With no loop running, nothing was opened
    on one: nothing to do. A loop no one winds down (`asyncio.run`) drops it.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    with _loop_end_lock:
        _loop_end.setdefault(loop, []).append(close)


def take_loop_end(loop: asyncio.AbstractEventLoop) -> list[Callable[[], Awaitable[object]]]:
    """What `at_loop_end` asked to await on `loop` as it ends, in the order asked (then forgotten)."""
    with _loop_end_lock:
        return _loop_end.pop(loop, [])


def is_async_callable(fn: object) -> bool:
    """Whether calling `fn` returns a coroutine to await: an `async def` function, or an object whose `__call__` is one."""
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))


def runs_on_loop(
    message: Message,
    registry: Registry | None = None,
    function_cache: FunctionCache | None = None,
    fetch: Callable[[str], bytes] | None = None,
) -> bool:
    """Whether `message`'s task is a coroutine function, to await on an event loop (False: a plain one, for a thread).

    Told by the task name in its headers, without decoding its payload (the run decodes it). A task
    not found so (no name, an unknown one, an ad-hoc function whose bytes cannot be had) says True:
    `run_message_async` then fails it as `run_message` would, with the reason.
    """
    name = message.headers.get(H_TASK)
    if name is None:
        return True
    try:
        digest = adhoc_digest(name)
        if digest is None:
            return (default_registry if registry is None else registry).get(name).is_async
        if fetch is None:
            return True
        return is_async_callable((function_cache if function_cache is not None else _function_cache).get(digest, fetch))
    except Exception:  # the run says what is wrong
        return True


def _task_call(
    attempt: _Attempt,
    registry: Registry | None,
    function_cache: FunctionCache | None,
    fetch: Callable[[str], bytes] | None,
) -> tuple[Callable[[], Any], bool]:
    """Decode the attempt's message and find its task: a call that runs it, and whether that call returns a coroutine."""
    message = attempt.message
    call = decode_call(message.payload, message.headers)
    attempt.name = call.name
    digest = adhoc_digest(call.name)
    if digest is None:
        task = (default_registry if registry is None else registry).get(call.name)
        attempt.no_retry = task.options.no_retry
        return functools.partial(task.run_call, call, message), task.is_async
    if fetch is None:
        raise ConveyorError(f"ad-hoc task {call.name}: this worker was given no `fetch` for function bytes")
    cache = function_cache if function_cache is not None else _function_cache  # an empty cache is falsy
    func = cache.get(digest, fetch)
    return functools.partial(func, *call.args, **call.kwargs), is_async_callable(func)


def run_message(
    message: Message,
    registry: Registry | None = None,
    function_cache: FunctionCache | None = None,
    fetch: Callable[[str], bytes] | None = None,
    backend: Any = None,
) -> bytes:
    """Decode `message`, run its task (hooks included) and return the encoded result.

    registry: where task names resolve (None: the process-wide registry).
    function_cache, fetch: resolve ad-hoc callables by digest; `fetch(digest)` returns the
        function's pickled bytes (from the servers' blob store). Needed only for ad-hoc calls.
    backend: what `worker_backend()` returns while the task runs.

    A coroutine function's task runs to its end on a loop of its own (`asyncio.run`).

    Every failure raises `TaskError` (with `cause` the original exception and `__cause__` set):
    the task's own exceptions, and also an unknown task or a damaged payload, which are not
    retryable. Exceptions that are not `Exception`s (KeyboardInterrupt, SystemExit) propagate as is.
    """
    with _Attempt(message, backend) as attempt:
        run, _ = _task_call(attempt, registry, function_cache, fetch)
        value = run()
        if inspect.iscoroutine(value):  # not isawaitable: on the hot path of every plain task, at a third of its cost
            value = asyncio.run(value)
        return encode_result(value)


async def run_message_async(
    message: Message,
    registry: Registry | None = None,
    function_cache: FunctionCache | None = None,
    fetch: Callable[[str], bytes] | None = None,
    backend: Any = None,
) -> bytes:
    """`run_message` on the running event loop: a coroutine function's task is awaited here.

    A plain function's task runs in the loop's default executor (a thread, with this context:
    `current_message()` works there too), so that it holds up no other call. Decoding, and the
    first fetch of an ad-hoc function's bytes, run on the loop: once per function per process.
    Cancelled, the task gets `CancelledError`, which leaves as it is (not a `TaskError`).
    """
    with _Attempt(message, backend) as attempt:
        run, awaits = _task_call(attempt, registry, function_cache, fetch)
        value = run() if awaits else await asyncio.to_thread(run)
        if inspect.iscoroutine(value):  # a plain function's, given to await (a Task class's async run_task, say)
            value = await value
        return encode_result(value)
