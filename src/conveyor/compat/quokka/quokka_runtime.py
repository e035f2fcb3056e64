"""Quokka's TaskGraph of 2022 with Quokka's semantics, run by `conveyor.graph` on Spark.

What Quokka's programs rely on, kept: any object with `execute(batches, stream_id, executor_id)`
and `done(executor_id)` is an executor, whatever its class; `execute` gets a list of batches;
batches are whatever the executors and batch functions return (pandas frames keep their index,
polars frames stay polars, numbers stay numbers); partition keys route as Quokka's did
(`partitions`); a blocking node's Dataset gives back what its executors emitted.

The argument forms of Quokka's releases of 2022, each told apart by its arguments:
- January: `new_input_csv(bucket, key, names, parallelism, ip, ...)`,
  `new_stateless_node(streams, functionObject, parallelism, partition_key, ip)` (its executors
  got one batch per call), `initialize()`;
- March-April: `new_input_csv(bucket, key, names, ip_to_num_channel, batch_func, sep, dependents,
  stride)`, `new_input_multiparquet`, `new_input_reader_node(reader, ip_to_num_channel, ...)`,
  `new_non_blocking_node` / `new_blocking_node(streams, datasets, functionObject,
  ip_to_num_channel, partition_key)`, `create()`, `run_with_fault_tolerance()`, Datasets read with
  `ray.get(dataset.to_pandas.remote())`;
- June onwards: `TaskGraph(cluster)`, `new_non_blocking_node(streams, functionObject,
  ip_to_num_channel=None, channel_to_ip=None, partition_key_supplied={})` (a stream left out of
  `partition_key_supplied` gets Quokka's default partition), `dataset.to_pandas()`, `to_list()`,
  `to_dict()`, `to_df()`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa

from ...graph import Dataset as GraphDataset
from ...graph import Executor as GraphExecutor
from ...graph import GraphError, Node, Router
from ...graph import TaskGraph as GraphTaskGraph
from ...graph.nodes import InputSpec, TaskSpec, resolve
from .context import QuokkaContext
from .dataset import FileInput, InputCSVDataset, InputMultiParquetDataset, QuokkaReader, is_reader, is_taped_reader, taped
from .frames import concat, is_polars, polars_module, received, to_polars, to_transit
from .partitions import ByRatio, router
from .placement_strategy import CustomChannelsStrategy, channel_count
from .target_info import route
from .utils import LocalCluster

FORM_2023_KEYWORDS = frozenset({"stage", "placement_strategy", "source_target_info", "transform_fn", "assume_sorted"})

LOCALHOST = "localhost"


class QuokkaExecutor(GraphExecutor):
    """A Quokka executor run by `conveyor.graph`: batches of any type, a list of them per call.

    What a non-blocking node emits travels on (`frames.to_transit`); what a blocking node emits is
    kept as it is, as Quokka stored it. In Quokka's 2023 form (`arrow_in`) the executor gets
    pyarrow Tables, a Table it emits is a polars DataFrame (as Quokka turned it into one), and a
    blocking node's output goes through `transform_fn` before it is kept.
    """

    batch_format = "object"

    def __init__(
        self,
        inner: Any,
        one_batch: bool = False,
        blocking: bool = False,
        arrow_in: bool = False,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.inner = inner
        self.one_batch = one_batch  # January 2022's executors took one batch per call
        self.blocking = blocking
        self.arrow_in = arrow_in
        self.transform = transform

    def _out(self, value: Any) -> Any:
        if self.arrow_in:
            if isinstance(value, pa.Table):
                value = polars_module("Quokka's executors").from_arrow(value)
            if self.blocking and self.transform is not None and value is not None:
                value = self.transform(value)
            return to_transit(value)
        return value if self.blocking else to_transit(value)

    def _outputs(self, out: Any) -> Any:
        if inspect.isgenerator(out):  # Quokka pushed each value a generator yields
            return (self._out(v) for v in out)
        return self._out(out)

    def execute(self, batch: Any, stream_id: Hashable, channel: int) -> Any:
        batch = to_transit(batch) if self.arrow_in else received(batch)
        return self._outputs(self.inner.execute(batch if self.one_batch else [batch], stream_id, channel))

    def done(self, channel: int) -> Any:
        return self._outputs(self.inner.done(channel))

    @property
    def finished(self) -> bool:
        return vars(self.inner).get("early_termination") is True


class _Call:
    """A Dataset method callable as it is or, as Quokka's Ray actors were, through `.remote()` (see `ray.get`)."""

    def __init__(self, func: Callable[[], Any]) -> None:
        self.func = func

    def __call__(self) -> Any:
        return self.func()

    def remote(self) -> Any:
        return self.func()


