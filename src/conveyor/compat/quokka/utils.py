"""Quokka's cluster description (its `utils` module), for `TaskGraph(cluster)` and `{cluster.leader_private_ip: n}`.

On Conveyor, Spark is the cluster: a `LocalCluster` stands for the Spark session the TaskGraph
runs on. Its one machine is "localhost" (PySpark cannot pin a channel to a host, so the machine
names of a placement only add up channels); `cpu_count` is the default channel count of an input.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class LocalCluster:
    """One machine, as Quokka's LocalCluster: `leader_private_ip`, `private_ips`, `cpu_count`."""

    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)
    leader_public_ip: str = "localhost"
    leader_private_ip: str = "localhost"
    private_ips: dict[int, str] = field(default_factory=lambda: {0: "localhost"})
    public_ips: dict[int, str] = field(default_factory=lambda: {0: "localhost"})


__all__ = ["LocalCluster"]
