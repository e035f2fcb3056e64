"""`conveyor demo`: the seed problem, end to end on the embedded default.

A synthetic corpus ("documents": 1-200 pages each, heavy-tailed, per-page cost varying widely,
listed by size as batches of scans often arrive) is processed page by page twice on the same
local Spark session and the same input DataFrame:

- through `conveyor.spark.map`: pages go through the queue to consumers running as Spark tasks,
  which balance work page by page (optionally one consumer is killed midway: nothing is lost);
- with plain Spark: `mapInPandas` over the input's static partitions.

Both aggregate pages back to documents with Spark. The summary compares makespan and efficiency
(total work / (workers x makespan)). A few pages are damaged and fail every attempt: conveyor
reports them in `_error`; the plain job has to catch them itself or lose the whole job.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from conveyor.cli.corpus import busy, documents
from conveyor.client.pool import QueuePool
from conveyor.spark import mapping
from conveyor.spark.embedded import local

PAGE_SCHEMA = "doc long, page long, words long, seconds double"
DAMAGED_EVERY = 997  # one page in this many is damaged: it fails every attempt
INPUT_PARTITIONS = 4  # the input DataFrame's partitions (documents in order, as files often come)


@dataclass
class Run:
    name: str
    pages: int
    documents: int
    failed: int
    work_s: float
    makespan_s: float
    workers: int
    note: str = ""

    @property
    def efficiency(self) -> float:
        return self.work_s / (self.workers * self.makespan_s)


def process_page(row: dict[str, Any]) -> dict[str, Any]:
    """The per-page work: CPU for the page's cost; a damaged page raises."""
    if row["damaged"]:
        raise ValueError(f"page {row['page']} of document {row['doc']} is damaged")
    seconds = busy(row["cost"])
    return {"doc": row["doc"], "page": row["page"], "words": 250 + (row["page"] * 7919) % 500, "seconds": seconds}


def _pages_frame(spark: Any, n_pages: int, scale: float) -> tuple[Any, float, int]:
    """The corpus as a DataFrame of pages over INPUT_PARTITIONS partitions, documents in order of
    size (as batches of scans often arrive: the big ones together); with the work it holds
    (seconds of CPU) and how many pages are damaged."""
    sizes, costs = documents(n_pages)
    docs, k = [], 0
    for size in sizes:
        docs.append(costs[k : k + size])
        k += size
    docs.sort(key=sum)
    rows, k, work, damaged = [], 0, 0.0, 0
    for doc, pages in enumerate(docs):
        for page, cost in enumerate(pages):
            bad = (k + 1) % DAMAGED_EVERY == 0
            rows.append((doc, page, cost * scale, bad))
            work += 0.0 if bad else cost * scale
            damaged += bad
            k += 1
    frame = spark.createDataFrame(rows, "doc long, page long, cost double, damaged boolean")
    return frame.repartitionByRange(INPUT_PARTITIONS, "doc").sortWithinPartitions("doc", "page").cache(), work, damaged


def _plain(spark: Any, pages: Any, workers: int, work_s: float, console: Console) -> Run:
    """The same job with plain Spark: each static partition runs its pages in turn."""
    import pandas as pd

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for f in frames:
            out = []
            for row in f.to_dict("records"):
                try:
                    out.append(process_page(row))
                except ValueError:
                    out.append({"doc": row["doc"], "page": row["page"], "words": None, "seconds": None})
            yield pd.DataFrame(out, columns=["doc", "page", "words", "seconds"])

    t0 = time.perf_counter()
    with _SparkTasks(spark, console, "plain Spark: tasks"):
        done = pages.mapInPandas(run, PAGE_SCHEMA).cache()
        docs = done.groupBy("doc").agg({"words": "sum"}).count()
        failed = done.where("words IS NULL").count()
    makespan = time.perf_counter() - t0
    n = done.count()
    done.unpersist()
    return Run("plain Spark (mapInPandas)", n, docs, failed, work_s, makespan, workers, f"{INPUT_PARTITIONS} static partitions")


def _conveyor(spark: Any, pool: QueuePool, pages: Any, workers: int, work_s: float, kill: bool, console: Console) -> Run:
    killer = _Killer(pool, console.print) if kill else None
    if killer:
        spark.sparkContext.setLogLevel("FATAL")  # Spark logs the crash we cause with a long trace: the demo says it instead
        killer.start()
    t0 = time.perf_counter()
    try:
        done, st = mapping.map(pages, process_page, schema=PAGE_SCHEMA, n_consumers=workers, max_concurrency=8, lease_s=10.0,
                               max_retries=2, progress=console.is_terminal, stats=True)  # fmt: skip
        docs = done.where("_error IS NULL").groupBy("doc").agg({"words": "sum"}).count()
        failed = done.where("_error IS NOT NULL").count()
    finally:
        if killer:
            spark.sparkContext.setLogLevel(spark.conf.get("spark.log.level", "ERROR"))
    makespan = time.perf_counter() - t0
    note = "pages balanced a few at a time"
    note += f"; enqueue {st.enqueue_s:.1f} s, process {st.consume_s:.1f} s, read {st.read_s:.1f} s"
    if killer:
        killer.stop.set()
        note += f"; consumer pid {killer.killed} killed midway" if killer.killed else "; (no consumer to kill)"
    return Run("conveyor.spark.map", done.count(), docs, failed, work_s, makespan, workers, note)


