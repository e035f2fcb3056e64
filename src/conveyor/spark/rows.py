"""Rows through the queue for `conveyor.spark.map`: its form of the queue job (`conveyor.spark.job`).

Rows dealt to messages (a few to a message, each a `RowRunner` call: `DealRows`), run (each row
tried per the retry policy), and the outcomes read back as Arrow batches with `_id`, `_error` and
`_input` (`ReadRows`, `read_results`, over the job's walk of a server: `ServerOutcomes`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard, cast

from conveyor.client.sharded import ShardedQueues
from conveyor.constants import (
    H_IDEMPOTENCY_KEY,
    H_TASK,
    INPUT_MAX_CHARS,
    JOB_RESULT_BUILT,
    JOB_RESULT_ROWS,
    MAP_DEFAULT_ROWS_PER_MESSAGE,
    OUTCOME_INPUT,
    OUTCOME_KEY,
    OUTCOME_OK,
    OUTCOME_VALUE,
    SHARD_SHIFT,
)
from conveyor.errors import ConveyorError
from conveyor.message import Message
from conveyor.spark.fits import FitCheck
from conveyor.spark.form import Parcel, ServerOutcomes
from conveyor.spark.instances import BuildError, Instances
from conveyor.spark.records import ReadCounts
from conveyor.tasks.envelope import PackedResult, decode_call, decode_result, encode_error, pack_plain
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.policy import attempts_for
from conveyor.tasks.publish import build_message
from conveyor.tasks.runner import current_message, worker_backend

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

EXTRA_COLUMNS = ("_id", "_error", "_input")  # added to every output row
READ_BATCH_ROWS = 10_000
MAX_ROWS_PER_MESSAGE = 1000
# rows that take this long on average where they run travel one to a message from then on (RowRunner's
# `split_slow`): the queue's cost per message (~0.1 ms) is nothing beside them, and one row a message
# balances best (a slow row never holds up its neighbours' start)
SLOW_ROW_S = 0.02
SPLIT_PREFIX = "split:"  # the idempotency keys of rows split off a message (RowRunner)


@dataclass(slots=True)
class RowOutcome:
    """What became of one row in a `RowRunner` call (not frozen: one is made per row, and a frozen one costs 3.5x)."""

    ok: bool
    value: Any  # ok: the output row, a dict of the schema's columns; else the error text
    input: str | None = None  # a failed row's input, as `_input` shows it (`input_json`)
    key: str = ""  # the idempotency key of the split message it ran in (SPLIT_PREFIX...), else ""

    def to_wire(self) -> list[Any]:
        """As a result carries it: its fields in this order (OUTCOME_*, which `from_wire` reads)."""
        return [self.ok, self.value, self.input, self.key]

    @classmethod
    def from_wire(cls, item: list[Any]) -> RowOutcome:
        return cls(bool(item[OUTCOME_OK]), item[OUTCOME_VALUE], item[OUTCOME_INPUT], str(item[OUTCOME_KEY]))


@dataclass(frozen=True, slots=True)
class RowsResult:
    """A `RowRunner` call's result: one outcome per row, and the instances of func's class it reports built."""

    outcomes: list[RowOutcome]
    built: int  # since the last result said so (`Instances.take_built`)

    def to_wire(self) -> list[Any]:
        """As the task returns it, for msgpack (JOB_RESULT_*)."""
        return job_result([o.to_wire() for o in self.outcomes], self.built)

    @classmethod
    def from_wire(cls, data: object) -> RowsResult:
        """A result the read-back decoded (`decode_result`)."""
        items = cast("list[Any]", data)
        return cls([RowOutcome.from_wire(o) for o in items[JOB_RESULT_ROWS]], int(items[JOB_RESULT_BUILT]))


def packed(result: list[Any]) -> PackedResult | list[Any]:
    """A result encoded here, in one walk (`pack_plain`); as it is if its values are not all plain (then pickled)."""
    try:
        return PackedResult(pack_plain(result))
    except (TypeError, ValueError, OverflowError):
        return result


def job_result(rows: Any, built: int) -> list[Any]:
    """A map or map_batches task's result as msgpack carries it (JOB_RESULT_*)."""
    out: list[Any] = [None] * 2
    out[JOB_RESULT_ROWS], out[JOB_RESULT_BUILT] = rows, built
    return out


