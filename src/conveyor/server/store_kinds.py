"""Store kinds: the kinds of store a server can keep a queue in, by name, and how each is opened.

A queue is declared with a kind by name (`declare(queue, kind=...)`; the default is the server's:
`durable` with a data dir, `transient` without). The name is what travels on the wire, what a
queue's settings say (`QueueInfo.kind`, and `queue.json` on disk), and the key to a `StoreKind`
here, whose factory opens the queue's store. The server uses the store through the `Store`
interface only, so a new kind of store is a `StoreKind` given to `register`: no change to the
protocol or to the server. A store kept elsewhere proves itself against the store contract first
(`conveyor.testing.StoreContract`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from conveyor.constants import ERR_BAD_ARGUMENT, STORE_DURABLE, STORE_TRANSIENT
from conveyor.errors import RequestError
from conveyor.storage import DurableStore, MemoryStore, Store
from conveyor.storage.durable import FsyncPolicy
from conveyor.storage.space import SpaceReserve

_NAME = re.compile(r"[a-z][a-z0-9_\-]{0,63}")


@dataclass(frozen=True, slots=True)
class StoreOpening:
    """What a kind's factory is given to open the store of one queue (new or existing)."""

    queue: str
    max_attempts: int
    lease_s: float
    path: Path | None  # for a kind kept on disk, the queue's directory under the data dir (it exists); else None
    fsync: FsyncPolicy | None  # the queue's fsync policy, for a kind kept on disk; else None
    repair: bool  # keep what is intact of damaged files, rather than refuse them (`--repair`)
    space: SpaceReserve | None  # the data dir's disk reserve (see `conveyor.storage.space`), if any


@dataclass(frozen=True, slots=True)
class StoreKind:
    """One kind of store: its name, and how a server opens a queue's store of that kind.

    on_disk: its stores keep their files in their queue's directory under the server's data dir.
    A server without a data dir refuses the kind; the queue's settings are kept beside its files
    and it is reopened when the server restarts; it takes an fsync policy, its idempotency keys are
    kept on disk too, and it counts in the server's descriptor budget: one descriptor (its lock)
    while it exists, and at most `queues.FDS_PER_OPEN_QUEUE` - 1 more while in use, which
    `Store.suspend` lets go of. With fsync="batch" the server calls `Store.sync` (from another
    thread) before it answers a write, so that one fsync covers many operations.
    """

    name: str
    open: Callable[[StoreOpening], Store]
    on_disk: bool


def _open_transient(o: StoreOpening) -> Store:
    return MemoryStore(o.queue, max_attempts=o.max_attempts, lease_s=o.lease_s)


def _open_durable(o: StoreOpening) -> Store:
    if o.path is None or o.fsync is None:
        raise ValueError(f"queue {o.queue!r}: a durable store needs a directory and an fsync policy")
    return DurableStore(
        o.path,
        fsync=o.fsync,
        queue=o.queue,
        max_attempts=o.max_attempts,
        lease_s=o.lease_s,
        repair=o.repair,
        group_commit=True,  # the server syncs before it answers (see `StoreKind`)
        space=o.space,
    )


_KINDS: dict[str, StoreKind] = {}


def register(kind: StoreKind) -> None:
    """Make `kind` known to every server of this process, under its name (one kind per name)."""
    if type(kind.name) is not str or not _NAME.fullmatch(kind.name):
        raise ValueError(f"bad store kind name {kind.name!r}: use 1-64 lower-case letters, digits, '_' or '-'")
    have = _KINDS.get(kind.name)
    if have is not None and have != kind:
        raise ValueError(f"a store kind named {kind.name!r} is registered already (unregister it first)")
    _KINDS[kind.name] = kind


def unregister(name: str) -> None:
    """Forget the kind named `name` (queues of that kind already open stay as they are)."""
    _KINDS.pop(name, None)


def known() -> Mapping[str, StoreKind]:
    """The kinds registered in this process, by name."""
    return _KINDS


def kind_named(name: str, queue: str) -> StoreKind:
    """The kind named `name`, or a `bad-argument` error naming the kinds there are."""
    kind = _KINDS.get(name) if type(name) is str else None
    if kind is None:
        raise RequestError(
            ERR_BAD_ARGUMENT,
            f"queue {queue!r}: unknown store kind {name!r:.80}: this server knows {', '.join(map(repr, sorted(_KINDS)))}",
        )
    return kind


register(StoreKind(STORE_TRANSIENT, _open_transient, on_disk=False))
register(StoreKind(STORE_DURABLE, _open_durable, on_disk=True))
