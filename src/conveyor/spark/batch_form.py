"""Batches through the queue for `conveyor.spark.map_batches`: its form of the queue job (`conveyor.spark.job`).

Each message carries up to `rows` consecutive input rows, of up to MAP_BATCHES_MAX_BYTES, as Arrow
IPC bytes (`SliceRows`); its task (`BatchRunner`) hands them to fn as one batch in the asked format
and returns the output rows, one per input row, as Arrow IPC bytes with `_error` and `_input`; the
read-back (`ReadBatches`) adds `_id` and turns dead letters into failed rows.

Where a failure lands (`BatchRunner`):
- fn raises on a batch: its rows run again, in the same attempt, in parts, so that only the rows
  at fault fail. Each row runs at most max_retries + 1 times per delivery, its runs in the batches
  it was part of counted: a failed batch of n rows whose rows have r runs left runs again in
  ceil(n ** (1 / r)) parts, so that a part that keeps failing is one row by its last run; a row
  that has no run left gets the error in `_error`. A row whose last run was in a batch with others
  runs once more, alone (with max_retries = 0 each row of a batch that raises: twice in all), so a
  bad row never fails its neighbours (n = 1,024, max_retries = 3, one bad row: 1 + 11 + 10 + 10 =
  32 calls, the bad row in 4 of them).
- fn returns a batch of another length, other columns, or values that do not convert to the
  schema's types (`BatchContractError`): fn broke its contract on the whole batch, and parts
  would break it as well: every row of the batch gets the error, naming the lengths, the columns
  or the types, with no split and no retry.
- a class given as fn fails to build (`BuildError`): every row of the batch gets its error, at
  once (the class is not built again in that process).
- a single input row over MAP_BATCHES_MAX_BYTES, or a batch whose output is over
  MAP_BATCHES_MAX_RESULT_BYTES (both well under a frame): its rows fail, saying so.
- the message fails whole (its time limit, which covers the whole batch, or its worker lost): the
  message is retried per `max_retries`, then each of its rows gets the dead letter's error.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Generator, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from conveyor.arrow_ipc import decode, encode, slices
from conveyor.constants import JOB_RESULT_BUILT, JOB_RESULT_ROWS, MAP_BATCHES_MAX_RESULT_BYTES
from conveyor.errors import ConveyorError
from conveyor.spark.form import Parcel, ServerOutcomes
from conveyor.spark.instances import BuildError, Instances, finish
from conveyor.spark.records import ReadCounts
from conveyor.spark.rows import input_json, job_result, with_extra
from conveyor.tasks.envelope import decode_call, decode_result, encode_error

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

BatchFormat = Literal["pandas", "pyarrow", "numpy"]
BATCH_FORMATS: tuple[BatchFormat, ...] = ("pandas", "pyarrow", "numpy")
ERROR, INPUT = "_error", "_input"  # the columns a task's result adds to fn's (the read-back adds `_id`)


class BatchContractError(ConveyorError):
    """fn's output breaks its contract on a whole batch (its length, columns or types): the batch's fault, not a row's."""


@dataclass(frozen=True, slots=True)
class SliceRows:
    """`JobForm.parcels` of `map_batches`: an Arrow batch cut into runs of consecutive rows, one a message.

    A run holds up to `rows` rows and `max_bytes` bytes (cut smaller to fit them). A single row
    over `max_bytes` goes alone as a refusal, which its task reports on that row (`BatchRunner`):
    it would not fit in a message with room for its result.
    """

    rows: int
    max_bytes: int

    def __call__(self, batch: pa.RecordBatch) -> list[Parcel]:
        import pyarrow as pa

        table = pa.Table.from_batches([batch])
        fits = table.nbytes <= self.max_bytes  # then so does each run of it, unmeasured (a run's measure costs ~0.15 ms)
        parcels: list[Parcel] = []
        for start in range(0, table.num_rows, self.rows):
            run = table.slice(start, self.rows)
            for piece in [run] if fits else slices(run, self.max_bytes):
                if piece.num_rows == 1 and piece.nbytes > self.max_bytes:
                    parcels.append(Parcel(self._refused(piece), 1))
                else:
                    parcels.append(Parcel((encode(piece),), piece.num_rows))
        return parcels

    def _refused(self, row: pa.Table) -> tuple[bytes, str, str]:
        """The arguments of a row's refusal: no rows, the error, the row as `_input` shows it."""
        error = (
            f"map_batches: this row is {row.nbytes:,} bytes as Arrow, over the {self.max_bytes:,} a batch message may "
            "carry with room for its result: pass large values by reference (a path or URL) and load them in fn"
        )
        return encode(row.slice(0, 0)), error, input_json(row.to_pylist()[0])


