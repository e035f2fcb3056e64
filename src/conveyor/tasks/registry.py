"""The task registry: task names to the task objects a worker runs.

A task registers when it is defined (`@task` or subclassing `Task`), under its module and
qualified name (`app.jobs.resize`) unless given a name. A worker finds a message's task here by
the name in its envelope, so the module defining a task must be imported in the worker (settings
`TASK_MODULES`). Tasks defined in a script's `__main__` also resolve in the worker processes a
`ConsumerPool` starts (they import the script as `__mp_main__`); tasks defined inside functions
only resolve in the process that defined them.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from conveyor.constants import ADHOC_TASK_PREFIX
from conveyor.errors import ConfigError, DuplicateTaskError, TaskOptionError, UnknownTaskError

if TYPE_CHECKING:
    from conveyor.message import Message
    from conveyor.tasks.envelope import Call
    from conveyor.tasks.options import TaskOptions

log = logging.getLogger(__name__)


class RegisteredTask(Protocol):
    """What the registry holds and a worker runs: `TaskFunction`s and `Task` subclasses."""

    task_name: str
    options: TaskOptions
    is_async: bool  # run_call returns a coroutine to await (an `async def` task)

    def run_call(self, call: Call, message: Message | None = None) -> Any:
        """Run the task for one decoded call (hooks included) and return its value."""
        ...


class Registry:
    """Task names to tasks. Thread-safe; registering one object twice under a name is a no-op."""

    def __init__(self) -> None:
        self._tasks: dict[str, RegisteredTask] = {}
        self._lock = threading.Lock()
        # called with an unknown name before giving up: a resolver may import the task's module (the
        # ndkale compat resolves `module.Class` names so, as ndkale did); it returns None if it cannot
        self._resolvers: list[Callable[[str], RegisteredTask | None]] = []

    def add_resolver(self, resolver: Callable[[str], RegisteredTask | None]) -> None:
        """Ask `resolver(name)` for a task registered under no name yet (once per resolver)."""
        with self._lock:
            if resolver not in self._resolvers:
                self._resolvers.append(resolver)

    def register(self, name: str, task: RegisteredTask) -> None:
        """Register `task` as `name`; DuplicateTaskError if another object has the name."""
        if type(name) is not str or not name or name.startswith(ADHOC_TASK_PREFIX):
            raise TaskOptionError(f"a task name must be a non-empty str not starting with {ADHOC_TASK_PREFIX!r}, got {name!r}")
        with self._lock:
            old = self._tasks.get(name)
            if old is not None and old is not task:
                raise DuplicateTaskError(
                    f"task name {name!r} is already registered to {old!r}; cannot register {task!r}. "
                    "Give one of them another name (name=...), or check the module is not imported twice "
                    "(as __main__ and by its module name)"
                )
            self._tasks[name] = task

    def unregister(self, name: str) -> None:
        with self._lock:
            self._tasks.pop(name, None)

    def get(self, name: str) -> RegisteredTask:
        """The task registered as `name`; UnknownTaskError (not retryable) lists what is registered."""
        t = self._tasks.get(name)
        if t is None and name.startswith("__main__."):
            # a child process (spawn, forkserver) imports the parent's main script as __mp_main__
            t = self._tasks.get("__mp_main__." + name[len("__main__.") :])
        failed = ""
        for resolve in list(self._resolvers) if t is None else ():
            try:  # a resolver that raises finds nothing: an unknown task stays UnknownTaskError, never retried
                if (t := resolve(name)) is not None:
                    break
            except Exception as e:
                log.warning("task %r: resolver %r raised %s: %s", name, resolve, type(e).__name__, e)
                failed = f" (a resolver raised {type(e).__name__}: {e})"
        if t is None:
            names = self.names()
            close = difflib.get_close_matches(name, names, n=1)
            raise UnknownTaskError(name, names, (f" (did you mean {close[0]!r}?)" if close else "") + failed)
        return t

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


registry = Registry()
"""The process-wide registry: tasks register here unless given another."""


def import_named(name: str, what: str = "task module") -> ModuleType:
    """Import the module `name`: `what` it is to the user, a task module (its tasks register) or a settings module.

    A ConfigError says what went wrong where it is: the module not found (the path), a module it
    imports missing (a dependency to install, or a module of its own package), or its own code
    raising as it ran (the original error chained).
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if not missing or missing == name or name.startswith(missing + "."):  # the module, or a package of its
            raise ConfigError(f"cannot import {what} {name!r}: {e} (is it under the current directory, or on PYTHONPATH?)") from e
        raise ConfigError(f"{what} {name!r} imports {missing!r}, which is not found: {_missing_why(name, missing)}") from e
    except Exception as e:
        raise ConfigError(f"{what} {name!r}{_origin(name)} raised {type(e).__name__} as it was imported: {e}") from e


def _missing_why(name: str, missing: str) -> str:
    """What to do about module `missing`, not found as module `name` imported it."""
    top = missing.split(".")[0]
    if top == name.split(".")[0]:
        return f"a module of its own package {top!r}: check the import, and that the module is there"
    if top != missing and (where := _origin(top)):  # a package that is there, without that module
        return f"{top!r} is installed{where} but has no module {missing!r}: check the import, and the version installed"
    return f"install the package that provides {top!r} in this Python environment ({sys.executable})"


def _origin(name: str) -> str:
    """Where module `name` is found, as " (path)" ("" when it cannot be told).

    Only when its package is imported already: finding it would otherwise import the package, running
    again code that may just have failed.
    """
    parent = name.rpartition(".")[0]
    if parent and parent not in sys.modules:
        return ""
    try:
        spec = importlib.util.find_spec(name)
    except Exception:  # a name find_spec refuses, say
        return ""
    return f" ({spec.origin})" if spec is not None and spec.origin else ""
