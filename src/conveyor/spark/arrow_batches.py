"""Spark's byte bound on the Arrow batches it feeds Python, lifted for a job whose rows cannot reach it.

Spark cuts the rows it sends a Python task (`mapInArrow`) into Arrow batches of at most
`spark.sql.execution.arrow.maxRecordsPerBatch` rows and `spark.sql.execution.arrow.maxBytesPerBatch`
bytes. To hold the second it measures the batch it is building after every row, over every
column: with W1's 64 numeric columns (bench/bench_inference.py) that measure took a third of the
JVM's CPU in the consumers' job, and a map_batches of W1's 200,000 rows took 1.76 s with it, 1.33 s
without it (the JVM's quick compiler only). Rows whose columns are all of fixed width cannot reach the byte bound within
the row bound; for a job over such rows the byte bound is set to Spark's "none" (Int.MaxValue,
which skips the measure) while Spark plans the job, and put back as soon as a task of it runs.

The setting is the session's: a query of the same session that Spark plans in that window (from
another thread) gets its batches cut by rows only. Concurrent lifts share one window; the last
to end puts the user's own value back.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType, StructType

MAX_BYTES_KEY = "spark.sql.execution.arrow.maxBytesPerBatch"
MAX_RECORDS_KEY = "spark.sql.execution.arrow.maxRecordsPerBatch"
UNBOUNDED = str(2**31 - 1)  # Spark's "no byte bound": it then skips the measure per row
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgtp]?)i?b?\s*$", re.I)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}


@dataclass
class _Window:
    """The session's lift: how many jobs hold it, and the user's own value to put back (None: unset)."""

    holders: int
    own: str | None


_LOCK = threading.Lock()
_WINDOWS: dict[int, _Window] = {}  # by id() of the session


class ByteBoundLift:
    """A context lifting the byte bound for one job over rows of `schema` (see the module docstring).

    Does nothing where the rows could reach the bound (a column of variable width: strings,
    binary, arrays, maps), where rows are not bounded, or where a setting cannot be read.
    `release()` ends the lift early (at the job's first task: its plan is made); it is idempotent,
    and leaving the context releases it too.
    """

    def __init__(self, spark: SparkSession, schema: StructType | None) -> None:
        self.spark = spark
        self._schema = schema
        self._held = False

    def __enter__(self) -> ByteBoundLift:
        if self._schema is None or not self._moot(self._schema):
            return self
        with _LOCK:
            window = _WINDOWS.get(id(self.spark))
            if window is None:
                window = _WINDOWS[id(self.spark)] = _Window(0, self.spark.conf.get(MAX_BYTES_KEY, None))
                self.spark.conf.set(MAX_BYTES_KEY, UNBOUNDED)
            window.holders += 1
            self._held = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """End this job's hold; the last one puts the user's value back."""
        with _LOCK:
            if not self._held:
                return
            self._held = False
            window = _WINDOWS[id(self.spark)]
            window.holders -= 1
            if window.holders:
                return
            del _WINDOWS[id(self.spark)]
            if window.own is None:
                self.spark.conf.unset(MAX_BYTES_KEY)
            else:
                self.spark.conf.set(MAX_BYTES_KEY, window.own)

    def _moot(self, schema: StructType) -> bool:
        """Whether rows of `schema` stay under the byte bound within the row bound."""
        width = _width(schema)
        if width is None:
            return False
        try:
            records = int(str(self.spark.conf.get(MAX_RECORDS_KEY)))
            max_bytes = _bytes(str(self.spark.conf.get(MAX_BYTES_KEY)))
        except Exception:  # a value this cannot read: the bound stays as Spark keeps it
            return False
        return records > 0 and max_bytes is not None and records * width < max_bytes


def _width(data_type: DataType) -> int | None:
    """Bytes a value of `data_type` takes in an Arrow batch at most, its validity bit counted as a byte; None: no bound."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.StructType):
        widths = [_width(f.dataType) for f in data_type.fields]
        return None if None in widths else 1 + sum(w for w in widths if w is not None)
    fixed: list[tuple[type[DataType], int]] = [
        (T.BooleanType, 1),
        (T.ByteType, 1),
        (T.ShortType, 2),
        (T.IntegerType, 4),
        (T.DateType, 4),
        (T.FloatType, 4),
        (T.LongType, 8),
        (T.DoubleType, 8),
        (T.TimestampType, 8),
        (T.TimestampNTZType, 8),
        (T.DecimalType, 16),
        (T.NullType, 0),
    ]
    for kind, size in fixed:
        if isinstance(data_type, kind):
            return 1 + size
    return None


def _bytes(value: str) -> int | None:
    """A Spark size setting ("67108864b", "64m", "1g", "1024") in bytes; None if it is not one."""
    m = _SIZE.match(value)
    return None if m is None else int(m.group(1)) * _UNITS[m.group(2).lower()]
