"""Quokka's cluster description (its `utils` module), for `TaskGraph(cluster)` and `{cluster.leader_private_ip: n}`.

On Conveyor, Spark is the cluster: a `LocalCluster` stands for the Spark session the TaskGraph
runs on. Its one machine is "localhost" (PySpark cannot pin a channel to a host, so the machine
names of a placement only add up channels); `cpu_count` is the default channel count of an input
in the 2022 forms. `tags` (set with `tag_instance`) count machines for Quokka's 2023
`TaggedCustomChannelsStrategy`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class LocalCluster:
    """One machine, as Quokka's LocalCluster: `leader_private_ip`, `private_ips`, `cpu_count`, `num_node`, `tags`."""

    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)
    leader_public_ip: str = "localhost"
    leader_private_ip: str = "localhost"
    private_ips: dict[int, str] = field(default_factory=lambda: {0: "localhost"})
    public_ips: dict[int, str] = field(default_factory=lambda: {0: "localhost"})
    tags: dict[str, list[str]] = field(default_factory=dict)

    @property
    def num_node(self) -> int:
        """The machines of the cluster."""
        return len(self.private_ips)

    def tag_instance(self, private_ip: str, tag: str) -> None:
        """Tag a machine of the cluster (for `TaggedCustomChannelsStrategy`)."""
        if private_ip not in self.private_ips.values():
            raise ValueError(f"{private_ip!r} is not a machine of the cluster ({sorted(self.private_ips.values())})")
        self.tags.setdefault(tag, []).append(private_ip)


__all__ = ["LocalCluster"]
