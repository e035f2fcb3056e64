"""Quokka's runtime API of 2022 and graph API of 2023, with Quokka's semantics, on Conveyor's TaskGraph.

A Quokka program moves by changing its import lines (and dropping its Ray, Redis and cluster-manager
setup; docs/migrating-from-quokka.md):

    from pyquokka.quokka_runtime import TaskGraph  ->  from conveyor.compat.quokka.quokka_runtime import TaskGraph
    from pyquokka.sql import AggExecutor           ->  from conveyor.compat.quokka.sql import AggExecutor
    from pyquokka.executors import ...             ->  from conveyor.compat.quokka.executors import ...
    from pyquokka.dataset import InputCSVDataset   ->  from conveyor.compat.quokka.dataset import InputCSVDataset
    from pyquokka.utils import LocalCluster        ->  from conveyor.compat.quokka.utils import LocalCluster
    import ray                                     ->  from conveyor.compat.quokka import ray
    from pyquokka import QuokkaContext             ->  from conveyor.compat.quokka import QuokkaContext
    from pyquokka.target_info import TargetInfo    ->  from conveyor.compat.quokka.target_info import TargetInfo
    from pyquokka.placement_strategy import ...    ->  from conveyor.compat.quokka.placement_strategy import ...

Modules: `quokka_runtime` (TaskGraph, Dataset, the executor adapter), `partitions` (Quokka's
partition keys), `dataset` (its input datasets), `executors` (its stock executors; `sql` is their
spring 2022 module name), `frames` (the batch types), `utils` (LocalCluster), `ray` (`ray.get`);
of 2023: `context` (QuokkaContext), `target_info` (TargetInfo, partitioners), `predicates`
(sqlglot predicates as polars expressions), `placement_strategy` (channel counts), `sql_executors`
(SQLAggExecutor, BuildProbeJoinExecutor; also in `executors`), `rest_inputs` (the REST API inputs).
`conveyor.TaskGraph` is Conveyor's own TaskGraph, one batch per call, Arrow or pandas batches.
It needs the `spark` extra; Quokka's programs on polars frames and its 2023 predicates need the
`quokka` extra (polars, sqlglot, duckdb).
"""

from __future__ import annotations

from conveyor.extras import SPARK, require

require(SPARK, "conveyor.compat.quokka")

from . import ray
from .context import QuokkaContext
from .quokka_runtime import Dataset, TaskGraph
from .utils import LocalCluster

__all__ = ["Dataset", "LocalCluster", "QuokkaContext", "TaskGraph", "ray"]
