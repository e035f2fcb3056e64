"""conveyor.spark.map_batches: batches of rows through the queue, fn a function or a model class (local[2]).

`conveyor.spark.map_batches` is `conveyor.spark.batches`; its form `conveyor.spark.batch_form`, the
classes built where they run `conveyor.spark.instances`. Real local Spark and real queue servers.
"""

from __future__ import annotations

import collections
import json
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession

import conveyor.spark as cs
from conveyor.arrow_ipc import decode, encode
from conveyor.client.pool import QueuePool
from conveyor.constants import INPUT_MAX_CHARS
from conveyor.spark.batch_form import BatchResult, BatchRunner, SliceRows
from conveyor.spark.instances import check_fn
from conveyor.spark.job import MapStats
from conveyor.spark.rows import input_json
from conveyor.worker.middleware import Retries

from ..support.docs import run_example, section_code

N = 1000
SCHEMA = "id long, y double, label string"


@pytest.fixture(scope="module")
def pool() -> Iterator[QueuePool]:
    with QueuePool.local(n_servers=2) as p:
        yield p


@pytest.fixture(scope="module")
def df(spark: SparkSession) -> DataFrame:
    return spark.range(N, numPartitions=2).selectExpr("id", "CAST(id AS DOUBLE) / 2 AS x")


def expected(frame: pd.DataFrame, scale: float = 2.0) -> pd.DataFrame:
    """What every fn here computes, by plain pandas."""
    return pd.DataFrame({"id": frame["id"], "y": frame["x"] * scale + 1, "label": "n" + frame["id"].astype(str)})


def by_pandas(batch: pd.DataFrame) -> pd.DataFrame:
    return expected(batch)


def by_pyarrow(batch: pa.Table) -> pa.Table:
    ids = batch.column("id").to_numpy()
    return pa.table({"label": [f"n{i}" for i in ids], "id": ids, "y": batch.column("x").to_numpy() * 2 + 1})


