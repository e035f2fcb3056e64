"""ndkale's settings (`from kale import settings`): ndkale's names and defaults, overridable.

The upper-case names of the module named by `KALE_SETTINGS_MODULE` override them; settings are read
as attributes (`settings.QUEUE_CONFIG`), and set so too, as on ndkale's settings object
(`settings.QUEUE_CONFIG = ...`, `mock.patch("...settings.ON_WORKER_STARTUP")`): a setting set on
this module is the current settings' until it is deleted (which restores it) or the settings are
read again (`reload`).

Read on first use (a publish, a worker, a task's failure), never at import nor when a task class is
defined: a tasks module imports before the variable is set, and a settings module may import the
tasks (a read while the settings module is still importing is a circular import: an error). Unlike
ndkale, a settings module that cannot be imported, or a setting of the wrong type, raises
`ImproperlyConfiguredException` (a `ConfigError`) instead of logging and running on defaults; with
the variable unset the defaults apply, as in ndkale. The settings Conveyor reads, and the extra
ones it adds (`CONVEYOR_*`), are listed in docs/migrating-from-ndkale.md.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import platform
import sys
import threading
import time
import types
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from conveyor.compat.kale.exceptions import ImproperlyConfiguredException
from conveyor.errors import ConfigError
from conveyor.tasks.registry import import_named

log = logging.getLogger(__name__)

ENVIRONMENT_VARIABLE = "KALE_SETTINGS_MODULE"


def _nothing() -> None:
    """ndkale's default worker startup and shutdown hook."""


def _no_tags(queue_name: str) -> dict[str, str]:
    """ndkale's default SQS_QUEUE_TAG_FUNCTION: no tags (kept for code that calls it; Conveyor queues have none)."""
    return {}


def _publisher_str() -> str:
    """ndkale's default PUBLISHER_STR_FUNC: who published, as `host[pid]`."""
    return f"{platform.node()}[{os.getpid()}]"


# ndkale's defaults, by its names (settings Conveyor has no use for are kept so user code reading
# them still works); then the extra settings of the compat layer
DEFAULTS: dict[str, Any] = {
    "PROPERLY_CONFIGURED": False,
    "ON_WORKER_STARTUP": _nothing,
    "ON_WORKER_SHUTDOWN": _nothing,
    "TASK_MAPPER": {},
    "COMPRESSOR": zlib.compress,
    "DECOMPRESSOR": zlib.decompress,
    "MESSAGE_QUEUE_ENDPOINT_URL": "",
    "AWS_ACCESS_KEY_ID": "",
    "AWS_SECRET_ACCESS_KEY": "",
    "AWS_REGION": "",
    "SQS_TASK_SIZE_LIMIT": 256000,
    "SQS_QUEUE_TAG_FUNCTION": _no_tags,
    "RETRY_DELAY_MULTIPLE_SEC": 60,
    "SQS_MAX_TASK_DELAY_SEC": 900,
    "TIMESTAMP_FUNC": time.time,
    "PUBLISHER_STR_FUNC": _publisher_str,
    "PICKLE_PROTOCOL": pickle.DEFAULT_PROTOCOL,
    "RESET_TIMEOUT_THRESHOLD": 1,
    "USE_DEAD_LETTER_QUEUE": True,
    "ENABLE_DEAD_LETTER_QUEUE": True,
    "QUEUE_CONFIG": "queue_config.yaml",
    "QUEUE_CLASS": "kale.queue_info.TaskQueue",
    "QUEUE_SELECTOR": "kale.queue_selector.ReducedLottery",
    "DIE_ON_RESIDENT_SET_SIZE_MB": 256,
    "UTIL_CRYPT_CIPHER": "1234567890123456",
    # Conveyor's own: the servers' auth token, and how a worker runs its tasks
    "CONVEYOR_TOKEN": None,
    "CONVEYOR_CONCURRENCY": 1,  # ndkale runs one task at a time per worker process
    "CONVEYOR_MODE": "process",  # a process per slot: a task past its time limit can be killed
}


def _seconds(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "ON_WORKER_STARTUP": (callable, "a callable"),
    "ON_WORKER_SHUTDOWN": (callable, "a callable"),
    "TASK_MAPPER": (
        lambda v: isinstance(v, Mapping) and all(type(x) is str for x in [*v, *v.values()]),
        "a dict of task names to dotted paths",
    ),
    "MESSAGE_QUEUE_ENDPOINT_URL": (lambda v: type(v) is str, "a str (tcp://host:port[,tcp://host:port...])"),
    "TIMESTAMP_FUNC": (callable, "a callable"),  # called on every publish
    "PUBLISHER_STR_FUNC": (callable, "a callable"),
    "RETRY_DELAY_MULTIPLE_SEC": (lambda v: _seconds(v) and v > 0, "a number of seconds > 0"),
    "SQS_MAX_TASK_DELAY_SEC": (lambda v: _seconds(v) and v > 0, "a number of seconds > 0"),
    "QUEUE_CONFIG": (lambda v: isinstance(v, (str, os.PathLike)), "a path"),
    "QUEUE_CLASS": (lambda v: isinstance(v, (str, type)), "a dotted name or a class"),
    "QUEUE_SELECTOR": (lambda v: isinstance(v, (str, type)), "a dotted name or a class"),
    "DIE_ON_RESIDENT_SET_SIZE_MB": (lambda v: _seconds(v) and v > 0, "a number of MB > 0"),
    "CONVEYOR_TOKEN": (lambda v: v is None or type(v) is str, "a str or None"),
    "CONVEYOR_CONCURRENCY": (lambda v: type(v) is int and v >= 1, "an int >= 1"),
    "CONVEYOR_MODE": (lambda v: v in ("thread", "process"), "'thread' or 'process'"),
}