class _Rows:
    """What both row runners share: a row's outcomes, checked against the schema, and the split (see RowRunner)."""

    def __init__(
        self,
        func: Instances,
        max_retries: int,
        schema: pa.Schema,
        row_options: TaskOptions | None = None,
        time_limit: float | None = None,
        split_slow: bool = False,
    ) -> None:
        self.func = func
        self.max_retries = max_retries
        self._attempts = attempts_for(max_retries)  # each row's runs at most (the same policy as a task's retries)
        self.schema = schema
        self.row_options = row_options or TaskOptions()
        self.time_limit = time_limit  # of each call, where the runner enforces it (AsyncRowRunner)
        self.split_slow = split_slow  # rows_per_message left out: slow rows go one to a message (RowRunner)
        self._rows = 0  # rows run in this process, and their seconds (races between threads only blur the mean)
        self._seconds = 0.0

    @functools.cached_property
    def _fit(self) -> FitCheck:
        return FitCheck(self.schema)  # built where the rows run, at the first message

    def _split_due(self, message: Message | None, rows: list[dict[str, Any]], slow: bool = False) -> TypeGuard[Message]:
        """Whether to run `message`'s rows each alone: several, and it comes again (or they are `slow`)."""
        return message is not None and len(rows) > 1 and (message.attempts > 1 or slow)

    def _result(
        self, message: Message | None, rows: list[dict[str, Any]], out: list[RowOutcome] | BuildError
    ) -> PackedResult | list[Any]:
        """The call's result: its outcomes (the rows' fit to the schema checked, a split row's key added)."""
        if isinstance(out, BuildError):
            out = [RowOutcome(False, str(out), input_json(row)) for row in rows]
        ok = [j for j, o in enumerate(out) if o.ok]
        for k, why in _misfits([out[j].value for j in ok], self.schema, self._fit).items():
            j = ok[k]
            out[j] = RowOutcome(False, f"map: {why}", input_json(rows[j]))
        key = "" if message is None else _key(message)
        if key.startswith(SPLIT_PREFIX):
            out = [dataclasses.replace(o, key=key) for o in out]
        return packed(RowsResult(out, self.func.take_built()).to_wire())

    @functools.cached_property
    def _names(self) -> list[str]:
        names: list[str] = self.schema.names  # a new list at each ask: asked once
        return names

    def _ok(self, value: Any, row: dict[str, Any]) -> RowOutcome:
        """A row's outcome from func's value: the output row, or why the value is not one."""
        try:
            return RowOutcome(True, _row(value, self._names))
        except ConveyorError as e:
            return RowOutcome(False, str(e), input_json(row))

    def _failed(self, error: Exception, row: dict[str, Any]) -> RowOutcome:
        """A row's outcome once its last run raised `error`."""
        return RowOutcome(False, encode_error(error), input_json(row))

    def _split(self, message: Message, rows: list[dict[str, Any]]) -> bool:
        """Each row of `message` back on its server alone, once whatever the attempts.

        Idempotency keys make it once. False where the worker has no servers to put them on (the
        rows then run together).
        """
        backend = worker_backend()
        if not isinstance(backend, ShardedQueues):
            return False
        name = message.headers[H_TASK]
        backend.clients[message.id >> SHARD_SHIFT].put(
            message.queue,
            [
                build_message(name, self.row_options, ([row],), {}, key=f"{SPLIT_PREFIX}{message.id}:{j}")
                for j, row in enumerate(rows)
            ],
        )
        return True


