"""`ray.get`, for Quokka programs of spring 2022 that read results with `ray.get(dataset.to_pandas.remote())`.

Their Datasets were Ray actors; the compat's methods answer `.remote()` with the value itself, so
`get` returns what it is given. Ray's setup lines (`ray.init`) are removed when moving to Conveyor.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def get(value: T) -> T:
    """The value itself (a list of values too): nothing here is a Ray object reference."""
    return value


__all__ = ["get"]