class Settings:
    """ndkale's defaults overridden by the settings module's upper-case names, as attributes."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        values = dict(DEFAULTS)
        env = os.environ if environ is None else environ
        name = env.get(ENVIRONMENT_VARIABLE, "").strip()
        self.module: str | None = name or None
        if not name:
            log.warning("%s is not set: the kale settings are the defaults", ENVIRONMENT_VARIABLE)
        else:
            try:
                mod = import_named(name, "settings module")
            except ConfigError as e:  # not found, or raising as it ran: the original error chained
                raise ImproperlyConfiguredException(f"{ENVIRONMENT_VARIABLE}={name!r}: {e}") from e.__cause__
            values.update((k, getattr(mod, k)) for k in dir(mod) if k == k.upper() and not k.startswith("_"))
            values["PROPERLY_CONFIGURED"] = True
        for key, (ok, want) in _CHECKS.items():
            if not ok(values[key]):
                raise ImproperlyConfiguredException(f"settings module {name!r}: {key} must be {want}, got {values[key]!r}")
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:  # only for names no default or module set
        raise AttributeError(f"no kale setting {name!r} (settings module {self.module!r})")

    def queue_config_path(self) -> Path:
        """QUEUE_CONFIG, a relative path taken from the working directory (as ndkale opens it)."""
        return Path(os.fspath(self.QUEUE_CONFIG)).absolute()


_current: Settings | None = None
_lock = threading.RLock()  # re-entrant: a read while this thread imports the settings module is an error, not a hang
_reading = False  # under _lock: its holder is reading the settings (importing their module)


_MISSING = object()
_saved: dict[str, Any] = {}  # under _lock: what a setting set on this module was before (restored when deleted)


def _read(environ: Mapping[str, str] | None) -> Settings:
    """Read the settings (under _lock, by a thread not reading them already)."""
    global _current, _reading
    _reading = True
    try:
        _current = Settings(environ)
        _saved.clear()  # what was set on the module was the old settings'
    finally:
        _reading = False
    return _current


def _check_not_reading() -> None:
    """Under _lock: a read from inside a read is a circular import, said so.

    Such a read (a module the settings module imports reads the settings at its import) would see
    settings not yet made. A plain lock would hang.
    """
    if _reading:  # under the re-entrant lock: only the reading thread gets here
        raise ImproperlyConfiguredException(
            f"the kale settings were read while their module ({os.environ.get(ENVIRONMENT_VARIABLE)!r}) was still "
            "importing: a circular import. Read settings in functions, not at import time of a module the settings "
            "module imports"
        )


def current() -> Settings:
    """The settings, read from the environment on first use."""
    with _lock:
        _check_not_reading()
        return _current if _current is not None else _read(None)


def reload(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings again (after changing KALE_SETTINGS_MODULE, say)."""
    with _lock:
        _check_not_reading()
        return _read(environ)


def __getattr__(name: str) -> Any:
    # `settings.QUEUE_CONFIG` on this module reads the current settings, as ndkale's settings object does
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(current(), name)


class _SettingsModule(types.ModuleType):
    """This module, whose upper-case attributes set or deleted are the current settings'.

    ndkale's settings are an object that code and tests set attributes on; here `settings.X = v`
    sets X on the current settings (remembering what it was), and `del settings.X` restores that,
    which is what `mock.patch` does on leaving. The module's own constants are left alone.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if not _is_setting(self, name):
            super().__setattr__(name, value)
            return
        with _lock:
            s = current()
            _saved.setdefault(name, s.__dict__.get(name, _MISSING))
            setattr(s, name, value)

    def __delattr__(self, name: str) -> None:
        if not _is_setting(self, name):
            super().__delattr__(name)
            return
        with _lock:
            s = current()
            before = _saved.pop(name, _MISSING)
            if before is not _MISSING:
                s.__dict__[name] = before
            elif name in s.__dict__:
                del s.__dict__[name]
            else:
                raise AttributeError(name)


def _is_setting(module: types.ModuleType, name: str) -> bool:
    """Whether `name` is a setting's (upper case), not one of the module's own names (DEFAULTS)."""
    return name == name.upper() and not name.startswith("_") and name not in vars(module)


sys.modules[__name__].__class__ = _SettingsModule
