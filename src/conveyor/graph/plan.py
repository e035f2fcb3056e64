"""Checking and planning a TaskGraph: edges, dependency levels, fused reads, and every validation.

Dependency levels order what a node sees: an input node's level is one more than the highest
level of its `dependents` (0 without), a task node's is the highest level of its sources. A
consumer sorts its input by (channel, level, seq), so whatever a node depends on arrives first.

A file input is read inside its consumer's Spark task ("fused": no shuffle, and reading stops as
soon as the consumer finishes) when the consumer has one channel, is the input's only consumer,
and either the input has parallelism 1, or the consumer's executor `may_stop_early` (a limit), or
the input is Parquet without a batch function. Fusing an input with parallelism > 1 trades its
parallel read for stopping early, or, for such a Parquet input, for not moving its rows: decoding
Parquet costs less than encoding the rows, shuffling them through the JVM and decoding them again
(Quokka's Q8 at SF1: 240 MB of lineitem to a one-channel join).

A one-channel non-blocking task node whose only consumer has one channel runs inside that
consumer's task too ("chained"), when no order is lost by it (`_chainable`): a chain of such
joins (Quokka's Q8) is one Spark task, its batches never encoded or shuffled between them.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from .channels import PartitionKey
from .errors import GraphError
from .filesystems import read_here
from .nodes import InputSpec, NodeKind, Spec, TaskSpec, resolve


@dataclass(frozen=True)
class Edge:
    """A stream: producer node -> consumer node under a stream id, routed by `key` over `n_channels`."""

    id: int
    src: int
    dst: int
    stream: Hashable
    key: PartitionKey
    n_channels: int
    level: int
    fused: bool  # the producer runs inside the consumer's task (a fused input or a chained task node)
    label: str  # for messages: "edge 'lineitem' -> 'join' (stream 1)"


@dataclass
class Plan:
    """The checked graph: nodes in a runnable order, their edges and levels."""

    order: list[int]
    levels: dict[int, int]
    edges: list[Edge]
    fused: set[int] = field(default_factory=set)  # input nodes read inside their consumer's task
    chained: set[int] = field(default_factory=set)  # task nodes run inside their consumer's task

    def inputs_of(self, node: int) -> list[Edge]:
        return [e for e in self.edges if e.dst == node]

    def outputs_of(self, node: int) -> list[Edge]:
        return [e for e in self.edges if e.src == node]


def make_plan(specs: Mapping[int, Spec], graph: int, file_reader: str) -> Plan:
    """Check the nodes of graph `graph` and plan them; every error names the node at fault."""
    if not specs:
        raise GraphError("the graph has no nodes")
    deps: dict[int, list[int]] = {}  # node -> nodes that must come first (sources and dependents)
    sources: dict[int, list[tuple[Hashable, int]]] = {}
    for nid, spec in specs.items():
        where = f"node {spec.node}"
        if isinstance(spec, InputSpec):
            deps[nid] = []
            for ref in spec.dependents:
                dep = resolve(specs, graph, ref, f"{where}: dependents")
                if not isinstance(dep, InputSpec):
                    raise GraphError(f"{where}: dependents must be input nodes, {dep.node} is a task node")
                if dep.node.id == nid:
                    raise GraphError(f"{where}: cycle: the node lists itself in its dependents")
                deps[nid].append(dep.node.id)
            if spec.kind is NodeKind.DATASET and spec.dataset is not None and not spec.dataset.materialized:
                raise GraphError(f"{where}: {spec.dataset.unreadable_reason()}")
        else:
            sources[nid] = []
            for stream, ref in spec.sources.items():
                src = resolve(specs, graph, ref, f"{where}: source of stream {stream!r}")
                if src.node.id == nid:
                    raise GraphError(f"{where}: cycle: stream {stream!r} reads the node's own output")
                if isinstance(src, TaskSpec) and src.blocking:
                    raise GraphError(
                        f"{where}: stream {stream!r} reads blocking node {src.node}, whose output is a "
                        "Dataset: read it from a later graph with new_input_dataset()"
                    )
                sources[nid].append((stream, src.node.id))
            deps[nid] = [s for _, s in sources[nid]]
    order = _topological(deps, specs)
    levels: dict[int, int] = {}
    for nid in order:
        before = [levels[d] for d in deps[nid]]
        levels[nid] = (max(before) + 1 if before else 0) if isinstance(specs[nid], InputSpec) else max(before)
    consumers: dict[int, list[int]] = {nid: [] for nid in specs}
    for nid, srcs in sources.items():
        for _, s in srcs:
            consumers[s].append(nid)
    for nid, spec in specs.items():
        if not consumers[nid] and not (isinstance(spec, TaskSpec) and spec.blocking):
            raise GraphError(
                f"node {spec.node} has no consumer: its output would be lost (make the last node of each branch a blocking node)"
            )
    fusing = file_reader == "auto"
    fused = {n for n, s in specs.items() if fusing and isinstance(s, InputSpec) and _fusable(s, consumers[n], specs)}
    chained = {n for n, s in specs.items() if isinstance(s, TaskSpec) and _chainable(n, s, consumers[n], sources, levels, specs)}
    edges: list[Edge] = []
    for nid in order:
        if nid not in sources:
            continue
        consumer = specs[nid]
        assert isinstance(consumer, TaskSpec)
        for stream, producer in sources[nid]:
            key = consumer.partition_key[stream]
            label = f"edge {specs[producer].node} -> {consumer.node} (stream {stream!r})"
            in_task = producer in fused or producer in chained
            edges.append(Edge(len(edges), producer, nid, stream, key, consumer.parallelism, levels[producer], in_task, label))
            _check_key_statically(specs[producer], key, label)
    return Plan(order, levels, edges, fused, chained)


def _topological(deps: dict[int, list[int]], specs: Mapping[int, Spec]) -> list[int]:
    """Nodes with every dependency first; a cycle is an error naming a node on it."""
    state: dict[int, int] = {}  # 1 = on the current path, 2 = done
    order: list[int] = []
    for root in sorted(deps):
        stack = [(root, iter(deps[root]))]
        if state.get(root) == 2:
            continue
        state[root] = 1
        while stack:
            nid, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                state[nid] = 2
                order.append(nid)
            elif state.get(nxt) == 1:
                path = [specs[n].node.name for n, _ in stack] + [specs[nxt].node.name]
                path = path[path.index(specs[nxt].node.name) :]
                raise GraphError(f"node {specs[nxt].node}: cycle through sources/dependents: {' -> '.join(path)}")
            elif state.get(nxt) is None:
                state[nxt] = 1
                stack.append((nxt, iter(deps[nxt])))
    return order


def _fusable(spec: InputSpec, consumers: list[int], specs: Mapping[int, Spec]) -> bool:
    if spec.kind is NodeKind.DATASET or spec.path is None or not read_here(spec.path, spec.s3_here) or len(consumers) != 1:
        return False
    consumer = specs[consumers[0]]
    if consumer.parallelism != 1:
        return False
    executor = getattr(consumer, "executor", None)
    only_moves_rows = spec.kind is NodeKind.PARQUET and spec.batch_func is None
    return spec.parallelism == 1 or only_moves_rows or bool(getattr(executor, "may_stop_early", False))


def _chainable(
    nid: int,
    spec: TaskSpec,
    consumers: list[int],
    sources: Mapping[int, list[tuple[Hashable, int]]],
    levels: Mapping[int, int],
    specs: Mapping[int, Spec],
) -> bool:
    """Whether a task node runs inside its consumer's task: both have one channel, and no order is lost.

    Its output then never leaves the task (no shuffle, no encoding). The consumer still sees
    everything of a lower level first: it has no other source of a lower level than this node's
    outputs, and this node's `done` comes before anything of a higher level.
    """
    if spec.blocking or spec.parallelism != 1 or len(consumers) != 1:
        return False
    consumer = specs[consumers[0]]
    if consumer.parallelism != 1:
        return False
    return all(levels[src] >= levels[nid] for _, src in sources[consumer.node.id] if src != nid)


def _check_key_statically(src: Spec, key: PartitionKey, label: str) -> None:
    """A key column missing from an input whose columns are known before reading is an error now."""
    if not isinstance(key, str) or not isinstance(src, InputSpec) or src.batch_func is not None:
        return
    if src.kind is NodeKind.CSV:
        known = list(src.columns) if src.columns is not None else [n for n in src.names if n]
    elif src.kind is NodeKind.PARQUET and src.columns is not None:
        known = list(src.columns)
    else:
        return
    if key not in known:
        raise GraphError(f"{label}: partition key column {key!r} is not among the columns of {src.node} ({known})")
