"""Which of its argument forms a graph call was given, Conveyor's or Quokka's, and its arguments in Conveyor's.

`TaskGraph.new_input_csv` and its task nodes take both: Quokka's positional forms (bucket and key;
streams, datasets, functionObject, ip_to_num_channel) for code written for Quokka, Conveyor's for
the rest. Each call is told apart by its arguments alone, then read as Conveyor's form.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from .channels import PartitionKey
from .dataset import Dataset
from .errors import GraphError
from .filesystems import bucket_path
from .layout import CSV_STRIDE_BYTES
from .nodes import BatchFunc, ExecutorSource, NodeRef
from .placement import LOCALHOST, Parallelism


def csv_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a CSV input in Conveyor's form, from either form."""
    # names is a list: a string or path second is Quokka's key
    if "bucket" in kwargs or "key" in kwargs or (len(args) > 1 and isinstance(args[1], (str, os.PathLike))):
        return (), _quokka_csv(*args, **kwargs)
    return args, kwargs


def _quokka_csv(
    bucket: str | os.PathLike[str],
    key: str | os.PathLike[str],
    names: Sequence[str | None],
    parallelism: Parallelism,
    ip: str = LOCALHOST,
    batch_func: BatchFunc | None = None,
    sep: str = ",",
    dependents: Sequence[NodeRef] = (),
    stride: int = CSV_STRIDE_BYTES,
    *,
    columns: Sequence[str] | None = None,
    name: str | None = None,
    batch_format: str = "pandas",
    header: bool = False,
) -> dict[str, Any]:
    """Quokka's new_input_csv arguments, as the keywords of Conveyor's form."""
    path = bucket_path(_fspath(bucket), _fspath(key), "new_input_csv")
    return {
        "path": path,
        "names": names,
        "parallelism": parallelism,
        "ip": ip,
        "batch_func": batch_func,
        "sep": sep,
        "dependents": dependents,
        "stride": stride,
        "columns": columns,
        "name": name,
        "s3_here": True,
        "batch_format": batch_format,
        "header": header,
    }


def _fspath(p: object) -> object:
    """A path object as its string; anything else as it is (checked where it is used)."""
    return os.fspath(p) if isinstance(p, os.PathLike) else p


def _quokka_node(
    streams: Mapping[Hashable, NodeRef | Dataset],
    datasets: object,
    functionObject: ExecutorSource,
    ip_to_num_channel: Parallelism,
    partition_key: Mapping[Hashable, PartitionKey],
    ckpt_interval: object = None,
    *,
    name: str | None = None,
) -> tuple[Any, ...]:
    """Quokka's (streams, datasets, functionObject, ip_to_num_channel, partition_key) node form, as Conveyor's arguments.

    Its `datasets` (handed to the executor's `initialize`) must be None or empty: a Dataset is read
    as a stream instead (a source of the node, or new_input_from_dataset). A later Quokka's
    `ckpt_interval` (its checkpoints) is taken and has no use: Spark retries tasks instead.
    """
    if datasets:
        raise GraphError(
            "a task node's datasets argument is not supported: give each Dataset as a source stream of the "
            "node ({stream id: dataset}), or read it with new_input_from_dataset()"
        )
    return streams, functionObject, ip_to_num_channel, partition_key, name, LOCALHOST


_QUOKKA_ONLY = frozenset({"streams", "datasets", "functionObject", "ip_to_num_channel", "ckpt_interval"})


def node_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """(sources, executor, parallelism, partition_key, name, ip) of a task node, from either form.

    Conveyor's form `(sources, executor, parallelism, partition_key, *, name, ip)` or Quokka's
    five-argument one (five positional arguments or more, a keyword only Quokka's form has, or a
    second argument that is None or a list: Quokka's `datasets`, where Conveyor's form has the
    executor).
    """
    if (
        len(args) >= 5
        or kwargs.keys() & _QUOKKA_ONLY
        or (len(args) > 1 and (args[1] is None or isinstance(args[1], list | tuple)))
    ):
        return _quokka_node(*args, **kwargs)
    return _conveyor_node(*args, **kwargs)


def _conveyor_node(
    sources: Mapping[Hashable, NodeRef | Dataset],
    executor: ExecutorSource,
    parallelism: Parallelism,
    partition_key: Mapping[Hashable, PartitionKey],
    *,
    name: str | None = None,
    ip: str = LOCALHOST,
) -> tuple[Any, ...]:
    return sources, executor, parallelism, partition_key, name, ip