class RowRunner(_Rows):
    """The task of one message: a plain `func` over its rows in turn, each tried up to 1 + max_retries times.

    Returns a `RowsResult` (as its `to_wire`): an outcome per row, and the instances of func's class
    built here since the last result said so. A class given as func that cannot be built fails every row with
    its error (`BuildError`). A result that does not fit `schema` fails its row here, where the input is at hand.
    A row's failure never fails its neighbours; the message itself fails only if its worker dies
    or it runs over its time limit. Delivered again (after that, or a stop), a message of several rows is split:
    each row goes back on the same server as a message of its own (`row_options`, key
    `split:<id>:<row>`), whose outcome ends with that key, and this one's result holds no rows. So
    one row that crashes its process, or hangs, fails alone (`read_results` takes each row once).
    """

    def __call__(self, rows: list[dict[str, Any]]) -> PackedResult | list[Any]:
        message = current_message()
        if self._split_due(message, rows, self._slow()) and self._split(message, rows):
            return RowsResult([], self.func.take_built()).to_wire()
        try:
            func = self.func.get()
        except BuildError as e:
            return self._result(message, rows, e)
        start = time.perf_counter()
        out: list[RowOutcome] = []
        last = self.max_retries
        for row in rows:  # each row run up to 1 + max_retries times; a loop here, not a call per row: the no-op row's cost
            for attempt in range(self._attempts):
                try:
                    value = func(row)
                except Exception as e:
                    if attempt == last:
                        out.append(self._failed(e, row))
                    continue
                out.append(self._ok(value, row))
                break
        self._rows, self._seconds = self._rows + len(rows), self._seconds + time.perf_counter() - start
        return self._result(message, rows, out)

    def _slow(self) -> bool:
        """Whether to split what comes: rows here took SLOW_ROW_S on average (a message's worth of them, at least)."""
        return self.split_slow and self._rows >= MAP_DEFAULT_ROWS_PER_MESSAGE and self._seconds >= SLOW_ROW_S * self._rows


class AsyncRowRunner(_Rows):
    """`RowRunner` for an async func: a message's rows awaited together on the consumer's loop.

    Each call is held to `time_limit` here (`TimeLimitExceededError`, then retried like any
    failure), so a message's rows fail one by one rather than all with their message.
    """

    async def __call__(self, rows: list[dict[str, Any]]) -> PackedResult | list[Any]:
        message = current_message()
        if self._split_due(message, rows) and await asyncio.to_thread(self._split, message, rows):
            return RowsResult([], self.func.take_built()).to_wire()
        try:
            func = self.func.get()
        except BuildError as e:
            return self._result(message, rows, e)
        return self._result(message, rows, list(await asyncio.gather(*(self._one(func, row) for row in rows))))

    async def _one(self, func: Callable[[dict[str, Any]], Any], row: dict[str, Any]) -> RowOutcome:
        """One row, awaited up to 1 + max_retries times, each call held to `time_limit`."""
        for attempt in range(self._attempts):
            try:
                value = await self.func.call(func, row, self.time_limit)
            except Exception as e:
                if attempt == self.max_retries:
                    return self._failed(e, row)
                continue
            return self._ok(value, row)
        raise AssertionError("no attempt was made")  # attempts_for(n) >= 1


def row_runner(
    func: Instances,
    max_retries: int,
    schema: pa.Schema,
    row_options: TaskOptions,
    time_limit: float | None,
    split_slow: bool,
) -> RowRunner | AsyncRowRunner:
    """The task of map's messages for `func`: an `AsyncRowRunner` if its calls are to be awaited, else a `RowRunner`.

    An async func's rows wait together: a slow one holds up no other, so they are never split for it.
    """
    if func.awaits:
        return AsyncRowRunner(func, max_retries, schema, row_options, time_limit)
    return RowRunner(func, max_retries, schema, row_options, split_slow=split_slow)


class _SplitLedger:
    """The rows of split messages one server's read-back gives: each once (see RowRunner).

    A message's own rows win if an earlier attempt's late ack stored them; else its split rows stand
    in for it, also when it ended as a dead letter (its rows that have no split row still come from
    it).
    """

    def __init__(self, dead_keys: Iterable[str]) -> None:
        self.split: dict[int, set[int]] = {}  # message id -> which of its rows were split off
        self.answered: set[int] = set()  # messages whose own result holds rows
        self.given: set[str] = set()  # the keys of the split rows given
        for key in dead_keys:
            self._note(key)

    def _note(self, key: str) -> tuple[int, int]:
        _, origin, j = key.split(":")
        self.split.setdefault(int(origin), set()).add(int(j))
        return int(origin), int(j)

    def take(self, key: str) -> bool:
        """Whether to give a split row (results and dead letters come in id order: its message first)."""
        origin, _ = self._note(key)
        if origin in self.answered or key in self.given:
            return False
        self.given.add(key)
        return True

    def left(self, msg_id: int, n: int) -> list[int]:
        """Which of a dead message's n rows no split row gives."""
        return [j for j in range(n) if j not in self.split.get(msg_id, ())]


