"""Quokka's runtime API of 2022, with Quokka's semantics, on Conveyor's TaskGraph (docs/migrating-from-quokka.md).

A Quokka program of 2022 moves by changing its import lines (and dropping its Ray and Redis setup):

    from pyquokka.quokka_runtime import TaskGraph  ->  from conveyor.compat.quokka.quokka_runtime import TaskGraph
    from pyquokka.sql import AggExecutor           ->  from conveyor.compat.quokka.sql import AggExecutor
    from pyquokka.executors import ...             ->  from conveyor.compat.quokka.executors import ...
    from pyquokka.dataset import InputCSVDataset   ->  from conveyor.compat.quokka.dataset import InputCSVDataset
    from pyquokka.utils import LocalCluster        ->  from conveyor.compat.quokka.utils import LocalCluster
    import ray                                     ->  from conveyor.compat.quokka import ray

Modules: `quokka_runtime` (TaskGraph, Dataset, the executor adapter), `partitions` (Quokka's
partition keys), `dataset` (its input datasets), `executors` (its stock executors; `sql` is their
spring 2022 module name), `frames` (the batch types), `utils` (LocalCluster), `ray` (`ray.get`).
`conveyor.TaskGraph` is Conveyor's own TaskGraph, one batch per call, Arrow or pandas batches.
It needs the `spark` extra; Quokka's programs on polars frames need the `quokka` extra (polars too).
"""

from __future__ import annotations

from conveyor.extras import SPARK, require

require(SPARK, "conveyor.compat.quokka")

from . import ray
from .context import QuokkaContext
from .quokka_runtime import Dataset, TaskGraph
from .utils import LocalCluster

__all__ = ["Dataset", "LocalCluster", "QuokkaContext", "TaskGraph", "ray"]