class Dataset:
    """A blocking node's output: what its executors emitted, read as Quokka's Datasets were."""

    def __init__(self, dataset: GraphDataset) -> None:
        self.dataset = dataset

    def _list(self) -> list[Any]:
        return [value for _, value in self.dataset.values()]

    def _df(self) -> Any:
        values = [v for v in self._list() if v is not None]
        if not values:
            return pd.DataFrame()
        if all(is_polars(v) for v in values):
            return polars_module("reading a Dataset of polars frames").concat(values, how="vertical_relaxed")
        return concat([v.to_pandas() if is_polars(v) or isinstance(v, pa.Table) else v for v in values])

    def _dict(self) -> dict[int, list[Any]]:
        out: dict[int, list[Any]] = {c: [] for c in range(self.dataset.n_channels)}
        for channel, value in self.dataset.values():
            if isinstance(value, list):
                out.setdefault(channel, []).extend(value)
            else:
                out.setdefault(channel, []).append(value)
        return out

    @property
    def to_pandas(self) -> _Call:
        """Every frame emitted, concatenated: polars when they all are (as Quokka's was), else pandas (index kept)."""
        return _Call(self._df)

    @property
    def to_df(self) -> _Call:
        """Quokka's later name of `to_pandas`."""
        return _Call(self._df)

    @property
    def to_list(self) -> _Call:
        """Every value emitted, in channel order."""
        return _Call(self._list)

    @property
    def to_dict(self) -> _Call:
        """{channel: values emitted}, a list emitted counting as its elements."""
        return _Call(self._dict)


class PolarsDataset(Dataset):
    """A blocking node's output in Quokka's 2023 form: `to_df()` is one polars DataFrame, or None when nothing was emitted."""

    def _df(self) -> Any:
        pl = polars_module("reading a Dataset")
        values = [v for v in self._list() if v is not None]
        frames = [to_polars(v, "a Dataset of Quokka's 2023 form") for v in values]
        if not frames:
            return None
        return pl.concat(frames, how="vertical_relaxed")


def _spark_of(cluster: Any) -> Any:
    """The Spark session a TaskGraph's first argument names (None: the embedded one)."""
    if isinstance(cluster, QuokkaContext):
        cluster = cluster.cluster
    if cluster is None or isinstance(cluster, LocalCluster):
        return None
    if type(cluster).__name__ == "SparkSession":
        return cluster
    raise GraphError(
        f"TaskGraph takes a LocalCluster, a SparkSession or nothing, got {type(cluster).__name__} "
        "(Quokka's EC2 clusters are Spark's: pass the session)"
    )