@dataclass(frozen=True, slots=True)
class BatchResult:
    """A `BatchRunner` call's result: its output rows, and the instances of fn's class it reports built."""

    output: bytes  # Arrow IPC: the schema's columns, `_error`, `_input`; one row per input row
    built: int  # since the last result said so (`Instances.take_built`)

    def to_wire(self) -> list[Any]:
        """As the task returns it, for msgpack (JOB_RESULT_*)."""
        return job_result(self.output, self.built)

    @classmethod
    def from_wire(cls, data: object) -> BatchResult:
        """A result the read-back decoded (`decode_result`)."""
        items = cast("list[Any]", data)
        return cls(cast(bytes, items[JOB_RESULT_ROWS]), int(items[JOB_RESULT_BUILT]))


class _Batches:
    """What both batch runners share: the call's result, the batch's runs and splits, the output's checks."""

    def __init__(
        self,
        fn: Instances,
        batch_format: BatchFormat,
        schema: pa.Schema,
        max_retries: int,
        max_result_bytes: int = MAP_BATCHES_MAX_RESULT_BYTES,
    ) -> None:
        import pyarrow as pa

        self.fn, self.format, self.schema, self.max_retries = fn, batch_format, schema, max_retries
        self.max_result_bytes = max_result_bytes
        self.result = pa.schema([*schema, pa.field(ERROR, pa.string()), pa.field(INPUT, pa.string())])

    async def _outcome(self, data: bytes, refused: str, given: str) -> list[Any]:
        """The call's result; over a plain fn it never waits (`finish`), over an async one fn is awaited."""
        import pyarrow as pa

        if refused:
            return BatchResult(encode(self._failed_rows(1, refused, [given])), self.fn.take_built()).to_wire()
        table = decode(data)
        try:
            fn = self.fn.get()
        except BuildError as e:
            out = self._failed(table, str(e))
        else:
            out = pa.concat_tables(await self._run(fn, table))
        encoded = encode(out)
        if len(encoded) > self.max_result_bytes:  # it would not fit in a frame: its rows fail, with what to do
            encoded = encode(
                self._failed(
                    table,
                    f"map_batches: the output of this batch of {table.num_rows:,} rows is {len(encoded):,} bytes as Arrow, "
                    f"over the {self.max_result_bytes:,} a result may hold: pass a smaller rows_per_batch",
                )
            )
        return BatchResult(encoded, self.fn.take_built()).to_wire()

    async def _run(self, fn: Callable[[Any], Any], table: pa.Table, runs: int | None = None) -> list[pa.Table]:
        """The output of `table`'s rows, each of which may run `runs` more times (max_retries + 1 at first).

        A run that raises spends one run of each of its rows. With `left` runs left, the rows run
        again in ceil(n ** (1 / left)) parts of equal size, so that a part that keeps raising is a
        single row by its last run (one part: a row alone runs again alone); with none left, a
        row alone fails with the error, and the rows of a larger part run once more, each alone
        (see the module docstring).
        """
        runs = self.max_retries + 1 if runs is None else runs
        try:
            out = await self.fn.call(fn, self._batch(table))
        except Exception as e:
            left, n = runs - 1, table.num_rows
            if n == 1 and left == 0:
                return [self._failed(table, encode_error(e))]
            left = max(left, 1)  # out of runs in a batch with others: each row once more, alone, never failed by a neighbour
            step = -(-n // math.ceil(n ** (1 / left)))
            return [piece for i in range(0, n, step) for piece in await self._run(fn, table.slice(i, step), left)]
        return [self._fitted(out, table)]

    def _fitted(self, out: object, table: pa.Table) -> pa.Table:
        """fn's output for `table`, or its rows failed with the contract it breaks (parts would break it as well)."""
        try:
            return self._output(out, table.num_rows)
        except BatchContractError as e:
            return self._failed(table, str(e))

    def _output(self, out: object, n: int) -> pa.Table:
        import pyarrow as pa

        nulls = pa.nulls(n, pa.string())
        return pa.Table.from_arrays([*self._fit(out, n).columns, nulls, nulls], schema=self.result)

    def _batch(self, table: pa.Table) -> Any:
        """The rows as fn gets them."""
        if self.format == "pandas":
            # on the consumer's own thread: each consumer has a core, and Arrow's pool handing a batch of
            # 1,024 rows x 64 columns to its threads and back took 0.64 ms on 2 busy cores, against 0.17 ms
            return table.to_pandas(use_threads=False)
        if self.format == "numpy":
            return {name: table.column(name).to_numpy() for name in table.column_names}
        return table

    def _fit(self, out: object, n: int) -> pa.Table:
        """fn's output as a table of `schema`; BatchContractError if it is not n rows of its columns."""
        import pyarrow as pa

        pd = sys.modules.get("pandas")  # a pandas DataFrame can only come from a pandas imported already
        names = self.schema.names
        if pd is not None and isinstance(out, pd.DataFrame):
            columns, lengths = [str(c) for c in out.columns], {"": len(out)}
        elif isinstance(out, (pa.Table, pa.RecordBatch)):
            columns, lengths = out.schema.names, {"": out.num_rows}
        elif isinstance(out, dict):
            columns = [str(c) for c in out]
            lengths = {str(k): _length(k, v) for k, v in out.items()}
        else:
            raise BatchContractError(
                f"map_batches: fn returned a {type(out).__name__}; return a pandas DataFrame, a pyarrow Table or "
                f"RecordBatch, or a dict of column name -> array, with the columns {names}"
            )
        if sorted(columns) != sorted(names):
            unknown = [c for c in columns if c not in names]
            missing = [c for c in names if c not in columns]
            raise BatchContractError(
                f"map_batches: fn returned the columns {columns}, not the schema's {names}: "
                + "; ".join([*([f"unknown {unknown}"] if unknown else []), *([f"no values for {missing}"] if missing else [])])
            )
        wrong = {k: v for k, v in lengths.items() if v != n}
        if wrong:
            said = ", ".join(f"{k!r}: {v:,}" for k, v in wrong.items()) if "" not in wrong else f"{wrong['']:,} rows"
            raise BatchContractError(
                f"map_batches: fn returned {said} for a batch of {n:,} rows: it must return one row per input row, in order"
            )
        try:
            if pd is not None and isinstance(out, pd.DataFrame):
                # the schema picks the columns, in its order, without a frame made of them (~0.25 ms a batch)
                return pa.Table.from_pandas(out, schema=self.schema, preserve_index=False)
            if isinstance(out, pa.RecordBatch):
                out = pa.Table.from_batches([out])
            if isinstance(out, pa.Table):
                return out.select(names).cast(self.schema)
            return pa.Table.from_pydict({k: cast("dict[str, Any]", out)[k] for k in names}, schema=self.schema)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:  # every row's values are of the wrong types
            fields = ", ".join(f"{f.name} {f.type}" for f in self.schema)
            raise BatchContractError(
                f"map_batches: fn's output does not convert to the schema ({fields}): {e}; return values of these types"
            ) from e

    def _failed(self, table: pa.Table, error: str) -> pa.Table:
        """`table`'s rows failed with `error`: null outputs, their input as JSON."""
        return self._failed_rows(table.num_rows, error, [input_json(r) for r in table.to_pylist()])

    def _failed_rows(self, n: int, error: str, inputs: list[str]) -> pa.Table:
        import pyarrow as pa

        return pa.Table.from_arrays(
            [*(pa.nulls(n, f.type) for f in self.schema), pa.array([error] * n, pa.string()), pa.array(inputs, pa.string())],
            schema=self.result,
        )


class BatchRunner(_Batches):
    """The task of one message: a plain fn over its batch, one output row per input row (see the module docstring).

    `schema` is the output columns (all nullable: a failed row's are null). Returns a
    `BatchResult` (as its `to_wire`). An output over `max_result_bytes` fails its rows
    instead, saying so; a row refused as too large (`SliceRows`) comes as no rows, the error and
    its `_input`.
    """

    def __call__(self, data: bytes, refused: str = "", given: str = "") -> list[Any]:
        return finish(self._outcome(data, refused, given))


class AsyncBatchRunner(_Batches):
    """`BatchRunner` for an async fn: the batch awaited on the consumer's loop (its parts, if it fails, in turn)."""

    async def __call__(self, data: bytes, refused: str = "", given: str = "") -> list[Any]:
        return await self._outcome(data, refused, given)


def batch_runner(fn: Instances, batch_format: BatchFormat, schema: pa.Schema, max_retries: int) -> BatchRunner | AsyncBatchRunner:
    """The task of map_batches' messages for `fn`: an `AsyncBatchRunner` if its calls are to be awaited."""
    return (AsyncBatchRunner if fn.awaits else BatchRunner)(fn, batch_format, schema, max_retries)


def _length(name: object, values: object) -> int:
    if not isinstance(values, Sized) or isinstance(values, (str, bytes)):
        raise BatchContractError(
            f"map_batches: fn returned a {type(values).__name__} for the column {name!r}: give each column an array of values"
        )
    return len(values)


@dataclass(frozen=True, slots=True)
class ReadBatches:
    """`JobForm.read` of `map_batches`: one server's output rows, each result's with its message's id as `_id`.

    A dead letter (a message that failed whole) gives each of its input rows with its error.
    """

    schema: StructType  # the output columns, without those every row gets (EXTRA_COLUMNS)

    def __call__(self, server: ServerOutcomes) -> Generator[pa.RecordBatch, None, ReadCounts]:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow = to_arrow_schema(with_extra(self.schema))
        names = [f.name for f in self.schema.fields]
        counts = ReadCounts(0, 0, 0)
        for msg_id, data in server.results():
            result = BatchResult.from_wire(decode_result(data))
            t = decode(result.output)
            out = [t.column(name) for name in names]
            batch = pa.Table.from_arrays([*out, _ids(msg_id, t.num_rows), t.column(ERROR), t.column(INPUT)], schema=arrow)
            counts += ReadCounts(t.num_rows, t.num_rows, t.num_rows - t.column(ERROR).null_count, result.built)
            yield from batch.to_batches()
        for d in server.dead_letters():
            args = decode_call(d.message.payload, d.message.headers).args
            inputs = [args[2]] if len(args) > 1 else [input_json(row) for row in decode(args[0]).to_pylist()]  # a refused row
            n = len(inputs)
            failed = [
                *(pa.nulls(n, f.type) for f in arrow if f.name in names),
                _ids(d.message.id, n),
                pa.array([d.error] * n, pa.string()),
                pa.array(inputs, pa.string()),
            ]
            counts += ReadCounts(n, n, n)
            yield from pa.Table.from_arrays(failed, schema=arrow).to_batches()
        return counts


def _ids(msg_id: int, n: int) -> pa.Array:
    import pyarrow as pa

    return pa.repeat(pa.scalar(msg_id, pa.int64()), n)