def by_numpy(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    return {"id": batch["id"], "y": batch["x"] * 2 + 1, "label": np.array([f"n{i}" for i in batch["id"]])}


FORMATS = {"pandas": by_pandas, "pyarrow": by_pyarrow, "numpy": by_numpy}


def run(df: DataFrame, fn: Any, servers: QueuePool, **kwargs: Any) -> tuple[pd.DataFrame, MapStats]:
    kwargs = {"schema": SCHEMA, "rows_per_batch": 128, "progress": False, **kwargs}
    out, stats = cs.map_batches(df, fn, queue_pool=servers, stats=True, **kwargs)
    rows = out.toPandas()
    out.unpersist()
    assert servers.drop(stats.queue)
    return rows, stats


def computed(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows that did not fail, in id order, as `expected` gives them."""
    ok = rows[rows["_error"].isna()].sort_values("id").reset_index(drop=True)
    return ok[["id", "y", "label"]]


@pytest.mark.parametrize("batch_format", list(FORMATS))
def test_each_batch_format_gives_what_plain_pandas_gives(
    spark: SparkSession, df: DataFrame, pool: QueuePool, batch_format: str
) -> None:
    rows, stats = run(df, FORMATS[batch_format], pool, batch_format=batch_format)
    want = expected(df.toPandas().sort_values("id").reset_index(drop=True))
    pd.testing.assert_frame_equal(computed(rows), want, check_dtype=False)
    assert (stats.rows, stats.failed, stats.instances) == (N, 0, 0) and rows["_input"].isna().all()
    sizes = rows.groupby("_id").size()  # each message a run of up to 128 consecutive rows
    assert sizes.max() <= 128 and len(sizes) >= N // 128
    assert all(g["id"].max() - g["id"].min() == len(g) - 1 for _, g in rows.groupby("_id"))
    assert list(rows.columns) == ["id", "y", "label", "_id", "_error", "_input"]


BAD_ID = 417


class FailsOnOneRow:
    """fn raising on any batch holding BAD_ID, counting its calls on that row."""

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        if (batch["id"] == BAD_ID).any():
            raise ValueError(f"row {BAD_ID} is bad")
        return expected(batch)


def test_a_bad_row_fails_alone_and_its_neighbours_are_computed(df: DataFrame, pool: QueuePool) -> None:
    rows, stats = run(df, FailsOnOneRow, pool, max_retries=1)
    [bad] = rows[rows["_error"].notna()].to_dict("records")
    assert "ValueError: row 417 is bad" in bad["_error"] and json.loads(bad["_input"]) == {"id": BAD_ID, "x": BAD_ID / 2}
    assert bad["id"] is None or pd.isna(bad["id"])
    want = expected(df.toPandas().sort_values("id").reset_index(drop=True))
    pd.testing.assert_frame_equal(computed(rows), want[want["id"] != BAD_ID].reset_index(drop=True), check_dtype=False)
    assert (stats.rows, stats.failed) == (N, 1) and len(rows) == N
    assert rows.loc[rows["id"] == BAD_ID + 1, "_id"].item() == bad["_id"]  # its neighbour came from the same message


def short_by_one(batch: pd.DataFrame) -> pd.DataFrame:
    return expected(batch).iloc[:-1]


def other_columns(batch: pd.DataFrame) -> pd.DataFrame:
    return expected(batch).rename(columns={"y": "z"})


def not_a_batch(batch: pd.DataFrame) -> list[int]:
    return list(batch["id"])


def words_for_numbers(batch: pd.DataFrame) -> pd.DataFrame:
    return expected(batch).assign(y="many")


CONTRACT_ERRORS = {
    "length": (short_by_one, r"fn returned 127 rows for a batch of 128 rows: it must return one row per input row"),
    "columns": (
        other_columns,
        r"fn returned the columns \['id', 'z', 'label'\], not the schema's \['id', 'y', 'label'\]: "
        r"unknown \['z'\]; no values for \['y'\]",
    ),
    "type": (not_a_batch, r"fn returned a list; return a pandas DataFrame"),
    "values": (words_for_numbers, r"fn's output does not convert to the schema \(id int64, y double, label string\)"),
}


@pytest.mark.parametrize("broken", list(CONTRACT_ERRORS))
def test_an_output_that_breaks_the_contract_fails_its_batch_with_a_clear_error(
    spark: SparkSession, pool: QueuePool, broken: str
) -> None:
    fn, error = CONTRACT_ERRORS[broken]
    rows, stats = run(spark.range(128, numPartitions=1).selectExpr("id", "CAST(id AS DOUBLE) / 2 AS x"), fn, pool)
    assert stats.failed == 128 and rows["_error"].str.contains(error).all(), rows["_error"][0]
    assert rows["id"].isna().all() and rows["_input"].map(lambda s: json.loads(s)["id"]).sort_values().tolist() == list(
        range(128)
    )


class Model:
    """A model class: built with a side file (each build writes its pid there) and a scale; predicts y."""

    def __init__(self, side_file: str, *, scale: float) -> None:
        self.scale = scale
        with open(side_file, "a") as f:
            f.write(f"{os.getpid()}\n")

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        return expected(batch, self.scale)


class ThreadModel(Model):
    per_thread = True


def pids(side_file: Path) -> list[int]:
    return [int(line) for line in side_file.read_text().split()]


@pytest.mark.parametrize(
    ("model", "pool_kind"),
    [(Model, "thread"), (ThreadModel, "thread"), (Model, "process")],
    ids=["shared", "per-thread", "process"],
)
def test_a_model_class_is_built_once_per_process_with_its_arguments(
    df: DataFrame, pool: QueuePool, tmp_path: Path, model: type[Model], pool_kind: str
) -> None:
    """Shared: once per consumer process (2 consumers); per thread: once per thread; in process mode: once per task process."""
    side = tmp_path / "built"
    rows, stats = run(df, model, pool, fn_args=(str(side),), fn_kwargs={"scale": 3.0}, pool=pool_kind, n_consumers=2)
    want = expected(df.toPandas().sort_values("id").reset_index(drop=True), scale=3.0)
    pd.testing.assert_frame_equal(computed(rows), want, check_dtype=False)
    built = pids(side)
    assert stats.instances == len(built) >= 1 and stats.failed == 0
    if model.__dict__.get("per_thread"):
        assert len(set(built)) <= 2  # each consumer's threads are in its one process
    else:
        assert len(set(built)) == len(built)  # never twice in a process
    if pool_kind == "thread" and model is Model:
        assert len(built) <= 2


class NotedModel:
    """A model noting each build and each release in its side file: what, its process, which instance, its scale."""

    def __init__(self, side_file: str, *, scale: float) -> None:
        self.side_file, self.scale, self.name = side_file, scale, uuid.uuid4().hex
        self._note("built")

    def _note(self, what: str) -> None:
        with open(self.side_file, "a") as f:
            f.write(f"{what} {os.getpid()} {self.name} {self.scale}\n")

    def __del__(self) -> None:
        self._note("freed")

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        return expected(batch, self.scale)


def alive(side_file: Path) -> collections.Counter[str]:
    """The instances built and not released yet, by scale."""
    notes = [line.split() for line in side_file.read_text().splitlines()]
    freed = {name for what, _, name, _ in notes if what == "freed"}
    return collections.Counter(scale for what, _, name, scale in notes if what == "built" and name not in freed)


def test_a_jobs_instances_are_released_as_its_consumers_end(df: DataFrame, pool: QueuePool, tmp_path: Path) -> None:
    """Two jobs in one session (Spark reuses its Python workers): neither leaves a model behind in them."""
    side = tmp_path / "lives"
    for scale in (2.0, 3.0):
        rows, stats = run(df, NotedModel, pool, fn_args=(str(side),), fn_kwargs={"scale": scale}, n_consumers=2)
        assert stats.failed == 0 and stats.instances >= 1
        pd.testing.assert_frame_equal(
            computed(rows), expected(df.toPandas().sort_values("id").reset_index(drop=True), scale), check_dtype=False
        )
        assert alive(side) == {}, side.read_text()  # released before the job returned: none outlives it
    assert side.read_text().count("built") >= 2


class BrokenModel:
    def __init__(self) -> None:
        raise OSError("no such model file: model.bin")

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        raise AssertionError("never built")


def test_a_class_that_fails_to_build_fails_every_row_with_its_error(df: DataFrame, pool: QueuePool) -> None:
    rows, stats = run(df, BrokenModel, pool)
    assert stats.failed == N and stats.instances == 0
    assert rows["_error"].str.contains(r"BrokenModel\(\*fn_args, \*\*fn_kwargs\) raised as it was built").all()
    assert rows["_error"].str.contains("OSError: no such model file: model.bin").all()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"fn_args": (1,)}, r"map_batches: fn_args and fn_kwargs are the constructor's arguments of a class"),
        ({"batch_size": 64}, r"map_batches: the rows fn gets at once are rows_per_batch=; batch_size= is the consumers'"),
        ({"batch_format": "polars"}, r"map_batches: batch_format must be one of pandas, pyarrow, numpy, got 'polars'"),
        ({"rows_per_batch": 0}, r"map_batches: rows_per_batch must be an integer >= 1, got 0"),
        ({"middleware": [Retries()]}, r"map_batches: middleware is not for map_batches"),
        ({"schema": "_id long"}, r"map_batches: schema columns \['_id'\] clash with the columns map_batches adds"),
        ({"max_retries": -1}, r"map_batches: max_retries must be an int"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(df: DataFrame, kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises((TypeError, ValueError), match=error):
        cs.map_batches(df, by_pandas, **{"schema": SCHEMA, **kwargs})


def test_a_function_that_is_not_callable_is_refused(df: DataFrame) -> None:
    with pytest.raises(TypeError, match=r"map_batches: fn must be callable: a function or a class"):
        cs.map_batches(df, 42, schema=SCHEMA)


def generator_fn(batch: Any) -> Iterator[Any]:
    yield batch


async def async_generator_fn(batch: Any) -> AsyncIterator[Any]:
    yield batch


class GeneratorModel:
    def __call__(self, batch: Any) -> Iterator[Any]:
        yield batch


UNRUN = {
    "generator": (generator_fn, r"is a generator function \('generator_fn'\): {entry} takes what a call returns, so return"),
    "async generator": (async_generator_fn, r"is a generator function \('async_generator_fn'\)"),
    "generator __call__": (GeneratorModel, r"is the __call__ of a generator function \('GeneratorModel'\)"),
}


@pytest.mark.parametrize("entry", ["map", "map_batches"])
@pytest.mark.parametrize("kind", list(UNRUN))
def test_a_generator_function_is_refused_before_any_work(df: DataFrame, pool: QueuePool, entry: str, kind: str) -> None:
    fn, error = UNRUN[kind]
    before = set(pool.stats())
    with pytest.raises(TypeError, match=f"{entry}: {'func' if entry == 'map' else 'fn'} " + error.format(entry=entry)):
        getattr(cs, entry)(df, fn, schema=SCHEMA, queue_pool=pool)
    assert set(pool.stats()) == before  # no queue declared


class RowModel:
    """A model class for map: built once per consumer process (its pid to the side file), called per row."""

    def __init__(self, side_file: str, *, scale: float) -> None:
        self.scale = scale
        with open(side_file, "a") as f:
            f.write(f"{os.getpid()}\n")

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"id": row["id"], "y": row["x"] * self.scale + 1, "label": f"n{row['id']}"}


def test_map_takes_a_model_class_too(df: DataFrame, pool: QueuePool, tmp_path: Path) -> None:
    side = tmp_path / "built"
    out, stats = cs.map(
        df, RowModel, schema=SCHEMA, fn_args=(str(side),), fn_kwargs={"scale": 3.0}, queue_pool=pool, progress=False, stats=True
    )
    rows = out.toPandas()
    out.unpersist()
    assert pool.drop(stats.queue)
    want = expected(df.toPandas().sort_values("id").reset_index(drop=True), scale=3.0)
    pd.testing.assert_frame_equal(computed(rows), want, check_dtype=False)
    built = pids(side)
    assert stats.instances == len(built) == len(set(built)) and 1 <= len(built) <= 2


class Counted:
    """fn for a BatchRunner run here: `answer` of each batch, each call noted as the ids of its rows."""

    def __init__(self, answer: Callable[[pa.Table], Any]) -> None:
        self.answer, self.calls = answer, list[list[int]]()

    def __call__(self, batch: pa.Table) -> Any:
        self.calls.append(batch.column("id").to_pylist())
        return self.answer(batch)

    def runs(self) -> collections.Counter[int]:
        """How many calls each row was in."""
        return collections.Counter(i for call in self.calls for i in call)


def run_here(fn: Counted, rows: int, max_retries: int = 3) -> pa.Table:
    """A BatchRunner's output for one message of `rows` rows (ids 0..rows-1), run in this process."""
    schema = pa.schema([pa.field("y", pa.float64())])
    runner = BatchRunner(check_fn("map_batches", "fn", fn, (), None, "a batch"), "pyarrow", schema, max_retries)
    return decode(BatchResult.from_wire(runner(encode(pa.table({"id": list(range(rows))})))).output)


def test_an_output_of_the_wrong_types_fails_its_batch_in_one_call() -> None:
    """Values that do not convert to the schema are the batch's fault: no split, no retry, every row told why."""
    fn = Counted(lambda batch: {"y": ["a"] * batch.num_rows})
    out = run_here(fn, 64)
    assert [len(c) for c in fn.calls] == [64]
    assert out.column("_error").null_count == 0 and out.column("y").null_count == 64
    assert all("fn's output does not convert to the schema (y double)" in e for e in out.column("_error").to_pylist())


def doubled_unless(bad: set[int]) -> Callable[[pa.Table], Any]:
    def answer(batch: pa.Table) -> Any:
        ids = batch.column("id").to_pylist()
        if bad.intersection(ids):
            raise ValueError(f"rows {sorted(bad.intersection(ids))} are bad")
        return {"y": [2.0 * i for i in ids]}

    return answer


@pytest.mark.parametrize(("rows", "max_retries"), [(1024, 3), (1000, 1), (64, 5), (2, 3)])
def test_a_bad_row_runs_at_most_max_retries_plus_one_times_and_alone_fails_alone(rows: int, max_retries: int) -> None:
    """Splitting spends the rows' runs: no row runs more than max_retries + 1 times, and only the bad row fails."""
    fn = Counted(doubled_unless({rows // 3}))
    out = run_here(fn, rows, max_retries)
    runs = fn.runs()
    assert runs[rows // 3] == max_retries + 1 and max(runs.values()) <= max_retries + 1
    errors = out.column("_error").to_pylist()
    assert [i for i, e in enumerate(errors) if e is not None] == [rows // 3]
    assert f"ValueError: rows [{rows // 3}] are bad" in errors[rows // 3]
    assert out.column("y").to_pylist() == [None if i == rows // 3 else 2.0 * i for i in range(rows)]
    if (rows, max_retries) == (1024, 3):
        assert len(fn.calls) == 32  # 1 + 11 parts + 10 parts + 10 single rows, as docs/spark.md says


def test_a_batch_that_always_raises_runs_each_row_at_most_max_retries_plus_one_times() -> None:
    """A batch-wide error (a GPU out of memory, say) costs each row its runs, not a run per halving."""
    fn = Counted(doubled_unless(set(range(256))))
    out = run_here(fn, 256, 2)
    assert set(fn.runs().values()) == {3} and out.column("_error").null_count == 0
    assert len(fn.calls) == 1 + 16 + 256  # the whole, ceil(256 ** (1 / 2)) parts, then each row alone


def test_with_no_retries_a_bad_row_still_fails_alone() -> None:
    """max_retries=0: the rows of a batch that raises run once more, each alone, and only the bad one fails."""
    fn = Counted(doubled_unless({5}))
    out = run_here(fn, 64, 0)
    assert len(fn.calls) == 1 + 64 and max(fn.runs().values()) == 2
    assert [i for i, e in enumerate(out.column("_error").to_pylist()) if e is not None] == [5]


def test_wide_rows_are_cut_by_bytes_and_a_row_too_large_fails_alone_saying_so() -> None:
    """Runs of rows under the byte bound (a single row over it refused on its own), each row's outcome once."""
    blobs = [b"x" * (100_000 if i == 33 else 10_000) for i in range(100)]
    batch = pa.RecordBatch.from_pydict({"id": list(range(100)), "blob": blobs})
    parcels = SliceRows(rows=100, max_bytes=64_000)(batch)
    assert sum(p.rows for p in parcels) == 100 and len(parcels) > 2
    [refusal] = [p for p in parcels if len(p.args) > 1]
    assert refusal.rows == 1 and all(len(p.args[0]) < 64_000 for p in parcels)
    fn = Counted(lambda batch: {"y": [float(len(b)) for b in batch.column("blob").to_pylist()]})
    runner = BatchRunner(
        check_fn("map_batches", "fn", fn, (), None, "a batch"), "pyarrow", pa.schema([pa.field("y", pa.float64())]), 3
    )
    out = pa.concat_tables(decode(BatchResult.from_wire(runner(*p.args)).output) for p in parcels)
    assert out.column("y").to_pylist() == [None if i == 33 else 10_000.0 for i in range(100)]
    error, given = out.column("_error")[33].as_py(), out.column("_input")[33].as_py()
    assert "map_batches: this row is 100," in error and "over the 64,000 a batch message may carry" in error
    assert json.loads(given) == {"id": 33, "blob": "<100,000 bytes>"}
    assert 33 not in fn.runs()


def test_an_output_too_large_for_a_result_fails_its_rows_saying_what_to_do() -> None:
    schema = pa.schema([pa.field("y", pa.string())])
    fn = Counted(lambda batch: {"y": ["y" * 10_000] * batch.num_rows})
    runner = BatchRunner(check_fn("map_batches", "fn", fn, (), None, "a batch"), "pyarrow", schema, 3, max_result_bytes=50_000)
    out = decode(BatchResult.from_wire(runner(encode(pa.table({"id": list(range(10))})))).output)
    assert out.column("_error").null_count == 0 and len(fn.calls) == 1
    assert "the output of this batch of 10 rows is 100," in out.column("_error")[0].as_py()
    assert "over the 50,000 a result may hold: pass a smaller rows_per_batch" in out.column("_error")[0].as_py()
    assert json.loads(out.column("_input")[3].as_py()) == {"id": 3}


def test_a_failed_rows_input_is_bounded_and_still_json() -> None:
    row = {"id": 7, "text": "word " * 100_000, "blob": b"\0" * 5_000, "tags": list(range(10_000))}
    shown = input_json(row)
    assert len(shown) <= INPUT_MAX_CHARS + 200
    back = json.loads(shown)
    assert back["id"] == 7 and back["blob"] == "<5,000 bytes>"
    assert back["text"].startswith('"word word') and back["text"].endswith("(500,002 characters)")
    assert back["tags"].startswith("[0, 1, 2")


@pytest.fixture
def wide(spark: SparkSession) -> DataFrame:
    """70 rows of 1 MiB (a 70 MiB batch: over a 64 MiB frame whole) and one of 17 MiB (over MAP_BATCHES_MAX_BYTES)."""
    return spark.range(71, numPartitions=1).selectExpr("id", "CAST(repeat('x', IF(id = 7, 17, 1) * 1048576) AS BINARY) AS blob")


def test_map_batches_takes_rows_wider_than_a_message_in_batches_of_fewer_rows(wide: DataFrame, pool: QueuePool) -> None:
    def sizes(batch: pa.Table) -> pa.Table:
        return pa.table({"id": batch.column("id"), "n": pc.binary_length(batch.column("blob")).cast(pa.int64())})

    rows, stats = run(wide, sizes, pool, schema="id long, n long", rows_per_batch=71, batch_format="pyarrow")
    assert (stats.rows, stats.failed) == (71, 1)
    ok = rows[rows["_error"].isna()]
    assert sorted(ok["id"]) == [i for i in range(71) if i != 7] and (ok["n"] == 1048576).all()
    assert ok["_id"].nunique() >= 5  # 70 MiB in messages of 16 MiB at most
    [bad] = rows[rows["_error"].notna()].to_dict("records")
    assert "this row is 17,825," in bad["_error"] and "pass large values by reference" in bad["_error"]
    assert json.loads(bad["_input"]) == {"id": 7, "blob": "<17,825,792 bytes>"}


def test_the_example_in_the_docs_runs_as_written(tmp_path: Path) -> None:
    """docs/spark.md's map_batches example, run as a user's script: its own embedded Spark and servers."""
    done = run_example(section_code("spark.md", "## `conveyor.spark.map_batches("), tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.fullmatch(r"10,000 rows, [12] instance\(s\) of Scaler built", done.stdout.strip()), (
        done.stdout
    )  # one per consumer at most


def test_the_batch_inference_page_example_runs_as_written(tmp_path: Path) -> None:
    """docs/batch-inference.md's example, run as a user's script: its own embedded Spark and servers."""
    done = run_example(section_code("batch-inference.md", "## A model class"), tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.fullmatch(r"50,000 rows, [12] model\(s\) loaded, 0 failed", done.stdout.strip()), done.stdout