def _misfits(rows: list[dict[str, Any]], schema: pa.Schema, fit: FitCheck | None = None) -> dict[int, str]:
    """The rows that do not convert to `schema`, by position, with why.

    Empty when `fit`, the schema's quick check, vouches for all; else one conversion when all do.
    """
    if fit is not None and fit.surely_fit(rows):
        return {}
    import pyarrow as pa

    def why(batch: list[dict[str, Any]]) -> str | None:
        try:
            pa.RecordBatch.from_pylist(batch, schema=schema)
            return None
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            return str(e)

    if why(rows) is None:
        return {}
    plain = schema.remove_metadata()
    return {
        k: f"the result {row!r:.200} does not fit the schema {plain}: {e}"
        for k, row in enumerate(rows)
        if (e := why([row])) is not None
    }


def output_schema(schema: str | StructType, entry: str) -> StructType:
    """The output columns a function's results fill (a DDL string or a StructType), checked not to clash with EXTRA_COLUMNS."""
    from pyspark.sql.types import DataType, StructField, StructType

    if isinstance(schema, StructType):
        st = schema
    else:  # parsed by the session's parser, without a DataFrame made for it (~2 ms against ~15-35 ms)
        parsed = DataType.fromDDL(schema)
        st = parsed if isinstance(parsed, StructType) else StructType([StructField("value", parsed)])
    clash = [f.name for f in st.fields if f.name in EXTRA_COLUMNS]
    if clash:
        raise ValueError(f"{entry}: schema columns {clash} clash with the columns {entry} adds ({', '.join(EXTRA_COLUMNS)})")
    return st


def input_json(row: dict[str, Any]) -> str:
    """An input row as the `_input` column holds it: JSON, of about INPUT_MAX_CHARS at most.

    Values JSON has no type for are their text, bytes their size; in a row over the bound, each
    value whose JSON is longer than its share of it is cut to a string of its start and length.
    """
    text = json.dumps(row, default=_plain)
    if len(text) <= INPUT_MAX_CHARS:
        return text
    share = max(INPUT_MAX_CHARS // max(len(row), 1), 32)
    return json.dumps({k: _cut(v, share) for k, v in row.items()}, default=_plain)


def _cut(value: Any, chars: int) -> Any:
    text = json.dumps(value, default=_plain)
    return value if len(text) <= chars else f"{text[:chars]}... ({len(text):,} characters)"


def _plain(value: Any) -> str:
    """A value JSON has no type for, as `_input` shows it."""
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value):,} bytes>"
    return str(value)


def with_extra(schema: StructType) -> StructType:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType(
        [
            *schema.fields,
            StructField("_id", LongType(), False),
            StructField("_error", StringType(), True),
            StructField("_input", StringType(), True),
        ]
    )


