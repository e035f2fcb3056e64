"""The function a Spark entry point runs, as the user gave it: a function, or a class built once where it runs.

A class (a model, a client) is built with `fn_args`/`fn_kwargs` the first time a task needs it in a
process, then called for every batch: `__init__` loads the model once, `__call__` uses it. The task
holding the `Instances` is unpickled once per process (`FunctionCache`, by digest), so every thread
of a consumer shares its one instance, and each child process of a `pool="process"` consumer builds
its own. A class that sets `per_thread = True` gets an instance per thread instead (for a
`__call__` that is not thread-safe; `concurrency=1` is the other way). An async class built on a
consumer's event loop has its `aclose()`, if any, awaited there as the loop ends (`at_loop_end`).

The tasks say how many instances they built in their results (`take_built`), so that the count
reaches the job from child processes too (a build whose result is dropped goes uncounted: the count
is a lower bound). What is built lives as long as its task in the process's `FunctionCache`: a
Spark consumer drops its job's task as it ends (`SparkConsumerPool(job_tasks=)`).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

from conveyor.errors import ConveyorError, TimeLimitExceededError
from conveyor.tasks.envelope import encode_error
from conveyor.tasks.runner import at_loop_end, is_async_callable

T = TypeVar("T")


class BuildError(ConveyorError):
    """A class given as the function could not be built in this process: every call needing it fails with this."""


class Instances:
    """`fn` as its tasks call it: `get()` is the function itself, or the class's instance for this process (or thread).

    A constructor that raises is not called again in that process: each later `get()` raises the
    same `BuildError` at once (a model that failed to load would fail again, each time at its
    cost). Picklable: what is built stays where it was built.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], entry: str) -> None:
        self.fn, self.args, self.kwargs, self.entry = fn, args, kwargs, entry
        self._start()

    @property
    def is_class(self) -> bool:
        return inspect.isclass(self.fn)

    @property
    def awaits(self) -> bool:
        """Whether a call returns a coroutine to await: an `async def` function, or a class whose `__call__` is one."""
        if self.is_class:
            return inspect.iscoroutinefunction(inspect.getattr_static(self.fn, "__call__", None))
        return is_async_callable(self.fn)

    async def call(self, fn: Callable[[Any], Any], arg: Any, limit: float | None = None) -> Any:
        """`fn(arg)`, awaited when fn is async, for at most `limit` seconds (else `TimeLimitExceededError`).

        Over a plain fn the coroutine never waits: `finish` takes its value without a loop.
        """
        value = fn(arg)
        if not self.awaits:
            return value
        if limit is None:
            return await value
        call = asyncio.ensure_future(value)
        done, _ = await asyncio.wait((call,), timeout=limit)
        if not done:  # its own TimeoutError (a client's) is told apart from running over the limit
            call.cancel()
            await asyncio.wait((call,))
            raise TimeLimitExceededError(f"the call ran over its time limit of {limit:g} s and was cancelled")
        return call.result()

    @property
    def per_thread(self) -> bool:
        """Whether the class asks for an instance per thread (`per_thread = True`)."""
        return self.is_class and getattr(self.fn, "per_thread", False) is True

    def _start(self) -> None:
        self._lock = threading.Lock()  # held while the shared instance is built
        self._counting = threading.Lock()
        self._shared: Callable[..., Any] | None = None
        self._local = threading.local()
        self._failed: BuildError | None = None
        self._built = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"fn": self.fn, "args": self.args, "kwargs": self.kwargs, "entry": self.entry}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs, self.entry = state["fn"], state["args"], state["kwargs"], state["entry"]
        self._start()

    def get(self) -> Callable[..., Any]:
        """What to call: the function, or the instance (built on the first call here); BuildError if it cannot be built."""
        if not self.is_class:
            return self.fn
        if self.per_thread:
            mine: Callable[..., Any] | None = getattr(self._local, "instance", None)
            if mine is None:
                mine = self._local.instance = self._build()
            return mine
        with self._lock:  # threads asking at once wait for the one build
            if self._shared is None:
                self._shared = self._build()
            return self._shared

    def _build(self) -> Callable[..., Any]:
        if self._failed is not None:
            raise self._failed
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        try:
            made: object = self.fn(*self.args, **self.kwargs)
        except Exception as e:
            self._failed = BuildError(
                f"{self.entry}: {name}(*fn_args, **fn_kwargs) raised as it was built (not tried again in this process, "
                f"pid {os.getpid()}): {encode_error(e)}"
            )
            raise self._failed from e
        if not callable(made):
            self._failed = BuildError(f"{self.entry}: an instance of {name} is not callable: give the class a __call__(batch)")
            raise self._failed
        aclose = getattr(made, "aclose", None)
        if self.awaits and inspect.iscoroutinefunction(aclose):
            at_loop_end(aclose)  # closed on the consumer's loop as it ends, where its clients were opened
        with self._counting:
            self._built += 1
        return made

    def take_built(self) -> int:
        """The instances built here since the last call (a task says so in its result)."""
        with self._counting:
            n, self._built = self._built, 0
        return n


def finish(coro: Coroutine[Any, Any, T]) -> T:
    """The value of a coroutine that never waits (over a plain function: `Instances.call`), with no event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return cast("T", done.value)
    coro.close()
    raise RuntimeError("a coroutine over a plain function waited for something")


def check_fn(entry: str, name: str, fn: object, fn_args: object, fn_kwargs: object, what: str) -> Instances:
    """`fn` (the parameter `name`) with its constructor's arguments, checked: a callable, and arguments only for a class.

    `what` says what a call gets (for the error naming it).
    """
    if not callable(fn):
        raise TypeError(f"{entry}: {name} must be callable: a function or a class (called with {what}), got {type(fn).__name__}")
    refuse_generator(entry, name, fn)
    if not isinstance(fn_args, (tuple, list)):
        raise TypeError(f"{entry}: fn_args must be a tuple, got {type(fn_args).__name__}")
    if fn_kwargs is not None and not (isinstance(fn_kwargs, dict) and all(type(k) is str for k in fn_kwargs)):
        raise TypeError(f"{entry}: fn_kwargs must be a dict of keyword arguments (or None), got {fn_kwargs!r:.100}")
    kwargs = dict(fn_kwargs or {})
    if not inspect.isclass(fn) and (fn_args or kwargs):
        raise TypeError(
            f"{entry}: fn_args and fn_kwargs are the constructor's arguments of a class given as fn; "
            "for a function, bind them with functools.partial"
        )
    return Instances(fn, tuple(fn_args), kwargs, entry)


def refuse_generator(entry: str, name: str, fn: object) -> None:
    """Refuse a generator function (an async one too), before any work.

    A call's return value is the result: a generator would fail every row, after the whole job.
    """
    cls = inspect.isclass(fn)
    runs = [inspect.getattr_static(fn if cls else type(fn), "__call__", None), *([] if cls else [fn])]  # what a call runs
    which = "the __call__ of " if cls else ""
    if any(inspect.isasyncgenfunction(f) or inspect.isgeneratorfunction(f) for f in runs):
        raise TypeError(
            f"{entry}: {name} is {which}a generator function ({getattr(fn, '__qualname__', fn)!r}): {entry} takes what a "
            "call returns, so return the result instead of yielding it"
        )
