"""The run side of a task, free of any transport: one delivered message in, result bytes out.

A consumer calls `run_message` for each delivered message, acks with the bytes it returns, and
on `TaskError` nacks with `error.error` after `backoff_delay(message.attempts, backoff_of(message.headers))`
seconds, or fails the message at once when `error.retryable` is False (unknown task, undecodable
payload, unserializable result, an exception the task declared not retryable, or a run that called
`fail_without_retry()`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from conveyor.constants import H_TASK
from conveyor.errors import ConveyorError, TaskError
from conveyor.message import Message
from conveyor.tasks.envelope import FunctionCache, adhoc_digest, decode_call, encode_error, encode_result
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.policy import is_retryable
from conveyor.tasks.registry import Registry
from conveyor.tasks.registry import registry as default_registry

_function_cache = FunctionCache()  # the process-wide cache of ad-hoc callables, when given none
_current: ContextVar[Message | None] = ContextVar("conveyor_current_message", default=None)
_backend: ContextVar[Any] = ContextVar("conveyor_worker_backend", default=None)
_final: ContextVar[bool] = ContextVar("conveyor_final_failure", default=False)


def current_message() -> Message | None:
    """The message whose task this thread is running (None outside a task).

    For a task that acts on its own delivery, e.g. on how many attempts it has had.
    """
    return _current.get()


def worker_backend() -> Any:
    """The queue backend of the worker running this task (None outside a worker).

    Over connections of the worker's own; for a task that puts messages where its own came from.
    """
    return _backend.get()


def fail_without_retry() -> None:
    """Make the running task's message fail now, without retries, if the run fails.

    Called while a task runs (from its `on_failure` hook, say): if the run fails, its message fails
    now, without retries, whatever the exception (the ndkale compat's `handle_failure` returning
    False).
    """
    _final.set(True)


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

    Every failure raises `TaskError` (with `cause` the original exception and `__cause__` set):
    the task's own exceptions, and also an unknown task or a damaged payload, which are not
    retryable. Exceptions that are not `Exception`s (KeyboardInterrupt, SystemExit) propagate as is.
    """
    reg = default_registry if registry is None else registry
    name = message.headers.get(H_TASK, "?")
    options: TaskOptions | None = None
    token, backend_token, final_token = _current.set(message), _backend.set(backend), _final.set(False)
    try:
        call = decode_call(message.payload, message.headers)
        name = call.name
        digest = adhoc_digest(name)
        if digest is None:
            task = reg.get(name)
            options = task.options
            value = task.run_call(call, message)
        else:
            if fetch is None:
                raise ConveyorError(f"ad-hoc task {name}: this worker was given no `fetch` for function bytes")
            cache = function_cache if function_cache is not None else _function_cache  # an empty cache is falsy
            func = cache.get(digest, fetch)
            value = func(*call.args, **call.kwargs)
        return encode_result(value)
    except Exception as exc:
        retryable = not _final.get() and is_retryable(exc, options.no_retry if options is not None else ())
        raise TaskError(name, encode_error(exc), retryable, exc) from exc
    finally:
        _current.reset(token)
        _backend.reset(backend_token)
        _final.reset(final_token)
