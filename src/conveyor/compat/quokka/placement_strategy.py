"""Quokka's placement strategies of 2023 (`pyquokka.placement_strategy`): how many channels a node gets.

As in Quokka: `SingleChannelStrategy()` is one channel; `CustomChannelsStrategy(n)` is n channels
per machine times the context's `io_per_node` (input nodes) or `exec_per_node` (task nodes);
`TaggedCustomChannelsStrategy(n, tag)` counts only the machines tagged `tag`
(`cluster.tag_instance(ip, tag)`); `DatasetStrategy(total)` is `total` channels. The default is
`CustomChannelsStrategy(1)`. On Spark the channels are placed by Spark's scheduler: the machines
only count channels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...graph import GraphError


class PlacementStrategy:
    """Quokka's base class of the strategies."""


@dataclass
class SingleChannelStrategy(PlacementStrategy):
    """One channel (an aggregating node's)."""


@dataclass
class CustomChannelsStrategy(PlacementStrategy):
    """`channels_per_node` channels per machine, times the context's per-node count of the node's kind."""

    channels_per_node: int


@dataclass
class TaggedCustomChannelsStrategy(PlacementStrategy):
    """`channels_per_node` per machine tagged `tag`, times the context's per-node count of the node's kind."""

    channels_per_node: int
    tag: str


@dataclass
class DatasetStrategy(PlacementStrategy):
    """`total_channels` channels."""

    total_channels: int


def channel_count(strategy: Any, cluster: Any, per_node: int, what: str) -> int:
    """The channels `strategy` gives a node on `cluster`, `per_node` being the context's io or exec count."""
    if isinstance(strategy, SingleChannelStrategy):
        return 1
    if isinstance(strategy, DatasetStrategy):
        return _positive(strategy.total_channels, what, "DatasetStrategy's total_channels")
    if isinstance(strategy, TaggedCustomChannelsStrategy):
        tags = getattr(cluster, "tags", {})
        if strategy.tag not in tags:
            raise GraphError(
                f"{what}: no machine is tagged {strategy.tag!r} (tags: {sorted(tags)}); tag one with "
                "cluster.tag_instance(ip, tag)"
            )
        per = _positive(strategy.channels_per_node, what, "channels per node")
        return len(tags[strategy.tag]) * per * per_node
    if isinstance(strategy, CustomChannelsStrategy):
        machines = len(getattr(cluster, "private_ips", {0: "localhost"}))
        return machines * _positive(strategy.channels_per_node, what, "channels per node") * per_node
    raise GraphError(
        f"{what}: {type(strategy).__name__} is not a placement strategy (SingleChannelStrategy, "
        "CustomChannelsStrategy, TaggedCustomChannelsStrategy or DatasetStrategy)"
    )


def _positive(n: Any, what: str, name: str) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise GraphError(f"{what}: {name} must be an int of at least 1, got {n!r}")
    return n


__all__ = [
    "CustomChannelsStrategy",
    "DatasetStrategy",
    "PlacementStrategy",
    "SingleChannelStrategy",
    "TaggedCustomChannelsStrategy",
]