@dataclass(frozen=True, slots=True)
class DealRows:
    """`JobForm.parcels` of `map`: an Arrow batch's rows, up to `per_message` to a message, dealt like cards.

    A batch of n rows makes ceil(n / per_message) messages, message j taking rows j, j + m, j + 2m,
    ...: inputs often arrive clustered by cost (sorted by size, say), and costly neighbours in one
    message would make one long message that ends the run late.
    """

    per_message: int

    def __call__(self, batch: pa.RecordBatch) -> list[Parcel]:
        rows = batch.to_pylist()
        m = -(-len(rows) // self.per_message)
        return [Parcel((rows[j::m],), len(rows[j::m])) for j in range(m)]


@dataclass(frozen=True, slots=True)
class ReadRows:
    """`JobForm.read` of `map`: one server's output rows (`read_results`)."""

    schema: StructType  # the output columns, without those every row gets (EXTRA_COLUMNS)

    def __call__(self, server: ServerOutcomes) -> Generator[pa.RecordBatch, None, ReadCounts]:
        return (yield from read_results(server, self.schema))


def read_results(server: ServerOutcomes, schema: StructType) -> Generator[pa.RecordBatch, None, ReadCounts]:
    """The output rows of one server: one per input row, from its results and its dead letters.

    The rows of a split message come once (`_SplitLedger`).

    Returns how many rows it yielded, and how many of them failed; each stands for one input row
    (a message's result or dead letter gives a row per row it carried, a split one's rows coming
    from the messages split off it), so the inputs are the rows.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    names = [f.name for f in schema.fields]
    arrow = to_arrow_schema(with_extra(schema))
    rows: list[dict[str, Any]] = []
    counts = ReadCounts(0, 0, 0)
    built = 0  # instances of func's class the results say were built

    def counted(batch: pa.RecordBatch) -> pa.RecordBatch:
        nonlocal counts
        counts += ReadCounts(batch.num_rows, batch.num_rows, batch.num_rows - batch.column("_error").null_count)
        return batch

    ledger = _SplitLedger(k for d in server.dead_letters() if (k := _key(d.message)).startswith(SPLIT_PREFIX))
    for msg_id, data in server.results():
        result = RowsResult.from_wire(decode_result(data))
        built += result.built
        key = result.outcomes[0].key if result.outcomes else ""
        if key.startswith(SPLIT_PREFIX):  # a split row (see RowRunner)
            if not ledger.take(key):
                continue
        elif result.outcomes:
            ledger.answered.add(msg_id)
        for outcome in result.outcomes:
            row = dict.fromkeys(names)
            if outcome.ok:
                try:
                    row = _row(outcome.value, names)
                    row.update(_id=msg_id, _error=None, _input=None)
                except Exception as e:  # a value that is not a row: reported on its row, never dropped
                    row.update(_id=msg_id, _error=f"{type(e).__name__}: {e}", _input=None)
            else:
                row.update(_id=msg_id, _error=outcome.value, _input=outcome.input)
            rows.append(row)
        if len(rows) >= READ_BATCH_ROWS:
            yield counted(_batch(rows, arrow, names))
            rows = []
    for d in server.dead_letters():  # a whole message failed (its workers died, or it ran out of time): each row
        key = _key(d.message)
        if key.startswith(SPLIT_PREFIX) and not ledger.take(key):
            continue
        inputs = _input_rows(d.message.payload, d.message.headers)
        if not key.startswith(SPLIT_PREFIX):
            inputs = [inputs[j] for j in ledger.left(d.message.id, len(inputs))]
        for inp in inputs:
            row = dict.fromkeys(names)
            row.update(_id=d.message.id, _error=d.error, _input=inp)
            rows.append(row)
    if rows:
        yield counted(_batch(rows, arrow, names))
    return dataclasses.replace(counts, instances=built)


def _batch(rows: list[dict[str, Any]], arrow: pa.Schema, names: list[str]) -> pa.RecordBatch:
    """Rows as an Arrow batch; a row whose values do not fit the schema gets an error instead."""
    import pyarrow as pa

    try:
        return pa.RecordBatch.from_pylist(rows, schema=arrow)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    for k, why in _misfits(rows, arrow).items():
        rows[k] = {**dict.fromkeys(names), "_id": rows[k]["_id"], "_input": None, "_error": why}
    return pa.RecordBatch.from_pylist(rows, schema=arrow)


def _row(value: Any, names: list[str]) -> dict[str, Any]:
    if isinstance(value, dict):
        if value.keys() != set(names):
            unknown = [k for k in value if k not in names]
            missing = [n for n in names if n not in value]
            raise ConveyorError(
                f"map: func returned a dict that does not fit the columns {names}: "
                + "; ".join(
                    [*([f"unknown keys {unknown}"] if unknown else []), *([f"no value for {missing}"] if missing else [])]
                )
            )
        return {n: value[n] for n in names}
    if isinstance(value, (tuple, list)):
        if len(value) != len(names):
            raise ConveyorError(f"map: func returned {len(value)} values for the {len(names)} columns {names}")
        return dict(zip(names, value, strict=True))
    if len(names) == 1:
        return {names[0]: value}
    raise ConveyorError(f"map: func returned a {type(value).__name__}; return a dict or a tuple for the columns {names}")


def _key(message: Message) -> str:
    return message.headers.get(H_IDEMPOTENCY_KEY, "")


def _input_rows(payload: bytes, headers: dict[str, str]) -> list[str]:
    """The input rows of a message, as JSON."""
    return [input_json(row) for row in decode_call(payload, headers).args[0]]