class TaskGraph:
    """Quokka's TaskGraph of 2022 (see the module docstring for its forms).

    `cluster`: a `LocalCluster` (or nothing) runs on the embedded local Spark session; a
    SparkSession runs there. `checkpoint_bucket` is taken and unused: Spark retries failed tasks.
    """

    def __init__(self, cluster: Any = None, checkpoint_bucket: str | None = None) -> None:
        self.context = cluster if isinstance(cluster, QuokkaContext) else None
        if self.context is not None:
            cluster = self.context.cluster
        self.cluster = cluster if cluster is not None else LocalCluster()
        self.graph = GraphTaskGraph(spark=_spark_of(cluster))
        self.channels: dict[Node, int] = {}
        self.stages: dict[Node, int] = {}  # Quokka's 2023 `stage=` of each node (0 when not given)
        self.inputs: set[Node] = set()
        self.created = False

    def _context(self) -> QuokkaContext:
        """The QuokkaContext of the 2023 forms: the one given, or Quokka's defaults on this cluster."""
        if self.context is None:
            self.context = QuokkaContext(self.cluster)
        return self.context

    def _form_2023(self, kwargs: Mapping[str, Any]) -> bool:
        """Whether a node call is in Quokka's 2023 form: the graph has a QuokkaContext, or a 2023 keyword is given."""
        return isinstance(self.context, QuokkaContext) or bool(FORM_2023_KEYWORDS & set(kwargs))

    # --- placement -------------------------------------------------------------------------------
    def _count(self, ip_to_num_channel: Any, channel_to_ip: Any, default: int, what: str) -> int:
        if ip_to_num_channel is not None and channel_to_ip is not None:
            raise GraphError(f"{what}: give ip_to_num_channel or channel_to_ip, not both")
        if channel_to_ip is not None:
            if not isinstance(channel_to_ip, Mapping) or not channel_to_ip:
                raise GraphError(f"{what}: channel_to_ip must map channel -> machine, got {channel_to_ip!r}")
            return len(channel_to_ip)
        if ip_to_num_channel is None:
            return default
        if isinstance(ip_to_num_channel, int) and not isinstance(ip_to_num_channel, bool):
            return ip_to_num_channel
        if not isinstance(ip_to_num_channel, Mapping) or not ip_to_num_channel:
            raise GraphError(f"{what}: ip_to_num_channel must map machine -> channels, got {ip_to_num_channel!r}")
        counts = list(ip_to_num_channel.values())
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts):
            raise GraphError(f"{what}: every machine needs a channel count of at least 1, got {ip_to_num_channel!r}")
        return sum(counts)

    def _node(self, node: Node, channels: int) -> Node:
        self.channels[node] = channels
        return node

    # --- inputs ------------------------------------------------------------------------------------
    def new_input_reader_node(self, reader: Any, *args: Any, **kwargs: Any) -> Node:
        """An input read by one of Quokka's dataset objects, or by any object with its reader methods.

        Quokka's 2022 form `(reader, ip_to_num_channel=None, batch_func=None, dependents=(),
        ckpt_interval=None, *, channel_to_ip=None)` (cluster.cpu_count channels by default), or its
        2023 form `(reader, stage=0, placement_strategy=None)` (in a graph of a QuokkaContext, or
        with either keyword; `CustomChannelsStrategy(1)` by default).
        """
        if self._form_2023(kwargs):
            return self._input_2023(reader, *args, **kwargs)
        return self._input_2022(reader, *args, **kwargs)

    def _input_2023(self, reader: Any, stage: int = 0, placement_strategy: Any = None) -> Node:
        what = "new_input_reader_node"
        _check_stage(stage, what)
        strategy = placement_strategy if placement_strategy is not None else CustomChannelsStrategy(1)
        context = self._context()
        channels = channel_count(strategy, self.cluster, context.io_per_node, what)
        if isinstance(reader, FileInput):
            node = reader.add_to(self.graph, channels, None, [])  # Tables travel as read; each edge's TargetInfo works on them
        elif is_taped_reader(reader):
            node = self.graph.new_input_reader(taped(reader, channels, what), channels, to_transit, [])
        elif is_reader(reader):
            node = self.graph.new_input_reader(QuokkaReader(reader), channels, to_transit, [])
        else:
            raise GraphError(
                f"{what}: {type(reader).__name__} is not a reader (one of the compat's Input*Dataset classes, or an object "
                "with get_own_state(num_channels) and execute(channel, state))"
            )
        self.stages[node] = stage
        self.inputs.add(node)
        return self._node(node, channels)

    def _input_2022(
        self,
        reader: Any,
        ip_to_num_channel: Any = None,
        batch_func: Callable[[Any], Any] | None = None,
        dependents: Sequence[Node] = (),
        ckpt_interval: int | None = None,
        *,
        channel_to_ip: Any = None,
    ) -> Node:
        default = self.cluster.cpu_count * len(self.cluster.private_ips)
        channels = self._count(ip_to_num_channel, channel_to_ip, default, "new_input_reader_node")
        func = _pushed(batch_func)
        if isinstance(reader, FileInput):
            # file readers yield pyarrow Tables, which travel as they are: without a batch function, none
            # is given (a Parquet input without one may then be read inside its consumer's task)
            file_func = func if batch_func is not None else None
            node = reader.add_to(self.graph, channels, file_func, list(dependents))
        elif is_reader(reader):
            if callable(getattr(reader, "get_own_state", None)):
                reader.get_own_state(channels)  # Quokka asked for it on the driver, before the channels started
            node = self.graph.new_input_reader(QuokkaReader(reader), channels, func, list(dependents))
        elif is_taped_reader(reader):
            node = self.graph.new_input_reader(taped(reader, channels, "new_input_reader_node"), channels, func, list(dependents))
        else:
            raise GraphError(
                f"new_input_reader_node: {type(reader).__name__} is not a reader (one of the compat's Input*Dataset "
                "classes, or an object with get_next_batch(channel, pos=None))"
            )
        self.inputs.add(node)
        return self._node(node, channels)

    def new_input_csv(self, bucket: str, key: str, names: Sequence[str | None], *args: Any, **kwargs: Any) -> Node:
        """Quokka's CSV input of early 2022: `batch_func` gets pandas, as it did then.

        January's `(bucket, key, names, parallelism, ip, batch_func, sep, dependents)` or March's
        `(bucket, key, names, ip_to_num_channel, batch_func, sep, dependents, stride)`.
        """
        placement = args[0] if args else kwargs.pop("parallelism", kwargs.pop("ip_to_num_channel", None))
        rest = list(args[1:])
        if isinstance(placement, int) and not isinstance(placement, bool):  # January: a count, then the machine
            ip = rest.pop(0) if rest else kwargs.pop("ip", LOCALHOST)
            placement = {ip: placement}
        names_ = ["batch_func", "sep", "dependents", "stride"]
        options = dict(zip(names_, rest, strict=False)) | kwargs
        unknown = set(options) - set(names_)
        if unknown:
            raise GraphError(f"new_input_csv: unexpected arguments {sorted(unknown)}")
        reader = InputCSVDataset(bucket, key, names, options.get("sep", ","), options.get("stride", 64 * 1024 * 1024))
        return self.new_input_reader_node(reader, placement, _on_pandas(options.get("batch_func")), options.get("dependents", ()))

    def new_input_multiparquet(
        self,
        bucket: str,
        key: str,
        ip_to_num_channel: Any,
        batch_func: Callable[[Any], Any] | None = None,
        columns: Sequence[str] | None = None,
        dependents: Sequence[Node] = (),
    ) -> Node:
        """Quokka's Parquet input of March 2022: the files under `key`; `batch_func` gets pandas, as then."""
        reader = InputMultiParquetDataset(bucket, key, columns)
        return self.new_input_reader_node(reader, ip_to_num_channel, _on_pandas(batch_func), dependents)

    def new_input_redis(
        self,
        dataset: Dataset,
        ip_to_num_channel: Any = None,
        policy: str = "default",
        batch_func: Callable[[Any], Any] | None = None,
        dependents: Sequence[Node] = (),
    ) -> Node:
        """A Dataset of an earlier graph as a stream (Quokka kept Datasets in Redis)."""
        if not isinstance(dataset, Dataset):
            raise GraphError(f"new_input_redis: expected a Dataset of an earlier graph, got {type(dataset).__name__}")
        if policy != "default":
            raise GraphError(f"new_input_redis: policy must be 'default' (the only one Quokka had), got {policy!r}")
        channels = self._count(ip_to_num_channel, None, dataset.dataset.n_channels, "new_input_redis")
        node = self.graph.new_input_dataset(
            dataset.dataset, channels, _pushed(batch_func), list(dependents), batch_format="object"
        )
        return self._node(node, channels)

    def new_input_dataset_node(self, dataset: Dataset, stage: int = 0) -> Node:
        """Quokka's 2023 input of a blocking node's Dataset from an earlier graph: one channel per channel of it."""
        what = "new_input_dataset_node"
        _check_stage(stage, what)
        if not isinstance(dataset, Dataset):
            raise GraphError(
                f"{what}: expected what new_blocking_node of an earlier graph returned, got {type(dataset).__name__}"
            )
        channels = dataset.dataset.n_channels
        node = self.graph.new_input_dataset(dataset.dataset, channels, to_transit, [], batch_format="object")
        self.stages[node] = stage
        self.inputs.add(node)
        return self._node(node, channels)

    # --- task nodes ----------------------------------------------------------------------------
    def _task(self, args: tuple[Any, ...], kwargs: dict[str, Any], blocking: bool) -> Any:
        what = "new_blocking_node" if blocking else "new_non_blocking_node"
        spring = len(args) >= 2 and (args[1] is None or isinstance(args[1], list | tuple | Mapping))
        spring = spring or "datasets" in kwargs or "partition_key" in kwargs
        if not spring and self._form_2023(kwargs):
            return self._task_2023(*args, blocking=blocking, what=what, **kwargs)
        if spring:
            streams, executor, placement, keys, channel_to_ip = _spring_node(*args, **kwargs)
        else:
            streams, executor, placement, channel_to_ip, keys = _later_node(*args, **kwargs)
        return self._add_task(streams, executor, placement, channel_to_ip, keys, spring, blocking, what)

    def _add_task(
        self,
        streams: Any,
        executor: Any,
        placement: Any,
        channel_to_ip: Any,
        keys: Any,
        spring: bool,
        blocking: bool,
        what: str,
        one_batch: bool = False,
    ) -> Any:
        if not isinstance(streams, Mapping) or not streams:
            raise GraphError(f"{what}: streams must map stream id -> node, got {streams!r}")
        _check_executor(executor, what)
        if not isinstance(keys, Mapping):
            raise GraphError(f"{what}: the partition keys must map stream id -> key, got {type(keys).__name__}")
        default = len(self.cluster.private_ips)
        channels = self._count(placement, channel_to_ip, default, what)
        sources: dict[Hashable, Any] = {}
        routes: dict[Hashable, Any] = {}
        for stream, source in streams.items():
            sources[stream] = source.dataset if isinstance(source, Dataset) else source
            if stream in keys:
                routes[stream] = router(keys[stream], spring)
            elif spring:
                raise GraphError(
                    f"{what}: stream {stream!r} has no partition key (give None to send every batch to every channel)"
                )
            else:
                routes[stream] = Router(ByRatio(self._channels_of(source, what), channels))
        extra = set(keys) - set(streams)
        if extra:
            raise GraphError(f"{what}: partition keys for streams that are not given: {sorted(map(repr, extra))}")
        wrapped = QuokkaExecutor(executor, one_batch, blocking)
        if blocking:
            return Dataset(self.graph.new_blocking_node(sources, wrapped, channels, routes))
        return self._node(self.graph.new_non_blocking_node(sources, wrapped, channels, routes), channels)

    def _task_2023(
        self,
        streams: Any,
        functionObject: Any,
        stage: int = 0,
        placement_strategy: Any = None,
        source_target_info: Any = None,
        transform_fn: Callable[[Any], Any] | None = None,
        assume_sorted: Any = None,
        *,
        blocking: bool,
        what: str,
    ) -> Any:
        """A task node of Quokka's 2023 form: each stream's TargetInfo, a placement strategy, a stage."""
        _check_stage(stage, what)
        if not isinstance(streams, Mapping) or not streams:
            raise GraphError(f"{what}: streams must map stream id -> node, got {streams!r}")
        _check_executor(functionObject, what)
        infos = source_target_info if source_target_info is not None else {}
        if not isinstance(infos, Mapping) or set(infos) != set(streams):
            given = sorted(map(repr, infos)) if isinstance(infos, Mapping) else repr(infos)
            raise GraphError(
                f"{what}: source_target_info must give a TargetInfo for each stream ({sorted(map(repr, streams))}), got {given}"
            )
        if transform_fn is not None and (not blocking or not callable(transform_fn)):
            raise GraphError(f"{what}: transform_fn is a function, and only a blocking node's")
        strategy = placement_strategy if placement_strategy is not None else CustomChannelsStrategy(1)
        channels = channel_count(strategy, self.cluster, self._context().exec_per_node, what)
        sources: dict[Hashable, Any] = {}
        routes: dict[Hashable, Any] = {}
        for stream, source in streams.items():
            sources[stream] = source.dataset if isinstance(source, Dataset) else source
            routes[stream] = route(infos[stream], self._channels_of(source, what), channels, f"{what}: stream {stream!r}")
        # assume_sorted is kept without asking: each source's channels arrive in channel order, each channel's batches in order
        wrapped = QuokkaExecutor(functionObject, blocking=blocking, arrow_in=True, transform=transform_fn)
        if blocking:
            return PolarsDataset(self.graph.new_blocking_node(sources, wrapped, channels, routes))
        node = self.graph.new_non_blocking_node(sources, wrapped, channels, routes)
        self.stages[node] = stage
        return self._node(node, channels)

    def _channels_of(self, source: Any, what: str) -> int:
        if isinstance(source, Dataset):
            return source.dataset.n_channels
        if source not in self.channels:
            raise GraphError(f"{what}: {source!r} is not a node of this graph")
        return self.channels[source]

    def new_non_blocking_node(self, *args: Any, **kwargs: Any) -> Node:
        """A task node whose output streams on.

        Quokka's `(streams, datasets, functionObject, ip_to_num_channel, partition_key)`, or its later
        `(streams, functionObject, ip_to_num_channel=None, channel_to_ip=None, partition_key_supplied={})`.
        """
        node: Node = self._task(args, kwargs, blocking=False)
        return node

    def new_blocking_node(self, *args: Any, **kwargs: Any) -> Dataset:
        """A task node whose output is kept as a Dataset; the forms of `new_non_blocking_node`."""
        dataset: Dataset = self._task(args, kwargs, blocking=True)
        return dataset

    def new_stateless_node(
        self,
        streams: Mapping[Hashable, Node],
        functionObject: Any,
        parallelism: int,
        partition_key: Mapping[Hashable, Any],
        ip: str = LOCALHOST,
    ) -> Node:
        """Quokka's task node of January 2022: its executor gets one batch per call."""
        node: Node = self._add_task(
            streams, functionObject, {ip: parallelism}, None, partition_key, True, False, "new_stateless_node", one_batch=True
        )
        return node

    # --- running -------------------------------------------------------------------------------
    def create(self) -> None:
        """Check and plan the graph (Quokka started its actors here); `stage=` orders the inputs (see `_order_stages`)."""
        self._order_stages()
        self.graph.initialize()
        self.created = True

    initialize = create

    def run(self) -> None:
        """Run the graph to the end: every blocking node's Dataset is then readable."""
        if not self.created:
            self.create()
        self.graph.run()

    def _order_stages(self) -> None:
        """Quokka's `stage=`: a node reads its sources of lower stages to their end before those of higher ones.

        Conveyor delivers a node's input by dependency level (docs/graph.md, "Order"): the input
        nodes of each stage are made to depend on those of the stage below, so their levels follow
        the stages. A task node's level is its sources' highest, so a node whose sources' stages
        would then arrive out of order (a task node given a stage below what it reads) is an error
        naming it, raised before any work.
        """
        if not any(self.stages.values()):
            return
        inputs = sorted((n for n in self.inputs if n in self.stages), key=lambda n: n.id)
        ranks = sorted({self.stages[n] for n in inputs})
        for node in inputs:
            rank = ranks.index(self.stages[node])
            if rank:
                below = tuple(n for n in inputs if self.stages[n] == ranks[rank - 1])
                spec = self.graph.specs[node.id]
                assert isinstance(spec, InputSpec)
                spec.dependents = (*spec.dependents, *below)
        plan = self.graph.initialize()
        for spec in self.graph.specs.values():
            if not isinstance(spec, TaskSpec):
                continue
            read = [resolve(self.graph.specs, spec.node.graph, ref, "").node for ref in spec.sources.values()]
            for a in read:
                for b in read:
                    if self.stages.get(a, 0) < self.stages.get(b, 0) and plan.levels[a.id] >= plan.levels[b.id]:
                        raise GraphError(
                            f"node {spec.node}: stage {self.stages.get(a, 0)} of source {a} cannot be read to its end before "
                            f"stage {self.stages.get(b, 0)} of source {b} (the stages of task nodes follow their sources': "
                            "give the inputs the stages instead)"
                        )

    run_with_fault_tolerance = run  # Spark retries a failed task from its inputs


