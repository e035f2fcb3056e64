"""Queue configurations: what publishers and workers know of a queue (a YAML file in ndkale's format).

Queue YAML, as ndkale writes it: a mapping of entries, each with the queue's fields. The entry's
key is only a label; `name` names the queue (and defaults to the key when left out). A list of
entries with a `name` each is accepted too. Fields left out take ndkale's defaults; an unknown
field is an error (a typo would otherwise fall back to a default silently).

    default:
      name: default
      priority: 75                 # selectors: higher is more important; lotteries count 1..100
      batch_size: 10               # messages per fetch (left out: as many as the consumer may hold)
      visibility_timeout_sec: 600  # the lease of a fetched message; task time limits stay below it
      long_poll_time_sec: 5        # how long a fetch waits on an empty queue
      num_iterations: 5            # batches served from the queue per selection
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.constants import (
    QUEUE_DEFAULT_LONG_POLL_S,
    QUEUE_DEFAULT_NUM_ITERATIONS,
    QUEUE_DEFAULT_PRIORITY,
    QUEUE_DEFAULT_VISIBILITY_TIMEOUT_S,
)
from conveyor.errors import ConfigError


def _int(v: object) -> bool:
    return type(v) is int


def _seconds(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """One queue's configuration (ndkale's TaskQueue fields); checked on construction."""

    name: str
    priority: int = QUEUE_DEFAULT_PRIORITY
    batch_size: int | None = None  # None: as many as the consumer may hold (see conveyor.worker.pacing)
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
        if self.batch_size is not None and not (_int(self.batch_size) and self.batch_size >= 1):
            raise bad("batch_size", "an integer >= 1 (or left out)")
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
