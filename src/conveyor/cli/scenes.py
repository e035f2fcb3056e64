"""The demo's scenes: one corpus of pages, a fault in it, and the same job run two ways.

The job runs by `conveyor.spark.map` and by plain Spark (`mapInPandas` over the input's static
partitions), each measured as it ends.

A page's fault is one of: damaged (its code raises: both handle it), crash (it kills the Python
process running it, as a crash in a native library or the OOM killer does), hang (it never returns,
as a read from a peer that went silent). A scene may also kill a worker process midway.

Plain Spark is given a bounded time (`patience_s`): a job still running then is cancelled and
reported as such, so the demo never hangs.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.cli.corpus import busy, documents
from conveyor.client.pool import QueuePool
from conveyor.protocol.report import ConsumerReport
from conveyor.spark import mapping
from conveyor.worker.options import ConsumerOptions

PAGE_SCHEMA = "doc long, page long, words long, seconds double"
INPUT_SCHEMA = "doc long, page long, cost double, fault string"
DAMAGED_EVERY = 997  # one page in this many is damaged: it raises on every attempt
INPUT_PARTITIONS = 4  # the input DataFrame's partitions (documents in order, as files often come)
CRASH_EXIT = 134  # what a page that crashes exits with (as after abort(): SIGABRT's 128 + 6)
HANG_S = 3600.0  # a hanging page sleeps this long: for the demo, forever
CANCEL_WAIT_S = 30.0  # after cancelling a plain job, how long to wait for Spark to stop it
MAP_RETRIES = 2  # the demo's map: a failing page is tried this many times more before it is reported


@dataclass(frozen=True)
class Scene:
    """One scene: the corpus size, the faults put in it, and the map settings it shows."""

    key: str
    title: str
    pages: int
    crash: int = 0  # pages that kill their process
    hang: int = 0  # pages that never return
    kill: bool = False  # kill a worker process a third of the way through
    consumers: ConsumerOptions | None = None  # the map's consumers' options (its options=); None: the defaults
    time_limit: float | None = None  # the map's time limit per page (None: none)
    shown: str = ""  # how the settings read in the report


@dataclass
class Outcome:
    """How one system did in one scene, all measured in the run."""

    system: str
    done: int  # pages with a result
    failed: Counter[str]  # pages reported failed, by reason
    work_s: float  # CPU seconds of the pages done
    makespan_s: float
    workers: int
    ended: str = "finished"  # or how it ended otherwise (aborted, cancelled)
    note: str = ""

    @property
    def efficiency(self) -> float:
        return self.work_s / (self.workers * self.makespan_s) if self.makespan_s > 0 else 0.0


def process_page(row: dict[str, Any]) -> dict[str, Any]:
    """The per-page work: CPU for the page's cost, or its fault."""
    fault = row["fault"]
    if fault == "damaged":
        raise ValueError(f"page {row['page']} of document {row['doc']} is damaged")
    if fault == "crash":
        os._exit(CRASH_EXIT)
    if fault == "hang":
        time.sleep(HANG_S)
    seconds = busy(row["cost"])
    return {"doc": row["doc"], "page": row["page"], "words": 250 + (row["page"] * 7919) % 500, "seconds": seconds}


@dataclass
class Corpus:
    """A scene's pages as a cached DataFrame, with what they hold."""

    frame: Any
    work_s: float  # CPU seconds of the pages that can be done
    costs: dict[tuple[int, int], float]  # (doc, page) -> its cost, for the work of the pages done
    faults: Counter[str]