def _check_stage(stage: Any, what: str) -> None:
    if not isinstance(stage, int) or isinstance(stage, bool):
        raise GraphError(f"{what}: stage must be an int, got {stage!r}")


def _check_executor(executor: Any, what: str) -> None:
    if not (callable(getattr(executor, "execute", None)) and callable(getattr(executor, "done", None))):
        raise GraphError(
            f"{what}: {type(executor).__name__} is not an executor: it needs Quokka's execute(batches, stream_id, "
            "executor_id) and done(executor_id) methods"
        )


def _spring_node(
    streams: Any, datasets: Any, functionObject: Any, ip_to_num_channel: Any, partition_key: Any, ckpt_interval: Any = None
) -> tuple[Any, Any, Any, Any, Any]:
    if datasets:
        raise GraphError(
            "a task node's datasets argument (handed to the executor's initialize) is not supported: give each "
            "Dataset as a stream of the node ({stream id: dataset}), or read it with new_input_redis()"
        )
    return streams, functionObject, ip_to_num_channel, partition_key, None


def _later_node(
    streams: Any,
    functionObject: Any,
    ip_to_num_channel: Any = None,
    channel_to_ip: Any = None,
    partition_key_supplied: Any = None,
    ckpt_interval: Any = None,
) -> tuple[Any, Any, Any, Any, Any]:
    return streams, functionObject, ip_to_num_channel, channel_to_ip, dict(partition_key_supplied or {})


def _pushed(batch_func: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """A reader's batch function as Quokka ran it: it gets the Table read; what it returns travels on."""
    if batch_func is None:
        return to_transit
    return lambda batch: to_transit(batch_func(batch))


def _on_pandas(batch_func: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """A batch function of Quokka's early inputs, which read pandas frames: the batch read, as pandas."""
    if batch_func is None:
        return lambda table: table.to_pandas()
    return lambda table: batch_func(table.to_pandas())


__all__ = ["Dataset", "PolarsDataset", "QuokkaExecutor", "TaskGraph"]
