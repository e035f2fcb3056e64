"""What a queue server hosts: named queues (each a store of some kind), their settings, and its blobs.

A queue's store is opened by the factory of its kind (`store_kinds`) and used through the `Store`
interface only; its kind says whether it lives under the data dir (see `StoreKind.on_disk`).

Everything here runs on the server's event loop thread except `Store.sync`, which group commit
runs in a worker thread so that one fsync covers every operation written before it started.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from conveyor.constants import (
    BLOB_DIR,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DROPPING_PREFIX,
    ERR_BAD_ARGUMENT,
    ERR_NO_QUEUE,
    ERR_QUEUE_CONFLICT,
    ERR_UNAVAILABLE,
    ID_FLOOR_NAME,
    MAX_CONSUMER_CHARS,
    MAX_LEASE_S,
    QUEUE_CONFIG_NAME,
    QUEUE_NAME_PATTERN,
    QUEUES_DIR,
    SERVER_LOCK_NAME,
    SPACE_RESERVE_NAME,
    STORE_DURABLE,
    STORE_TRANSIENT,
    TASK_LABELS,
    WORKER_GONE_S,
)
from conveyor.errors import ConveyorError, RequestError, StoreError
from conveyor.protocol.report import SEEN, Counts
from conveyor.protocol.requests import QueueInfo, QueueStats
from conveyor.server.blobs import Blobs
from conveyor.server.group_commit import GroupCommit
from conveyor.server.idempotency import Dedupe
from conveyor.server.store_kinds import StoreKind, StoreOpening, kind_named, known
from conveyor.server.task_records import TaskRecords
from conveyor.server.task_tallies import TaskTallies
from conveyor.server.wakeups import Wakeup
from conveyor.storage import Store
from conveyor.storage.durable import FsyncPolicy
from conveyor.storage.files import fsync_dir, keep_aside, store_error, write_atomically
from conveyor.storage.segments import MAX_MAPS
from conveyor.storage.space import SpaceReserve

log = logging.getLogger("conveyor.server.queue_server")

_QUEUE_NAME = re.compile(QUEUE_NAME_PATTERN)
_FSYNC = ("batch", "interval", "never")
FLOOR_AHEAD = 1 << 20  # ids the floor on disk is kept ahead of the one in use (a restart skips at most these)
RATE_WINDOW = 10  # samples (one a second) behind the rates in stats
MAX_WORKERS = 10_000
# a queue kept on disk, in use: its idempotency keys and its store's files (a durable store: its
# newest segment, index and mapped segments); besides, each holds its lock while it exists
FDS_PER_OPEN_QUEUE = 3 + MAX_MAPS


@dataclass
class HostedQueue:
    """One named queue: its settings, its store, and what the server tracks about it."""

    info: QueueInfo
    kind: StoreKind  # of its store (`info.kind` names it)
    store: Store
    commit: GroupCommit | None  # for queues kept on disk with fsync="batch"
    dedupe: Dedupe
    tasks: TaskRecords  # its deliveries running and the last ones settled
    changed: Wakeup = field(default_factory=Wakeup)
    samples: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW + 1))
    dropped: bool = False  # requests waiting on it when it is dropped answer at once
    wakes: int = 0  # how many `wake`s it had: a tied get waiting through one answers at once
    woken_until: float = 0.0  # event-loop time until which a new tied get does not wait (see handlers.WAKE_HOLD_S)
    woken: set[int] = field(default_factory=set)  # the connections answered `woken` since the last wake

    async def durable(self) -> None:
        """Wait until everything written so far is durable under the queue's fsync policy."""
        if self.commit is not None:
            await self.commit.durable(self.commit.wrote())

    async def settled(self) -> None:
        """Wait until no fsync of the queue's files is under way or due (writes made so far durable)."""
        if self.commit is not None:
            await self.commit.settled()

    def sample(self, now: float) -> None:
        self.samples.append((now, self.store.totals.put, self.store.totals.acked))

    def suspend(self) -> bool:
        """Let go of the queue's file descriptors but its lock, until it next reads or writes.

        Let go of the queue's file descriptors but its lock, until it next reads or writes; False
        (nothing done) while it has writes its fsync policy has yet to sync (closing would sync them
        on the event loop).
        """
        never = self.info.fsync == "never"  # its writes are left to the OS: nothing to wait for
        if (self.dedupe.dirty and not never) or not self.store.suspend():
            return False
        self.dedupe.close(sync=not never)
        return True

    def stats(self) -> QueueStats:
        s = self.store.stats()
        put_rate = ack_rate = 0.0
        if len(self.samples) >= 2:
            (t0, p0, a0), (t1, p1, a1) = self.samples[0], self.samples[-1]
            if t1 > t0:
                put_rate, ack_rate = (p1 - p0) / (t1 - t0), (a1 - a0) / (t1 - t0)
        return QueueStats(self.info.name, s.ready, s.delivered, s.delayed, s.acked, s.failed, s.bytes_on_disk, put_rate, ack_rate)


