"""Where a node's channels run: Quokka's placement arguments, as Spark takes them.

Quokka's runtime API gives a node's channels as a count (`parallelism=8`, with `ip='localhost'`)
or per machine (`{'localhost': 8}`, `{'10.0.0.1': 4, '10.0.0.2': 4}`). On Spark a channel is a
partition that the scheduler places on any executor: PySpark offers no way to pin a DataFrame
partition to a host, so the machines only add up to the number of channels. The addresses are
checked (each a non-empty string) and otherwise kept as documentation of intent.
"""

from __future__ import annotations

from collections.abc import Mapping

from .errors import GraphError

LOCALHOST = "localhost"  # Quokka's default ip: the machine the graph is built on
Parallelism = int | Mapping[str, int]  # channels: a count, or per machine


def channel_count(parallelism: object, ip: object, what: str) -> int:
    """The number of channels of `parallelism`.

    `parallelism` is an integer >= 1, or a mapping of machine address -> its channels (each >= 1);
    `ip` must be a non-empty string (Quokka's placement of an int).
    """
    if not isinstance(ip, str) or not ip:
        raise GraphError(f"{what}: ip must be a machine's address or 'localhost', got {ip!r}")
    if isinstance(parallelism, Mapping):
        if not parallelism:
            raise GraphError(f"{what}: parallelism maps no machine to channels")
        for host, n in parallelism.items():
            if not isinstance(host, str) or not host:
                raise GraphError(f"{what}: parallelism must map machine addresses (strings) to channels, got key {host!r}")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise GraphError(f"{what}: machine {host!r} must get an integer >= 1 of channels, got {n!r}")
        return sum(parallelism.values())
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        raise GraphError(
            f"{what}: parallelism must be an integer >= 1 or a mapping of machine -> channels "
            f"(e.g. {{'localhost': 4}}), got {parallelism!r}"
        )
    return parallelism
