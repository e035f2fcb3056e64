"""Worker configuration: the queues (a YAML file in ndkale's format) and the settings module.

Queue YAML, as ndkale writes it: a mapping of entries, each with the queue's fields. The entry's
key is only a label; `name` names the queue (and defaults to the key when left out). A list of
entries with a `name` each is accepted too. Fields left out take ndkale's defaults; an unknown
field is an error (a typo would otherwise fall back to a default silently).

    default:
      name: default
      priority: 75                 # selectors: higher is more important; lotteries count 1..100
      batch_size: 10               # messages per fetch
      visibility_timeout_sec: 600  # the lease of a fetched message; task time limits stay below it
      long_poll_time_sec: 5        # how long a fetch waits on an empty queue
      num_iterations: 5            # batches served from the queue per selection

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

import dataclasses
import importlib
import math
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.constants import (
    DEFAULT_QUEUE,
    DEFAULT_SELECTOR,
    QUEUE_DEFAULT_BATCH_SIZE,
    QUEUE_DEFAULT_LONG_POLL_S,
    QUEUE_DEFAULT_NUM_ITERATIONS,
    QUEUE_DEFAULT_PRIORITY,
    QUEUE_DEFAULT_VISIBILITY_TIMEOUT_S,
    SETTINGS_ENV,
)
from conveyor.errors import ConfigError
from conveyor.worker.selectors import QueueSelector, selector_class


def _int(v: object) -> bool:
    return type(v) is int


def _seconds(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """One queue's configuration (ndkale's TaskQueue fields); checked on construction."""

    name: str
    priority: int = QUEUE_DEFAULT_PRIORITY
    batch_size: int = QUEUE_DEFAULT_BATCH_SIZE
    visibility_timeout_sec: float = QUEUE_DEFAULT_VISIBILITY_TIMEOUT_S
    long_poll_time_sec: float = QUEUE_DEFAULT_LONG_POLL_S
    num_iterations: int = QUEUE_DEFAULT_NUM_ITERATIONS

    def __post_init__(self) -> None:
        def bad(field: str, want: str) -> ConfigError:
            return ConfigError(f"queue {self.name!r}: field {field!r} must be {want}, got {getattr(self, field)!r}")

        if type(self.name) is not str or not self.name:
            raise bad("name", "a non-empty string")
        if not _int(self.priority):  # any int: lotteries skip those outside 1..100, which parks a queue
            raise bad("priority", "an integer (lotteries count 1..100)")
        if not (_int(self.batch_size) and self.batch_size >= 1):
            raise bad("batch_size", "an integer >= 1")
        if not (_seconds(self.visibility_timeout_sec) and self.visibility_timeout_sec > 0):
            raise bad("visibility_timeout_sec", "a number of seconds > 0")
        if not (_seconds(self.long_poll_time_sec) and self.long_poll_time_sec >= 0):
            raise bad("long_poll_time_sec", "a number of seconds >= 0")
        if not (_int(self.num_iterations) and self.num_iterations >= 1):
            raise bad("num_iterations", "an integer >= 1")
        object.__setattr__(self, "visibility_timeout_sec", float(self.visibility_timeout_sec))
        object.__setattr__(self, "long_poll_time_sec", float(self.long_poll_time_sec))

    @classmethod
    def from_mapping(cls, entry: object, key: str | None = None) -> QueueConfig:
        """A QueueConfig from one YAML entry (`key`: its label in a mapping, the default name)."""
        label = repr(key) if key is not None else "entry"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"queue {label}: expected a mapping of fields, got {type(entry).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in entry if k not in fields)
        if unknown:
            raise ConfigError(f"queue {entry.get('name', key)!r}: unknown field(s) {unknown}; known: {sorted(fields)}")
        values: dict[str, Any] = dict(entry)
        if "name" not in values:
            if key is None:
                raise ConfigError(f"queue {label}: field 'name' is required in a list of queues")
            values["name"] = key
        return cls(**values)


def load_queues(path: str | os.PathLike[str]) -> list[QueueConfig]:
    """The queues of a YAML file, highest priority first. ConfigError names the file, queue and field."""
    import yaml  # here, not at import time: `import conveyor` stays light

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the queue configuration: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    try:
        if isinstance(doc, Mapping):
            queues = [QueueConfig.from_mapping(v, str(k)) for k, v in doc.items()]
        elif isinstance(doc, list):
            queues = [QueueConfig.from_mapping(v) for v in doc]
        else:
            raise ConfigError(f"expected a mapping (or list) of queues, got {type(doc).__name__}")
        if not queues:
            raise ConfigError("no queues configured")
        seen: set[str] = set()
        for q in queues:
            if q.name in seen:
                raise ConfigError(f"queue {q.name!r} is configured twice")
            seen.add(q.name)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return sorted(queues, key=lambda q: q.priority, reverse=True)


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
                importlib.import_module(m)
            except ImportError as e:
                raise ConfigError(f"{self.module}: TASK_MODULES: cannot import {m!r}: {e}") from e


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from the module named by CONVEYOR_SETTINGS_MODULE in `environ` (default
    os.environ); the defaults when it is unset or empty."""
    env = os.environ if environ is None else environ
    name = env.get(SETTINGS_ENV, "").strip()
    if not name:
        return Settings()
    try:
        mod = importlib.import_module(name)
    except ImportError as e:
        raise ConfigError(f"{SETTINGS_ENV}={name!r}: cannot import the settings module (is it on sys.path?): {e}") from e
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
        if not path.is_absolute() and getattr(mod, "__file__", None):
            path = Path(mod.__file__).parent / path  # type: ignore[arg-type]
    selector = get("QUEUE_SELECTOR", DEFAULT_SELECTOR, lambda v: isinstance(v, (str, type)), "a name or a class")
    try:
        selector_class(selector)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    modules = get("TASK_MODULES", (), lambda v: isinstance(v, (list, tuple)) and all(type(m) is str for m in v),
                  "a list of module names")  # fmt: skip
    hook_ok = lambda v: v is None or callable(v)  # noqa: E731
    return Settings(
        queue_config=path,
        queue_selector=selector,
        task_modules=tuple(modules),
        on_worker_startup=get("ON_WORKER_STARTUP", None, hook_ok, "a callable or None"),
        on_worker_shutdown=get("ON_WORKER_SHUTDOWN", None, hook_ok, "a callable or None"),
        module=name,
    )