@dataclass(frozen=True, slots=True)
class Defaults:
    """Settings of queues declared without them."""

    kind: str | None = None  # None: STORE_DURABLE on a server with a data dir, else STORE_TRANSIENT
    lease_s: float = DEFAULT_LEASE_S
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    fsync: str = "batch"


class QueueHost:
    """The named queues of one server, created on first use or by `declare`, reopened on restart."""

    def __init__(
        self,
        data_dir: Path | None,
        defaults: Defaults,
        repair: bool = False,
        fd_budget: int | None = None,
        task_labels: int = TASK_LABELS,
    ) -> None:
        """fd_budget: descriptors the queues kept on disk may hold in all (None: no limit).

        Each holds one (its lock) while it exists, and FDS_PER_OPEN_QUEUE more while in use: the
        least recently used let go of theirs when the rest would not fit, and one beyond the budget
        is refused. `task_labels`: the task names the metrics label (`TaskTallies`).
        """
        self.data_dir = data_dir
        self.queue_dir = None if data_dir is None else data_dir / QUEUES_DIR
        if defaults.kind is None:
            defaults = replace(defaults, kind=STORE_TRANSIENT if data_dir is None else STORE_DURABLE)
        self.defaults = defaults
        self.repair = repair
        self.queues: dict[str, HostedQueue] = {}
        self.unavailable: dict[str, str] = {}  # queue -> why its store could not be opened
        self.closing = False  # set when the server stops: long polls return at once
        self.settled = Wakeup()  # messages left the pending count (acked, failed for good, purged)
        self.tallies = TaskTallies(task_labels)  # every queue's settled deliveries, per task name
        self._workers: dict[str, tuple[float, Counts]] = {}  # worker -> (when, monotonic; counts)
        self.blobs = Blobs(None if data_dir is None else data_dir / BLOB_DIR)
        self.id_floor = 1  # new queues start here: above every id a dropped queue used
        self._floor_kept = 1  # the floor on disk, ahead of id_floor (a restart starts there)
        self.space: SpaceReserve | None = None  # disk space held back for a full disk (see conveyor.storage.space)
        self.fd_budget = fd_budget
        self._files_open: OrderedDict[str, HostedQueue] = OrderedDict()  # queues with files open, oldest use first
        self._on_disk = 0  # queues kept on disk open here (each holds its lock)
        self._lock_fd = -1
        if data_dir is not None:
            data_dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(data_dir / SERVER_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._lock_fd)
                raise ConveyorError(f"{data_dir} is in use by another server") from None
            self.id_floor = self._floor_kept = _read_floor(data_dir / ID_FLOOR_NAME)
            self.space = SpaceReserve(data_dir / SPACE_RESERVE_NAME)
            self._open_existing()

    def _open_existing(self) -> None:
        assert self.queue_dir is not None
        for left in self.queue_dir.glob(f"{DROPPING_PREFIX}*"):  # a drop the server did not finish
            shutil.rmtree(left, ignore_errors=True)
        for conf in sorted(self.queue_dir.glob(f"*/{QUEUE_CONFIG_NAME}")):
            name = conf.parent.name
            if name.startswith(DROPPING_PREFIX):
                continue
            try:
                self.queues[name] = q = self._open(self._read_info(conf))
                self.touch(q)
            except Exception as e:  # one damaged queue must not take the others down
                repair = "" if isinstance(e, OlderSettings) else " (restart the server with --repair to keep what is intact)"
                self.unavailable[name] = f"queue {name!r} could not be opened: {e}{repair}"
                log.error("%s", self.unavailable[name])
        if self.queues:
            log.info("reopened %d queue(s): %s", len(self.queues), ", ".join(self.queues))

    def _read_info(self, conf: Path) -> QueueInfo:
        """The settings of a queue kept on disk; with --repair, the server's defaults in place of a damaged file.

        A kind this server does not know is no damage, nor is a file written by an older build: the
        queue stays unavailable, its files as they are.
        """
        name = conf.parent.name
        try:
            info = QueueInfo(**_settings(conf, json.loads(conf.read_text())))
            if info.name != name or not kind_named(info.kind, name).on_disk:
                raise ValueError(f"it names {'queue ' + repr(info.name) if info.name != name else 'a queue not kept on disk'}")
            if type(info.lease_s) in (int, float) and info.lease_s > MAX_LEASE_S:  # declared before leases had a limit
                log.warning("queue %r: its lease of %g s is over the limit: served with %g s", name, info.lease_s, MAX_LEASE_S)
                info = replace(info, lease_s=MAX_LEASE_S)
            return info
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            if not self.repair:
                raise ConveyorError(f"{conf} is damaged ({type(e).__name__}: {e})") from None
            d = self.defaults
            info = QueueInfo(name, STORE_DURABLE, float(d.lease_s), int(d.max_attempts), d.fsync)
            aside = keep_aside(conf)
            write_atomically(conf, json.dumps(asdict(info)).encode())
            log.warning(
                "%s was damaged (%s: %s): queue %r reopened with the server's defaults %s; original kept as %s",
                conf,
                type(e).__name__,
                e,
                name,
                info,
                aside.name,
            )
            return info

    def _open(self, info: QueueInfo) -> HostedQueue:
        kind = kind_named(info.kind, info.name)
        if not kind.on_disk:
            store = kind.open(StoreOpening(info.name, info.max_attempts, info.lease_s, None, None, self.repair, None))
            return HostedQueue(info, kind, store, None, Dedupe(None), TaskRecords(info.name, self.tallies))
        assert self.queue_dir is not None and info.fsync is not None
        if self.fd_budget is not None and self._on_disk + 1 + FDS_PER_OPEN_QUEUE > self.fd_budget:
            raise StoreError(
                f"queue {info.name!r}: this server holds {self._on_disk:,} queues on disk, as many as its "
                f"descriptor limit allows ({self.fd_budget:,} for queues: ulimit -n less the connections "
                "it takes): raise the limit (ulimit -n), lower --max-connections, or drop queues"
            )
        path = self.queue_dir / info.name
        path.mkdir(parents=True, exist_ok=True)
        fsync = cast(FsyncPolicy, info.fsync)  # one of _FSYNC: checked by `declare`, or read from its own file
        store = kind.open(StoreOpening(info.name, info.max_attempts, info.lease_s, path, fsync, self.repair, self.space))
        try:
            dedupe = Dedupe(path)
            store.keep_ids_past(dedupe.highest)  # keys written before their messages name ids too
        except BaseException:  # (a Dedupe holds no descriptor until a key is added)
            store.close()
            raise
        # keys before messages, as they are written (see handlers._put_once)
        commit = GroupCommit(dedupe.sync, store.sync) if info.fsync == "batch" else None
        self._on_disk += 1
        return HostedQueue(info, kind, store, commit, dedupe, TaskRecords(info.name, self.tallies))

    def touch(self, q: HostedQueue) -> None:
        """`q` is in use: it keeps its files open.

        `q` is in use: it keeps its files open, and the least recently used queues let go of theirs
        while all would not fit in the descriptor budget.
        """
        if self.fd_budget is None or not q.kind.on_disk:
            return
        self._files_open[q.info.name] = q
        self._files_open.move_to_end(q.info.name)
        room = max(1, (self.fd_budget - self._on_disk) // FDS_PER_OPEN_QUEUE)
        while len(self._files_open) > room:
            _, old = self._files_open.popitem(last=False)
            if not old.suspend():  # writes not synced yet: let go of it at a later touch
                self._files_open[old.info.name] = old
                self._files_open.move_to_end(old.info.name, last=False)
                break

    def get(self, name: str, create: bool = False) -> HostedQueue:
        q = self.queues.get(name)
        if q is not None:
            self.touch(q)
            return q
        if name in self.unavailable:
            why = self.unavailable[name]
            raise RequestError(ERR_UNAVAILABLE, why)
        if not create:
            _check_name(name)
            raise RequestError(ERR_NO_QUEUE, f"no queue named {name!r} on this server")
        return self.declare(name)

    def declare(
        self,
        name: str,
        kind: str | None = None,
        lease_s: float | None = None,
        max_attempts: int | None = None,
        fsync: str | None = None,
    ) -> HostedQueue:
        """The queue `name`, made with these settings (None: the server's default) unless it exists.

        An existing queue must have the settings given: else a `queue-conflict` error.
        """
        _check_name(name)
        d = self.defaults
        assert d.kind is not None  # set by __init__
        chosen = kind_named(d.kind if kind is None else kind, name)
        on_disk = chosen.on_disk
        if on_disk and self.data_dir is None:
            raise RequestError(
                ERR_BAD_ARGUMENT,
                f"queue {name!r}: a {chosen.name} queue is kept on disk, and this server has no --data-dir: "
                f"{', '.join(k.name for k in known().values() if not k.on_disk)} queues only",
            )
        if fsync is not None and fsync not in _FSYNC:
            raise RequestError(ERR_BAD_ARGUMENT, f"queue {name!r}: fsync must be one of {', '.join(_FSYNC)}, got {fsync!r}")
        info = QueueInfo(
            name,
            chosen.name,
            float(d.lease_s if lease_s is None else lease_s),
            int(d.max_attempts if max_attempts is None else max_attempts),
            (d.fsync if fsync is None else fsync) if on_disk else None,
        )
        q = self.queues.get(name)
        if q is not None:
            asked = {"kind": chosen.name, "lease_s": lease_s, "max_attempts": max_attempts, "fsync": fsync}
            have = asdict(q.info)
            diff = [f"{k}={have[k]!r} (asked {v!r})" for k, v in asked.items() if v is not None and v != have[k]]
            if diff:
                raise RequestError(ERR_QUEUE_CONFLICT, f"queue {name!r} exists with {', '.join(diff)}")
            self.touch(q)
            return q
        try:
            q = self._open(info)
        except ValueError as e:
            raise RequestError(ERR_BAD_ARGUMENT, f"queue {name!r}: {e}") from None
        except OSError as e:
            raise store_error(e, f"queue {name!r}") from e
        try:
            if q.store.next_id < self.id_floor:  # a new queue (an existing store has its own ids)
                q.store.skip_ids(self.id_floor)
            if on_disk:
                assert self.queue_dir is not None
                write_atomically(self.queue_dir / name / QUEUE_CONFIG_NAME, json.dumps(asdict(info)).encode())
        except BaseException as e:  # not declared: close it, so that a retry can open it again
            self._on_disk -= on_disk
            q.store.close()
            q.dedupe.close()
            if isinstance(e, OSError):
                raise store_error(e, f"queue {name!r}") from e
            raise
        self.queues[name] = q
        self.touch(q)
        log.info("declared queue %s", info)
        return q

    def drop(self, name: str) -> tuple[bool, Path | None]:
        """Remove a queue with everything in it (messages, results, dead letters, keys).

        Returns whether there was one, and the directory left to delete (renamed so that it is no
        queue).

        Its ids are never used again here: an ack or lease extension meant for one of its messages
        cannot touch a message of a queue made later under the same name.
        """
        q = self.queues.get(name)
        if q is None:
            if name in self.unavailable:
                why = "it cannot be dropped while its ids are unknown (repair it, or stop the server and remove its directory)"
                raise RequestError(ERR_UNAVAILABLE, f"{self.unavailable[name]}; {why}")
            _check_name(name)
            return False, None
        self.id_floor = max(self.id_floor, q.store.next_id)
        if self.id_floor > self._floor_kept and self.data_dir is not None:
            # first: a crash midway leaves the queue whole, never an id to reuse. Kept FLOOR_AHEAD ids
            # ahead, so that most drops need no write (two fsyncs, ~10 ms each after a job's writes)
            ahead = self.id_floor + FLOOR_AHEAD
            write_atomically(self.data_dir / ID_FLOOR_NAME, json.dumps({"next_id": ahead}).encode())
            self._floor_kept = ahead
        trash = None
        if q.kind.on_disk:  # renamed first: if that fails, the queue is still served as it was
            assert self.queue_dir is not None
            trash = self.queue_dir / f"{DROPPING_PREFIX}{uuid.uuid4().hex[:12]}-{name}"
            try:
                os.replace(self.queue_dir / name, trash)
            except OSError as e:
                raise StoreError(f"could not drop queue {name!r}: {e}") from e
            if q.info.fsync != "never":  # a queue whose writes are left to the OS: so is its drop
                with contextlib.suppress(OSError):  # else a crash may bring the queue back: as one before the rename
                    fsync_dir(self.queue_dir)
        del self.queues[name]
        self._files_open.pop(name, None)
        self._on_disk -= q.kind.on_disk
        q.dropped = True
        q.changed.notify()
        self.settled.notify()  # its pending messages are gone: a join may be over
        q.store.close()
        q.dedupe.close()
        log.info("dropped queue %s", name)
        return True, trash

    def report(self, worker: str, counts: Counts) -> None:
        self._workers[worker[:MAX_CONSUMER_CHARS]] = (time.monotonic(), counts)
        if len(self._workers) > MAX_WORKERS:  # forget the longest silent
            del self._workers[min(self._workers, key=lambda w: self._workers[w][0])]

    def workers(self) -> dict[str, Counts]:
        """Counts of the consumers heard from within WORKER_GONE_S, with `seen` seconds ago."""
        now = time.monotonic()  # not the wall clock: a step of it would keep a dead consumer listed, or drop a live one
        return {w: {**c, SEEN: now - t} for w, (t, c) in self._workers.items() if now - t <= WORKER_GONE_S}

    def sample(self) -> None:
        now = time.monotonic()
        for q in self.queues.values():
            q.sample(now)

    def close(self) -> None:
        for q in self.queues.values():
            try:
                q.store.close()
                q.dedupe.close()
            except Exception:
                log.exception("closing queue %s", q.info.name)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def _check_name(name: str) -> None:
    if type(name) is not str or not _QUEUE_NAME.fullmatch(name):
        raise RequestError(
            ERR_BAD_ARGUMENT,
            f"bad queue name {name!r:.80}: use 1-128 letters, digits, '_', '.' or '-', not starting with '.' or '-'",
        )


class OlderSettings(ConveyorError):
    """A `queue.json` written by an older build: not damaged, so --repair leaves it as it is."""


def _settings(conf: Path, raw: object) -> dict[str, Any]:
    """The fields of the `queue.json` `conf` as `QueueInfo` takes them (a ValueError if it holds no map).

    One from before store kinds says `"durable"` where it now says its kind: no release wrote one,
    so it is not read, and rather than reset its settings to the defaults (as --repair does to a
    damaged file) the server says how to change it.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"it holds {type(raw).__name__}, not a map of settings")
    if "durable" in raw and "kind" not in raw:
        raise OlderSettings(
            f'{conf} was written by an older build of conveyor: it says "durable": {json.dumps(raw["durable"])} '
            'where this build reads the store kind. Put "kind": "durable" in its place (the kind of a queue kept '
            "on disk) and restart the server; --repair leaves the file as it is"
        )
    return raw


def _read_floor(path: Path) -> int:
    if not path.exists():
        return 1
    try:
        return int(json.loads(path.read_text())["next_id"])
    except (ValueError, KeyError, TypeError) as e:
        raise ConveyorError(
            f"{path} is damaged ({type(e).__name__}: {e}); it holds the first message id a new "
            'queue may use, as {"next_id": <integer>}'
        ) from None