def corpus(spark: Any, scene: Scene, scale: float = 1.0) -> Corpus:
    """The scene's pages over INPUT_PARTITIONS partitions, its faults spread through them.

    Documents come in order of size (as batches of scans often arrive: the big ones together).
    """
    sizes, costs = documents(scene.pages)
    docs, k = [], 0
    for size in sizes:
        docs.append(costs[k : k + size])
        k += size
    docs.sort(key=sum)
    n = sum(len(d) for d in docs)
    at = {int(n * (i + 1) / (scene.crash + 1)): "crash" for i in range(scene.crash)}
    at.update({int(n * (i + 1) / (scene.hang + 9)) + 1: "hang" for i in range(scene.hang)})  # early on
    rows, k, cost_of, faults = [], 0, {}, Counter[str]()
    for doc, pages in enumerate(docs):
        for page, cost in enumerate(pages):
            fault = at.get(k, "damaged" if (k + 1) % DAMAGED_EVERY == 0 else "")
            rows.append((doc, page, cost * scale, fault))
            if fault:
                faults[fault] += 1
            else:
                cost_of[(doc, page)] = cost * scale
            k += 1
    frame = spark.createDataFrame(rows, INPUT_SCHEMA)
    frame = frame.repartitionByRange(INPUT_PARTITIONS, "doc").sortWithinPartitions("doc", "page").cache()
    frame.count()  # built before either timing
    return Corpus(frame, sum(cost_of.values()), cost_of, faults)


def _reason(error: str) -> str:
    """A failure's kind: the error's type, without its module."""
    return error.split(":", 1)[0].rsplit(".", 1)[-1]


def run_map(
    spark: Any, pool: QueuePool, scene: Scene, c: Corpus, workers: int, progress: bool, say: Callable[[str], None]
) -> tuple[Outcome, float | None]:
    """The scene through `conveyor.spark.map`; with when (seconds in) a worker was killed, if one was."""
    killer = _ConsumerKiller(pool, say) if scene.kill else None
    t0 = time.perf_counter()
    if killer:
        killer.start()
    try:
        out, st = mapping.map(
            c.frame,
            process_page,
            schema=PAGE_SCHEMA,
            n_consumers=workers,
            max_retries=MAP_RETRIES,
            time_limit=scene.time_limit,
            progress=progress,
            stats=True,
            options=scene.consumers,
        )
        rows = out.select("doc", "page", "_error").collect()  # one job: the output is read back once
        ok = [r for r in rows if r[2] is None]
        failed = Counter(_reason(r[2]) for r in rows if r[2] is not None)
    finally:
        if killer:
            killer.stop.set()
    makespan = time.perf_counter() - t0
    work = sum(c.costs.get((r[0], r[1]), 0.0) for r in ok)
    note = f"put {st.enqueue_s:.1f} s, work {st.consume_s:.1f} s, read back {st.read_s:.1f} s"
    killed_at = None
    if killer and killer.killed_at is not None:
        killed_at = killer.killed_at - t0
        note += f"; a consumer killed at {killed_at:.1f} s"
    elif killer:
        note += "; no consumer killed: the work ended before one could be"
    return Outcome("conveyor.spark.map", len(ok), failed, work, makespan, workers, note=note), killed_at


def run_plain(
    spark: Any, scene: Scene, c: Corpus, workers: int, patience_s: float, kill_at: float | None, say: Callable[[str], None]
) -> Outcome:
    """The scene with plain Spark, cancelled after `patience_s`.

    Each static partition runs its pages in turn, catching what a page raises (as careful code does);
    cancelled after `patience_s`. With `kill_at`, the Python worker of a running task is killed that
    many seconds in (as the map's consumer was).
    """
    import pandas as pd

    running = Path(tempfile.mkdtemp(prefix="conveyor-demo-"))  # a file per running task: its worker's pid

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        mark = running / str(os.getpid())
        mark.touch()
        try:
            for f in frames:
                out = []
                for row in f.to_dict("records"):
                    try:
                        out.append(process_page(row))
                    except ValueError:
                        out.append({"doc": row["doc"], "page": row["page"], "words": None, "seconds": None})
                yield pd.DataFrame(out, columns=["doc", "page", "words", "seconds"])
        finally:
            mark.unlink(missing_ok=True)

    group = f"conveyor-demo-plain-{scene.key}"
    result: dict[str, Any] = {}

    def job() -> None:
        sc = spark.sparkContext
        sc.setJobGroup(group, f"conveyor demo, scene {scene.key}: plain Spark", interruptOnCancel=True)
        try:
            rows = c.frame.mapInPandas(run, PAGE_SCHEMA).select("doc", "page", "words").collect()
            result["rows"] = rows
        except Exception as e:  # the job's end, told in the report
            result["error"] = e

    t0 = time.perf_counter()
    thread = threading.Thread(target=job, name="conveyor-demo-plain", daemon=True)
    thread.start()
    killed = kill_at is not None and _kill_plain_worker(running, t0 + kill_at, thread, say)
    thread.join(max(0.0, t0 + patience_s - time.perf_counter()))
    makespan = time.perf_counter() - t0
    ended = "finished"
    if thread.is_alive():
        spark.sparkContext.cancelJobGroup(group)
        thread.join(CANCEL_WAIT_S)
        ended = f"still running after {patience_s:.0f} s: cancelled by the demo"
    elif "error" in result:
        ended = f"job aborted: {_spark_reason(result['error'])}"
        makespan = time.perf_counter() - t0
    for f in running.iterdir():
        f.unlink(missing_ok=True)
    running.rmdir()
    rows = result.get("rows") if ended == "finished" else None
    if rows is None:  # the job's output is lost: none of its pages came back
        return Outcome("plain Spark", 0, Counter(), 0.0, makespan, workers, ended=ended, note=_lost(c))
    failed = Counter("ValueError" for r in rows if r[2] is None)
    work = sum(c.costs.get((r[0], r[1]), 0.0) for r in rows if r[2] is not None)
    note = f"{INPUT_PARTITIONS} static partitions"
    if killed:
        note += f"; a Python worker killed at {kill_at:.1f} s"
    elif kill_at is not None:
        note += f"; no Python worker killed: none ran {kill_at:.1f} s in"
    return Outcome("plain Spark", len(rows) - sum(failed.values()), failed, work, makespan, workers, note=note)


