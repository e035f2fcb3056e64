"""Worker configuration: the settings module (the queue YAML it names is read by `conveyor.tasks.queue_config`).

Settings: the module named by CONVEYOR_SETTINGS_MODULE (like ndkale's KALE_SETTINGS_MODULE), read
once per `load_settings()` call. Only these upper-case names are read; the rest of the module is
the application's business:

    QUEUE_CONFIG        path of the queue YAML; relative to the settings module's directory
                        (None: a single queue "default" with the default fields)
    QUEUE_SELECTOR      a selector name ("ReducedLottery", the default), a dotted path to a
                        QueueSelector subclass, or the class itself
    TASK_MODULES        modules a worker imports at start so their tasks are registered (default ())
    ON_WORKER_STARTUP   a callable run when a worker starts (default None)
    ON_WORKER_SHUTDOWN  a callable run when a worker stops (default None)

Unlike ndkale, a settings module that cannot be imported is an error, not a logged warning.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.constants import (
    DEFAULT_QUEUE,
    DEFAULT_SELECTOR,
    SETTINGS_ENV,
)
from conveyor.errors import ConfigError
from conveyor.tasks.queue_config import QueueConfig, load_queues
from conveyor.tasks.registry import import_named
from conveyor.worker.selectors import QueueSelector, selector_class


@dataclass(frozen=True)
class Settings:
    """A worker's settings (see the module docstring for where each comes from)."""

    queue_config: Path | None = None
    queue_selector: str | type[QueueSelector] = DEFAULT_SELECTOR
    task_modules: tuple[str, ...] = ()
    on_worker_startup: Callable[[], object] | None = None
    on_worker_shutdown: Callable[[], object] | None = None
    module: str | None = None  # the settings module these came from (None: defaults)

    def queues(self) -> list[QueueConfig]:
        """The configured queues, highest priority first."""
        if self.queue_config is None:
            return [QueueConfig(DEFAULT_QUEUE)]
        return load_queues(self.queue_config)

    def selector(self, rng: random.Random | None = None) -> QueueSelector:
        return selector_class(self.queue_selector)(rng)

    def import_task_modules(self) -> None:
        """Import TASK_MODULES, registering their tasks."""
        for m in self.task_modules:
            try:
                import_named(m)
            except ConfigError as e:
                raise ConfigError(f"{self.module}: TASK_MODULES: {e}") from e


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from the module named by CONVEYOR_SETTINGS_MODULE in `environ` (default os.environ).

    The defaults when it is unset or empty.
    """
    env = os.environ if environ is None else environ
    name = env.get(SETTINGS_ENV, "").strip()
    if not name:
        return Settings()
    try:
        mod = import_named(name, "settings module")
    except ConfigError as e:
        raise ConfigError(f"{SETTINGS_ENV}={name!r}: {e}") from e.__cause__
    where = f"settings module {name!r}"

    def get(attr: str, default: Any, ok: Callable[[Any], bool], want: str) -> Any:
        v = getattr(mod, attr, default)
        if not ok(v):
            raise ConfigError(f"{where}: {attr} must be {want}, got {v!r}")
        return v

    qc = get("QUEUE_CONFIG", None, lambda v: v is None or isinstance(v, (str, os.PathLike)), "a path or None")
    path: Path | None = None
    if qc is not None:
        path = Path(qc)
        where_file = getattr(mod, "__file__", None)
        if not path.is_absolute() and where_file:
            path = Path(where_file).parent / path
    selector = get("QUEUE_SELECTOR", DEFAULT_SELECTOR, lambda v: isinstance(v, (str, type)), "a name or a class")
    try:
        selector_class(selector)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    modules = get(
        "TASK_MODULES", (), lambda v: isinstance(v, (list, tuple)) and all(type(m) is str for m in v), "a list of module names"
    )
    hook_ok = lambda v: v is None or callable(v)  # noqa: E731
    return Settings(
        queue_config=path,
        queue_selector=selector,
        task_modules=tuple(modules),
        on_worker_startup=get("ON_WORKER_STARTUP", None, hook_ok, "a callable or None"),
        on_worker_shutdown=get("ON_WORKER_SHUTDOWN", None, hook_ok, "a callable or None"),
        module=name,
    )
