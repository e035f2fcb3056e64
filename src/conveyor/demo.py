"""`conveyor demo` at this stage: a workload through both stores, with a summary table.

Each store gets the same no-op workload (~100-byte payloads, batches of 1,000) with a few poison
messages that fail every attempt: the demo puts it, consumes it to the end (acking with a result,
nacking the poison), reopens the durable store to show nothing was lost, and prints what happened.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .message import Message
from .storage import DurableStore, MemoryStore, Store

BATCH = 1000


@dataclass
class Outcome:
    store: str
    messages: int
    put_rate: float
    consume_rate: float
    acked: int
    dead_letters: int
    results: int
    bytes_on_disk: int
    reopen_s: float | None


def _workload(n: int, poison_every: int) -> list[list[Message]]:
    batches = []
    for start in range(0, n, BATCH):
        batches.append([
            Message(payload=(b"P" if (i + 1) % poison_every == 0 else b"M") + b"%099d" % i, max_attempts=3)
            for i in range(start, min(start + BATCH, n))
        ])  # fmt: skip
    return batches


def _run(name: str, store: Store, batches: list[list[Message]], progress: Progress) -> tuple[float, float]:
    n = sum(map(len, batches))
    task = progress.add_task(f"{name}: put", total=n)
    t0 = time.perf_counter()
    for b in batches:
        store.put(b)
        progress.advance(task, len(b))
    put_s = time.perf_counter() - t0
    progress.update(task, description=f"{name}: consume", completed=0)
    t0 = time.perf_counter()
    while got := store.get(BATCH):
        ok = [m for m in got if m.payload[:1] != b"P"]
        bad = [m.id for m in got if m.payload[:1] == b"P"]
        store.ack_many([m.id for m in ok], [m.payload[1:9] for m in ok])
        store.nack_many(bad, ["poison message: fails every attempt"] * len(bad))
        s = store.stats()
        progress.update(task, completed=s.acked + s.failed)
    return n / put_s, n / (time.perf_counter() - t0)


def run_demo(messages: int, data_dir: Path | None, poison_every: int, console: Console) -> list[Outcome]:
    """Run the workload through a MemoryStore and a DurableStore; returns what each did."""
    batches = _workload(messages, poison_every)
    tmp = None if data_dir is not None else Path(tempfile.mkdtemp(prefix="conveyor-demo-"))
    path = (data_dir or tmp) / "demo-queue"  # type: ignore[operator]
    if path.exists():
        shutil.rmtree(path)
    outcomes = []
    try:
        with Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=console, transient=True) as progress:  # fmt: skip
            for name, make in (("MemoryStore", lambda: MemoryStore("demo")),
                               ("DurableStore", lambda: DurableStore(path, queue="demo", fsync="interval"))):  # fmt: skip
                store = make()
                reopen_s = None
                try:
                    put_rate, consume_rate = _run(name, store, batches, progress)
                    if isinstance(store, DurableStore):  # reopen: everything must still be there
                        store.close()
                        t0 = time.perf_counter()
                        store = DurableStore(path, queue="demo")
                        reopen_s = time.perf_counter() - t0
                    s = store.stats()
                    outcomes.append(Outcome(name, messages, put_rate, consume_rate, s.acked, len(store.dead_letters()),
                                            sum(1 for _ in store.results()), s.bytes_on_disk, reopen_s))  # fmt: skip
                finally:
                    store.close()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return outcomes


def summary_table(outcomes: list[Outcome]) -> Table:
    t = Table(title="conveyor demo: one workload through each queue store")
    t.add_column("")
    for o in outcomes:
        t.add_column(o.store, justify="right")
    rows = [
        ("messages", lambda o: f"{o.messages:,}"),
        ("put (msg/s)", lambda o: f"{o.put_rate:,.0f}"),
        ("get + ack (msg/s)", lambda o: f"{o.consume_rate:,.0f}"),
        ("acked", lambda o: f"{o.acked:,}"),
        ("dead letters", lambda o: f"{o.dead_letters:,}"),
        ("results kept", lambda o: f"{o.results:,}"),
        ("bytes on disk", lambda o: f"{o.bytes_on_disk:,}"),
        ("reopen", lambda o: "-" if o.reopen_s is None else f"{o.reopen_s * 1000:,.0f} ms"),
    ]
    for label, cell in rows:
        t.add_row(label, *(cell(o) for o in outcomes))
    return t
