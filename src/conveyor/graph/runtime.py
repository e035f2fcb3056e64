"""Running a planned TaskGraph on Spark: one DataFrame per node, one Spark job per blocking node.

An input node becomes `spark.range(splits).mapInArrow(read)` (local files), or Spark's reader
followed by `mapInArrow` (other file systems), or the Dataset's rows followed by `mapInArrow`, or
`spark.range(channels).mapInArrow(read)` (a `SourceReader`: one task per channel).
A task node's input is the union of its incoming edges, `repartitionById(channels, "channel")`
(channel c is Spark partition c) and `sortWithinPartitions(channel, level, seq, edge)`; a
`mapInArrow` then runs the executors. A node chained into its consumer (`plan`) has no DataFrame:
its edges are read in its consumer's task, which runs it too. Everything is DataFrame API, so it also runs on Spark
Connect (where only the batches-read figures, which need accumulators, are missing).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .channels import Router
from .errors import GraphError, unwrap_task_error
from .filesystems import file_system
from .layout import ARROW_BATCH_BYTES, DATASET_DDL, ROUTE_DDL
from .nodes import InputSpec, NodeKind, Spec, TaskSpec
from .plan import Edge, Plan
from .readers import (
    CsvReader,
    ParquetReader,
    SourceReader,
    csv_format,
    csv_splits,
    list_files,
    parquet_filter,
    parquet_reader,
    read_sample,
)
from .stages import Chained, InputTask, NodeTask, OutEdge

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class RunStats:
    """Figures of one run: wall time, and batches read per input node (None without accumulators)."""

    seconds: float = 0.0
    batches_read: dict[str, int | None] = field(default_factory=dict)
    fused_inputs: list[str] = field(default_factory=list)
    chained_nodes: list[str] = field(default_factory=list)  # task nodes run inside their consumer's task


class Runner:
    """Builds the DataFrames of a planned graph and materialises its blocking nodes."""

    def __init__(
        self, specs: Mapping[int, Spec], plan: Plan, spark: SparkSession, name: str, checkpoint_dir: str | None, file_reader: str
    ) -> None:
        self.specs, self.plan, self.spark = specs, plan, spark
        self.name, self.checkpoint_dir, self.file_reader = name, checkpoint_dir, file_reader
        self.outputs: dict[int, DataFrame] = {}
        self.persisted: list[DataFrame] = []
        self.counters: dict[int, Any] = {}

    def run(self) -> RunStats:
        start = time.perf_counter()
        self._make_counters()
        # a session-wide setting: it applies to this run's jobs and is put back afterwards
        conf_key = "spark.sql.execution.arrow.maxBytesPerBatch"
        previous = self.spark.conf.get(conf_key, None)
        limit = min(int(previous), ARROW_BATCH_BYTES) if previous and previous.isdigit() else ARROW_BATCH_BYTES
        self.spark.conf.set(conf_key, str(limit))
        try:
            for nid in self.plan.order:
                spec = self.specs[nid]
                if isinstance(spec, TaskSpec) and spec.blocking:
                    self._materialize(spec)
        except GraphError:
            raise
        except Exception as exc:
            error = unwrap_task_error(exc)
            if error is None:
                raise
            raise error from None
        finally:
            if previous is None:
                self.spark.conf.unset(conf_key)
            else:
                self.spark.conf.set(conf_key, previous)
            for df in self.persisted:
                df.unpersist()
        inputs = [s for s in self.specs.values() if isinstance(s, InputSpec)]
        return RunStats(
            seconds=time.perf_counter() - start,
            batches_read={s.node.name: (self.counters[s.node.id].value if s.node.id in self.counters else None) for s in inputs},
            fused_inputs=[self.specs[n].node.name for n in sorted(self.plan.fused)],
            chained_nodes=[self.specs[n].node.name for n in sorted(self.plan.chained)],
        )

    def _make_counters(self) -> None:
        try:
            sc = self.spark.sparkContext
        except Exception:  # Spark Connect has no SparkContext, hence no accumulators
            return
        for nid in self._input_ids():
            self.counters[nid] = sc.accumulator(0)

    def _input_ids(self) -> set[int]:
        return {nid for nid, s in self.specs.items() if isinstance(s, InputSpec)}

    # --- blocking nodes --------------------------------------------------------------------------
    def _materialize(self, spec: TaskSpec) -> None:
        from pyspark import StorageLevel

        df = self._task_df(spec)
        assert spec.output is not None
        if spec.sink:  # run for its executors' effects; nothing keeps the rows
            df.write.format("noop").mode("overwrite").save()
            return
        if self.checkpoint_dir is not None:
            path = os.path.join(self.checkpoint_dir, f"{self.name}-{uuid.uuid4().hex[:8]}", spec.node.name)
            df.write.parquet(path)
            spec.output._attach(self.spark.read.parquet(path), path)
            return
        # A local checkpoint rather than persist(): the Dataset must not carry this graph's plan, which
        # holds the plans of every earlier graph whose Datasets it read. A graph chain (an iterative
        # job) otherwise plans and describes a tree that multiplies with every stage (a Dataset read
        # by two edges appears twice, each cached relation prints its whole cached plan) until the
        # driver runs out of heap. Eager: errors surface in run(), and later reads use the stored rows.
        df = df.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)
        spec.output._attach(df, None)

    # --- DataFrames --------------------------------------------------------------------------------
    def _out_edges(self, nid: int) -> list[OutEdge]:
        return [_out_edge(e) for e in self.plan.outputs_of(nid)]

    def _output(self, nid: int) -> DataFrame:
        """The routed rows a non-blocking node emits (computed once: persisted when several edges read it)."""
        from pyspark import StorageLevel

        if nid not in self.outputs:
            spec = self.specs[nid]
            df = self._input_df(spec) if isinstance(spec, InputSpec) else self._task_df(spec)
            if len([e for e in self.plan.outputs_of(nid) if not e.fused]) > 1:
                df = df.persist(StorageLevel.MEMORY_AND_DISK)
                self.persisted.append(df)
            self.outputs[nid] = df
        return self.outputs[nid]

    def _input_task(self, spec: InputSpec) -> InputTask:
        """The reader of an input node; file splits are listed (and CSV types inferred) here."""
        where = str(spec.node)  # the name, quoted
        at = file_system(spec.path, spec.s3_here) if spec.path is not None and self.file_reader == "auto" else None
        reader: CsvReader | ParquetReader | SourceReader | None = spec.reader
        source = {NodeKind.DATASET: "dataset", NodeKind.READER: "reader"}.get(spec.kind, "spark" if at is None else "files")
        edges = self._out_edges(spec.node.id)
        if at is not None and source == "files" and spec.kind is NodeKind.CSV:
            fs, path = at
            files = list_files(fs, path)
            fmt = csv_format(read_sample(fs, files[0]), spec.names, spec.sep, spec.columns, where, spec.header)
            reader = CsvReader(spec.node.name, fmt, fs, csv_splits(fs, files, spec.stride))
        elif at is not None and source == "files":
            fs, path = at
            reader = parquet_reader(where, fs, list_files(fs, path, (".parquet", ".pq")), spec.columns, spec.filters)
            # routes that filter before they decode: a string column of few values decoded only where rows are kept
            reader.decode = spec.batch_func is not None or not all(
                isinstance(e.key, Router) and e.key.dictionaries for e in edges
            )
        return InputTask(
            spec.node.name,
            source,
            reader,
            spec.batch_func,
            edges,
            self.plan.levels[spec.node.id],
            self.counters.get(spec.node.id),
            spec.batch_format,
            spec.parallelism,
        )

    def _input_df(self, spec: InputSpec) -> DataFrame:
        task = self._input_task(spec)
        if spec.kind is NodeKind.READER:  # one Spark task per channel
            df = self.spark.range(0, spec.parallelism, 1, spec.parallelism)
        elif isinstance(task.reader, CsvReader | ParquetReader):  # local files, read in the tasks
            n = len(task.reader)
            df = self.spark.range(0, n, 1, max(1, min(spec.parallelism, n)))
        elif spec.kind is NodeKind.DATASET:
            assert spec.dataset is not None
            df = spec.dataset.encoded.coalesce(spec.parallelism)
        elif spec.kind is NodeKind.CSV:
            df = self._spark_csv(spec)
        else:
            assert spec.path is not None  # every file input has one
            df = self.spark.read.parquet(spec.path)
            if spec.columns is not None:
                df = df.select(*spec.columns)
            task.reader = None
            filt = parquet_filter(spec.filters, str(spec.node))
            if filt is not None:
                task.batch_func = _filtered(filt, spec.batch_func)
        return df.mapInArrow(task, ROUTE_DDL)

    def _spark_csv(self, spec: InputSpec) -> DataFrame:
        """A CSV input on a file system only Spark reads: Spark's parser, types inferred from a sample."""
        from pyspark.sql.pandas.types import from_arrow_type
        from pyspark.sql.types import StringType, StructField, StructType

        assert spec.path is not None  # every file input has one
        lines = [r[0] for r in self.spark.read.text(spec.path).limit(2000).collect()]
        sample = "\n".join(lines).encode() + b"\n" if lines else b""
        fmt = csv_format(sample, spec.names, spec.sep, spec.columns, str(spec.node), spec.header)
        types = dict(fmt.types)
        schema = StructType([StructField(n, from_arrow_type(types[n]) if n in types else StringType()) for n in fmt.names])
        reader = self.spark.read.csv(spec.path, schema=schema, sep=spec.sep, mode="FAILFAST", header=spec.header)
        return reader.select(*fmt.keep)

    def _chain(self, nid: int, chained: list[Chained]) -> list[Edge]:
        """The edges read in a node's task: its own, and those of the nodes chained into it (added to `chained`)."""
        edges: list[Edge] = []
        for e in self.plan.inputs_of(nid):
            if e.src in self.plan.chained:
                edges += self._chain(e.src, chained)
                src = self.specs[e.src]
                assert isinstance(src, TaskSpec)
                streams = {i.id: i.stream for i in self.plan.inputs_of(e.src)}
                chained.append(Chained(src.node.name, src.executor, streams, _out_edge(e)))
            else:
                edges.append(e)
        return edges

    def _task_df(self, spec: TaskSpec) -> DataFrame:
        nid = spec.node.id
        chained: list[Chained] = []
        edges = self._chain(nid, chained)
        parts = []
        for e in edges:
            if e.fused:
                continue
            df = self._output(e.src)
            if len([o for o in self.plan.outputs_of(e.src) if not o.fused]) > 1:
                df = df.where(df["edge"] == e.id)
            parts.append(df)
        fused = []
        for e in edges:
            if e.fused:
                src = self.specs[e.src]
                assert isinstance(src, InputSpec)
                fused.append((self._input_task(src), _out_edge(e)))
        task = NodeTask(
            spec.node.name,
            spec.executor,
            spec.parallelism,
            spec.blocking,
            {e.id: e.stream for e in self.plan.inputs_of(nid)},
            [] if spec.blocking else self._out_edges(nid),
            bool(parts),
            fused,
            chained,
        )
        if parts:
            df = parts[0]
            for other in parts[1:]:
                df = df.unionByName(other)
            df = df.repartitionById(spec.parallelism, "channel").sortWithinPartitions("channel", "level", "seq", "edge")
        else:
            df = self.spark.range(0, 1, 1, 1)  # one empty-handed task: every input is read inside it
        return df.mapInArrow(task, DATASET_DDL if spec.blocking else ROUTE_DDL)


def _out_edge(edge: Edge) -> OutEdge:
    """What a producer's task knows of an edge it emits on."""
    return OutEdge(edge.id, edge.key, edge.n_channels, edge.level, edge.label)


def _filtered(expression: Any, batch_func: Any) -> Any:
    """A batch function that applies a Parquet filter first (for Parquet read by Spark)."""
    import pyarrow as pa

    def apply(df: Any) -> Any:
        table = pa.Table.from_pandas(df, preserve_index=False).filter(expression)
        return batch_func(table.to_pandas()) if batch_func is not None else table

    return apply