def _lost(c: Corpus) -> str:
    return f"every page lost, {sum(c.faults.values())} bad among {len(c.costs) + sum(c.faults.values()):,}"


def _spark_reason(e: BaseException) -> str:
    """Why a Spark job failed, in a few words from its error."""
    text = str(e)
    tries = re.search(r"failed (\d+) times", text)
    why = "its Python worker crashed" if "Python worker exited unexpectedly" in text else ""
    if tries:
        return f"a task failed {tries.group(1)} times{f' ({why})' if why else ''}"
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
    return line[:160]


def _kill_plain_worker(running: Path, at: float, thread: threading.Thread, say: Callable[[str], None]) -> bool:
    """At `at` (perf_counter), SIGKILL the Python worker of one running task; False if none ran then."""
    while time.perf_counter() < at and thread.is_alive():
        time.sleep(0.05)
    deadline = time.perf_counter() + 5.0
    while thread.is_alive() and time.perf_counter() < deadline:
        for f in sorted(running.iterdir()):
            try:
                os.kill(int(f.name), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                continue
            say(f"killed Spark's Python worker pid {f.name} (SIGKILL): Spark runs its task again, from the partition's start")
            return True
        time.sleep(0.05)
    return False


class _ConsumerKiller(threading.Thread):
    """Once a third of the pages are done, SIGKILL one consumer's Spark Python worker."""

    def __init__(self, pool: QueuePool, say: Callable[[str], None]) -> None:
        super().__init__(name="conveyor-demo-killer", daemon=True)
        self.pool, self.say = pool, say
        self.before = {*pool.stats(), *pool.queues.workers()}  # queues and consumers of earlier maps
        self.stop = threading.Event()
        self.killed_at: float | None = None

    def run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                st = {q: s for q, s in self.pool.stats().items() if q.startswith("map-") and q not in self.before}
                q = next(iter(st), None)  # this map's queue: the one that was not there before
                if q is None or st[q].acked < (st[q].acked + st[q].pending) / 3:
                    continue
                workers = self.pool.queues.workers()
            except Exception:  # the demo's killer must never fail the job
                continue
            for name, w in workers.items():  # this map's consumers: those not seen before it (any will do)
                pid = ConsumerReport.from_counts(name, w).pid  # 0: none reported (never kill(0): our own group)
                if name.startswith("spark:") and name not in self.before and pid > 0:
                    os.kill(pid, signal.SIGKILL)
                    self.killed_at = time.perf_counter()
                    self.say(
                        f"killed consumer pid {pid} (SIGKILL) a third of the way: Spark runs its task again, "
                        "and the pages it held go back to the queue as its connections close"
                    )
                    return
