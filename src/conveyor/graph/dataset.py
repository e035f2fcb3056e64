"""Dataset: the materialised output of a blocking node.

Its batches live in Spark as rows of `DATASET_DDL` (one Arrow IPC stream per row): a local
checkpoint in the executors' block stores (memory, spilling to disk), or written as Parquet under the
graph's checkpoint directory and read back. Either way the DataFrame's lineage is cut: a Dataset
holds neither its graph nor the plans that made it, so it stays readable after the graph is gone, and
a chain of graphs, each reading the Datasets of the one before (an iterative job), keeps a plan the
size of one graph. The price: a locally checkpointed partition lost with its executor cannot be
recomputed (reading it fails); a Dataset that must survive that needs a `checkpoint_dir`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ..arrow_ipc import decode
from .channels import decode_value
from .errors import GraphError

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


@dataclass(eq=False)
class Dataset:
    """The output of a blocking node: readable as Arrow, pandas, a Spark DataFrame, or batch by batch."""

    name: str
    n_channels: int
    _encoded: DataFrame | None = field(default=None, repr=False)
    path: str | None = None  # the Parquet directory, for a checkpointed Dataset
    _schema: pa.Schema | None = field(default=None, repr=False)
    _dropped: bool = field(default=False, repr=False)  # unpersist() freed the rows

    @property
    def materialized(self) -> bool:
        return self._encoded is not None

    def _attach(self, encoded: DataFrame, path: str | None) -> None:
        self._encoded, self.path = encoded, path

    @property
    def encoded(self) -> DataFrame:
        """The rows of `DATASET_DDL` that hold the batches."""
        if self._encoded is None:
            raise GraphError(self.unreadable_reason())
        return self._encoded

    def unreadable_reason(self) -> str:
        """Why there are no rows to read (for a Dataset that is not `materialized`)."""
        if self._dropped:
            return f"Dataset {self.name!r} was unpersisted: its batches are gone"
        return f"Dataset {self.name!r} is not materialised yet: run its graph first"

    def values(self) -> list[tuple[int, Any]]:
        """Every batch with its channel, in (channel, order of output) order, as the executors emitted it.

        Tables come back as pyarrow Tables; what an executor of `batch_format = "object"` emitted
        (a pandas DataFrame with its index, a number) comes back as it was.
        """
        rows = self.encoded.toArrow()
        if rows.num_rows == 0:
            return []
        rows = rows.take(pc.sort_indices(rows, [("channel", "ascending"), ("seq", "ascending")]))
        channels, batches = rows.column("channel").to_pylist(), rows.column("batch")
        return [(channels[i], decode_value(batches[i].as_buffer())) for i in range(rows.num_rows)]

    def to_arrow(self) -> pa.Table:
        """Every batch, in (channel, order of output) order, as one table (types unified)."""
        tables = [value for _, value in self.values()]
        if not tables:
            return pa.table({})
        others = sorted({type(t).__name__ for t in tables if not isinstance(t, pa.Table)})
        if others:
            raise GraphError(
                f"Dataset {self.name!r} holds batches that are not tables ({', '.join(others)}): read them with values()"
            )
        return pa.concat_tables(tables, promote_options="permissive")

    def to_pandas(self) -> pd.DataFrame:
        return self.to_arrow().to_pandas()

    def __iter__(self) -> Iterator[Any]:
        """The batches one by one, a partition at a time (never all on the driver at once), as `values()` gives them."""
        for row in self.encoded.toLocalIterator():
            yield decode_value(row["batch"])

    @property
    def schema(self) -> pa.Schema:
        """The unified schema of the batches (one small Spark job, remembered)."""
        if self._schema is None:
            serialized = self.encoded.mapInArrow(_schemas, "schema BINARY").toArrow().column("schema").to_pylist()
            schemas = list({s: pa.ipc.read_schema(pa.py_buffer(s)) for s in serialized}.values())
            self._schema = pa.unify_schemas(schemas, promote_options="permissive") if schemas else pa.schema([])
        return self._schema

    def to_spark(self) -> DataFrame:
        """The rows as a typed Spark DataFrame (decoded in the executors, lazily)."""
        from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

        spark_schema: StructType = from_arrow_schema(self.schema)
        target = to_arrow_schema(spark_schema)

        def to_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for rb in batches:
                column = rb.column(rb.schema.get_field_index("batch"))
                for i in range(rb.num_rows):
                    yield from _conform(decode(column[i].as_buffer()), target).to_batches()

        return self.encoded.mapInArrow(to_rows, spark_schema)

    def unpersist(self) -> None:
        """Free the stored batches; the Dataset cannot be read afterwards (nothing recomputes them).

        A Dataset written under `checkpoint_dir` keeps its Parquet files and stays readable.
        """
        if self._encoded is not None and self.path is None:
            _drop_local_checkpoint(self._encoded)
            self._encoded, self._dropped = None, True


def _drop_local_checkpoint(df: DataFrame) -> None:
    """Free the blocks of a locally checkpointed DataFrame.

    `DataFrame.unpersist()` does not: the rows are not in Spark's cache manager but are the blocks of
    the RDD under the plan's `LogicalRDD`, which classic PySpark reaches through the JVM. Spark Connect
    has no such handle; there the server releases the checkpoint once the client drops the DataFrame
    (its cached relation is removed when garbage-collected, then Spark's ContextCleaner frees the RDD).
    """
    jdf = getattr(df, "_jdf", None)  # None under Spark Connect
    if jdf is None:
        return
    plan = jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)


def _schemas(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The distinct serialised schemas of the batches of a partition."""
    seen: dict[bytes, None] = {}
    for rb in batches:
        column = rb.column(rb.schema.get_field_index("batch"))
        for i in range(rb.num_rows):
            seen[pa.ipc.open_stream(column[i].as_buffer()).schema.serialize().to_pybytes()] = None
    yield pa.RecordBatch.from_arrays([pa.array(list(seen), pa.binary())], names=["schema"])


def _conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    """`table` with exactly the columns and types of `target` (absent columns are null)."""
    columns = []
    for f in target:
        if f.name in table.column_names:
            columns.append(table.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=target)
