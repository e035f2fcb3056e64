"""Spark resources for the consumers (`resources={"gpu": 1}`): their tasks' resource profile, and what each was given.

Consumers given `resources` run as Spark tasks under a task resource profile (Spark's stage-level
scheduling): each takes `spark.task.cpus` CPUs and `amount` of each resource named, so consumers
run only on executors that hold those resources, as many at once as the resources allow, and
Spark gives each its own addresses. Spark schedules such a profile on a cluster (standalone, YARN,
Kubernetes) with dynamic allocation off, on the application's executors: they hold a resource when
the application asks for it (`spark.executor.resource.<name>.amount`), and a standalone master
starts them only on workers that have it (`spark.worker.resource.<name>.amount` and a discovery
script). The rest of the application (the input read, the read-back) runs on those executors too.

Inside a consumer, `task_resources()` gives the addresses its task was given, in thread and process
mode alike: they travel in the environment, which the consumer's processes inherit. A "gpu" also
sets `CUDA_VISIBLE_DEVICES`, for libraries that start CUDA after the consumer starts.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from conveyor.spark.cluster import is_local
from conveyor.spark.session import conf

if TYPE_CHECKING:
    from pyspark import TaskContext
    from pyspark.resource import ResourceProfile
    from pyspark.sql import SparkSession

RESOURCES_ENV = "CONVEYOR_TASK_RESOURCES"  # a consumer's resource addresses, as JSON {name: [address, ...]}
CUDA_ENV = "CUDA_VISIBLE_DEVICES"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")


def check_resources(entry: str, resources: Mapping[str, float] | None) -> dict[str, float]:
    """`resources` checked: names of Spark resources, each with an amount per consumer (a fraction below 1, or whole)."""
    if resources is None:
        return {}
    if not isinstance(resources, Mapping) or not resources:
        raise ValueError(f"{entry}: resources must be a non-empty mapping of resource names to amounts, got {resources!r:.80}")
    out: dict[str, float] = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name == "cpus":
            raise ValueError(
                f"{entry}: resources: {name!r:.80} is not a Spark resource name (letters, digits, '_', '.', '-'; "
                "a consumer's CPUs are spark.task.cpus)"
            )
        if type(amount) not in (int, float) or not (0 < amount < 1 or (amount >= 1 and float(amount).is_integer())):
            raise ValueError(
                f"{entry}: resources[{name!r}] must be a fraction below 1 (consumers sharing one) or a whole number, "
                f"got {amount!r:.80}"
            )
        out[name] = float(amount)
    return out


def consumer_profile(spark: SparkSession, entry: str, resources: dict[str, float]) -> ResourceProfile | None:
    """The task resource profile of consumers that each take `resources` (None for none), checked against the executors'."""
    if not resources:
        return None
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    if is_local(spark):
        raise ValueError(
            f"{entry}: resources={resources} needs a Spark cluster (standalone, YARN or Kubernetes): local mode "
            "schedules no task resources"
        )
    if conf(spark, "spark.dynamicAllocation.enabled", "false").lower() == "true":
        raise ValueError(
            f"{entry}: resources= runs the consumers on the application's own executors, which needs "
            "spark.dynamicAllocation.enabled=false"
        )
    for name, amount in resources.items():
        held = conf(spark, f"spark.executor.resource.{name}.amount", "")
        if not held:
            raise ValueError(
                f"{entry}: resources: no executor holds {name!r}: start the application with "
                f"spark.executor.resource.{name}.amount (on a standalone cluster, its workers with "
                f"spark.worker.resource.{name}.amount and spark.worker.resource.{name}.discoveryScript)"
            )
        if float(held) < amount:
            raise ValueError(f"{entry}: resources: a consumer takes {amount:g} {name!r} but an executor holds {held}")
    requests = TaskResourceRequests().cpus(int(conf(spark, "spark.task.cpus", "1")))
    for name, amount in resources.items():
        requests = requests.resource(name, amount)
    return ResourceProfileBuilder().require(requests).build


def profile_slots(spark: SparkSession, profile: ResourceProfile) -> int:
    """The consumer tasks under `profile` that can run at once now (0: no executor yet)."""
    sc: Any = spark.sparkContext._jsc.sc()
    java = profile._java_resource_profile
    sc.resourceProfileManager().addResourceProfile(java)  # known to the scheduler before its first stage
    return int(sc.maxNumConcurrentTasks(java))


@contextmanager
def given_resources(context: TaskContext) -> Iterator[dict[str, list[str]]]:
    """While a consumer runs in a Spark task: the task's resource addresses in its environment (see `task_resources`)."""
    given = {name: list(info.addresses) for name, info in context.resources().items()}
    if not given:
        yield given
        return
    before = {k: os.environ.get(k) for k in (RESOURCES_ENV, CUDA_ENV)}
    os.environ[RESOURCES_ENV] = json.dumps(given)
    if "gpu" in given:
        os.environ[CUDA_ENV] = ",".join(given["gpu"])
    try:
        yield given
    finally:  # Spark reuses the Python worker for other tasks
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def task_resources() -> dict[str, tuple[str, ...]]:
    """The addresses of each resource the consumer running this call was given (`resources=`); empty elsewhere.

    In a function run by `conveyor.spark.map` or `map_batches` with `resources={"gpu": 1}`, say,
    `task_resources()["gpu"]` is the consumer's GPU, in thread and process mode alike.
    """
    raw = os.environ.get(RESOURCES_ENV)
    return {name: tuple(addresses) for name, addresses in json.loads(raw).items()} if raw else {}
