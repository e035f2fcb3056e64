"""Quokka's `QuokkaContext` of 2023, as its graph-API programs use it: `TaskGraph(qc)` and their results.

`QuokkaContext(cluster=None, io_per_node=2, exec_per_node=1)`: the cluster (a `LocalCluster`,
nothing, or a SparkSession: Spark is the cluster), and the channels per machine of input nodes
(`io_per_node`) and task nodes (`exec_per_node`) under `CustomChannelsStrategy`. `set_config` and
`get_config` take Quokka's keys; their values are kept and unused (memory limits, spill paths and
fault tolerance are Spark's). `qc.dataset_manager.to_df.remote(dataset)` reads a blocking node's
output, as with Quokka's Ray actor (see `ray.get`).
"""

from __future__ import annotations

from typing import Any

from ...graph import GraphError
from .utils import LocalCluster

# Quokka's configuration keys and their defaults (its QuokkaContext's sql_config and exec_config)
DEFAULTS: dict[str, Any] = {
    "optimize_joins": True,
    "s3_csv_materialize_threshold": 10 * 1048576,
    "disk_csv_materialize_threshold": 1048576,
    "s3_parquet_materialize_threshold": 10 * 1048576,
    "disk_parquet_materialize_threshold": 1048576,
    "hbq_path": "/data/",
    "fault_tolerance": False,
    "memory_limit": 0.1,
    "max_pipeline_batches": 30,
    "blocking": False,
    "checkpoint_interval": None,
    "checkpoint_bucket": "quokka-checkpoint",
    "batch_attempt": 20,
    "max_pipeline": 300,
}


class _Remote:
    """A method callable as it is or through `.remote(...)`, as on Quokka's Ray actors."""

    def __init__(self, func: Any) -> None:
        self.func = func

    def __call__(self, *args: Any) -> Any:
        return self.func(*args)

    def remote(self, *args: Any) -> Any:
        return self.func(*args)


class DatasetManager:
    """Reads the Datasets of blocking nodes: `to_df.remote(dataset)` gives one polars DataFrame, or None when empty."""

    @property
    def to_df(self) -> _Remote:
        return _Remote(_to_df)


def _to_df(dataset: Any) -> Any:
    to_df = getattr(dataset, "to_df", None)
    if to_df is None:
        raise GraphError(f"dataset_manager.to_df: expected what new_blocking_node returned, got {type(dataset).__name__}")
    return to_df()


class QuokkaContext:
    """Quokka's context: a cluster and its channels per machine (see the module docstring)."""

    def __init__(self, cluster: Any = None, io_per_node: int = 2, exec_per_node: int = 1) -> None:
        for name, n in (("io_per_node", io_per_node), ("exec_per_node", exec_per_node)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise GraphError(f"QuokkaContext: {name} must be an int of at least 1, got {n!r}")
        self.cluster = cluster if cluster is not None else LocalCluster()
        self.io_per_node = io_per_node
        self.exec_per_node = exec_per_node
        self.config = dict(DEFAULTS)
        self.dataset_manager = DatasetManager()

    def set_config(self, key: str, value: Any) -> None:
        """Set one of Quokka's configuration keys (kept, unused: Spark manages memory, spills and retries)."""
        if key not in self.config:
            raise GraphError(f"QuokkaContext.set_config: unknown key {key!r} (Quokka's keys: {sorted(self.config)})")
        self.config[key] = value

    def get_config(self, key: str) -> Any:
        """The value of one of Quokka's configuration keys."""
        if key not in self.config:
            raise GraphError(f"QuokkaContext.get_config: unknown key {key!r} (Quokka's keys: {sorted(self.config)})")
        return self.config[key]


__all__ = ["QuokkaContext"]