class _SparkTasks:
    """A progress bar of the Spark tasks finished in the running stages (on a terminal only)."""

    def __init__(self, spark: Any, console: Console, description: str) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.progress = Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=console, disable=not console.is_terminal)  # fmt: skip
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, name="conveyor-demo-progress", daemon=True)

    def _poll(self) -> None:
        task = self.progress.add_task("", total=None)
        while not self.stop.wait(0.25):
            try:
                stages = [self.tracker.getStageInfo(s) for s in self.tracker.getActiveStageIds()]
            except Exception:  # the display must never fail the job
                continue
            stages = [s for s in stages if s is not None]
            if stages:
                self.progress.update(task, completed=sum(s.numCompletedTasks for s in stages),
                                     total=sum(s.numTasks for s in stages))  # fmt: skip

    def __enter__(self) -> _SparkTasks:
        self.progress.start()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.progress.stop()


class _Killer(threading.Thread):
    """Once a third of the pages are done, SIGKILL one consumer's Spark Python worker."""

    def __init__(self, pool: Any, say: Callable[[str], None]) -> None:
        super().__init__(name="conveyor-demo-killer", daemon=True)
        self.pool = pool
        self.say = say
        self.stop = threading.Event()
        self.killed: int | None = None

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                st = [s for q, s in self.pool.stats().items() if q.startswith("map-")]
            except Exception:
                continue
            if not st or st[-1].acked < (st[-1].acked + st[-1].pending) / 3:
                continue
            for name, w in self.pool.workers().items():
                if name.startswith("spark:") and w.get("running", 0) > 0:
                    self.killed = int(w["pid"])
                    os.kill(self.killed, signal.SIGKILL)
                    self.say(f"killed consumer pid {self.killed} (SIGKILL) a third of the way: Spark runs its task again, "
                             "and the pages it held come back to the queue when their leases end")  # fmt: skip
                    return


def expected_failures(pages: int) -> int:
    return pages // DAMAGED_EVERY


def run_demo(pages: int, workers: int | None, kill: bool, console: Console, scale: float = 1.0) -> list[Run]:
    """Both runs on the embedded default; returns what each did (conveyor's first)."""
    console.print("starting the embedded Spark session and queue servers ...")
    with local() as env:
        spark = env.spark
        slots = int(spark.sparkContext.defaultParallelism)
        n_workers = min(workers or slots, slots)
        if n_workers != (workers or slots):  # more would wait for a slot, and hold up the others' end
            console.print(f"--workers {workers}: local Spark has {slots} task slots on this machine; using {slots}")
        frame, work_s, damaged = _pages_frame(spark, pages, scale)
        frame.count()  # built once, before either timing
        # start the executors' Python workers, so that neither run pays for them
        spark.range(n_workers, numPartitions=n_workers).mapInArrow(lambda batches: batches, "id long").count()
        console.print(f"corpus: {pages:,} pages ({damaged} damaged), {work_s:.1f} s of work, {n_workers} workers")
        runs = [_conveyor(spark, env.pool, frame, n_workers, work_s, kill, console)]
        console.print("now the same with plain Spark ...")
        runs.append(_plain(spark, frame, n_workers, work_s, console))
    return runs


def summary_table(runs: list[Run]) -> Table:
    t = Table(title="conveyor demo: documents, page by page")
    for col in ("", *(r.name for r in runs)):
        t.add_column(col, justify="left" if not col else "right")
    rows: list[tuple[str, Callable[[Run], str]]] = [
        ("pages", lambda r: f"{r.pages:,}"),
        ("documents", lambda r: f"{r.documents:,}"),
        ("failed pages", lambda r: f"{r.failed:,}"),
        ("work (CPU)", lambda r: f"{r.work_s:.1f} s"),
        ("makespan", lambda r: f"{r.makespan_s:.1f} s"),
        ("efficiency", lambda r: f"{r.efficiency:.2f}"),
        ("", lambda r: r.note),
    ]
    for label, cell in rows:
        t.add_row(label, *(cell(r) for r in runs))
    if len(runs) == 2:
        t.caption = f"conveyor makespan / plain Spark makespan: {runs[0].makespan_s / runs[1].makespan_s:.2f}x"
        if runs[0].makespan_s > runs[1].makespan_s:
            t.caption += ("\n(a map pays a few seconds to start its consumers and read the results back; the "
                          "balancing repays it on larger corpora, such as the default 9,000 pages)")  # fmt: skip
    return t
