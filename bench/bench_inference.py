"""Batch inference over a DataFrame: `conveyor.spark.map_batches` with a model class against Spark's `predict_batch_udf`.

W1 of issue 40: a scikit-learn model trained at the start on its bundled digits set predicts the
digit of 200,000 8x8 images (64 float columns, drawn from the set), local[2]. Each variant runs
on the same cached DataFrame, in the same session, once to warm up (Python workers started, the
model cached in them), then `--runs` times; the script prints the medians
of items/s (input rows over the end-to-end call: for Spark, the predictions written to the
`noop` sink; for map_batches, the call, which computes and keeps its output before it returns).

  (a) Spark's predict_batch_udf (batches of 1,024 rows; the model in its closure, cached per
      Python worker by Spark)
  (b) map_batches with a model class, its defaults (1,024 rows a batch, a batch at a time per consumer)
  (c) map_batches as (b), concurrency=1 (no more batches held than run, and no threads added)
  (d) Ray Data (the `bench` extra): map_batches over the same model class, an actor pool of 2,
      batches of 1,024 rows, from a dataset already in its object store (4 blocks, as Spark's 4 partitions)

W2 of issue 40: 5,000 calls to a local HTTP server (aiohttp, in a thread of this process) that
answers each after a lognormal delay (median 50 ms, p99 about 1 s; the same delay for the same
item in every variant), makespan of the call to the last answer:

  (a) Spark mapInPandas, 16 partitions, 32 threads each (written by hand)
  (b) conveyor.spark.map, a plain function, its defaults (threads grow while calls wait)
  (c) conveyor.spark.map, tuned: concurrency=32, rows_per_message=1; (c') concurrency=128
  (d) conveyor.spark.map, an async class (an aiohttp session per consumer), its defaults
  (e) Ray Data: map_batches over an async class (a batch's calls gathered), 2 actors, batches of 64

Each variant also says the most calls the server had in flight at once.

W3 of issue 40: 2,000 CPU-bound items of lognormal cost (`workloads.skewed`, summing to
`--w3-seconds`, 100 s by default: the longest take 1-1.6 s), efficiency = work / (2 x makespan):

  (a) Spark mapInPandas over 16 partitions
  (b) conveyor.spark.map, its defaults
  (c) Ray Data map over 16 blocks (tasks on 2 CPUs), Ray started (and warmed up) before each of its
      runs and stopped after it: idle, its daemons take ~1.7% of the 2 cores, which the others' runs
      would pay

Resume of issue 40: W1 as a resumable job (`map_batches(..., job=...)`) on durable servers that
outlive its driver. A driver of its own (this script, `--resume-driver`) runs it and is SIGKILLed,
with its Spark, once about half the batches are done; then this process runs the same call again.
Printed: the second run's time against a full run's (medians of `--runs`, the full runs as fresh
jobs in this process), its output checked exact, the messages in flight at the kill and the rows
run twice (the model class logs the rows it ran). Beside it, Ray Data's job-level checkpoint
(`DataContext.checkpoint_config = CheckpointConfig(id_column="id", checkpoint_path=...)`): the
same images in 25 parquet files, read, repartitioned to 25 blocks, predicted by an actor pool,
written to parquet, each run a driver of its own with a Ray of its own; the first killed (with its
Ray) once half the rows are checkpointed, then the same program again. Every Ray run has a bound:
one that hangs is killed and reported so ("hung, killed after N s"). One table of both.

Needs the `bench` extra: scikit-learn (W1) and Ray Data.

    python bench/bench_inference.py [--workload w1|w2|w3|resume|all] [--rows 200000] [--calls 5000] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchlib import progress, settle

COLUMNS = [f"p{i}" for i in range(64)]


class Predictor:
    """The model class map_batches builds once per consumer process."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, batch: Any) -> Any:
        import pandas as pd

        return pd.DataFrame({"digit": self.model.predict(batch[COLUMNS].to_numpy())})


class CountingPredictor(Predictor):
    """Predictor that also logs the rows of each batch it ran (to `ran`, a file per process): the rows run twice."""

    def __init__(self, model: Any, ran: str) -> None:
        super().__init__(model)
        self.ran = ran

    def __call__(self, batch: Any) -> Any:
        out = super().__call__(batch)
        with open(os.path.join(self.ran, f"{os.getpid()}.rows"), "ab") as log:
            log.write(len(out).to_bytes(8, "little"))
        return out


def rows_ran(ran: Path) -> int:
    """The rows the CountingPredictors logging to `ran` ran."""
    data = b"".join(f.read_bytes() for f in ran.glob("*.rows"))
    return sum(int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8))


class RayPredictor:
    """W1's model in a Ray Data actor: built once per actor."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, batch: Any) -> Any:
        import pandas as pd

        return pd.DataFrame({"digit": self.model.predict(batch[COLUMNS].to_numpy())})


def start_ray(**options: Any) -> Any:
    """Ray on this machine's 2 cores (Ray Data from the `bench` extra), quiet, with a bounded object store."""
    import logging

    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=2 * 1024**3,
        logging_level=logging.WARNING,
        **options,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    return ray


def train() -> tuple[Any, Any]:
    """A logistic regression fitted on the digits set, and the set's images as rows of 64 floats."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    digits = load_digits()
    model = LogisticRegression(max_iter=5000).fit(digits.data, digits.target)
    return model, digits.data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("w1", "w2", "w3", "resume", "all"), default="all")
    parser.add_argument("--rows", type=int, default=200_000, help="W1's images")
    parser.add_argument("--calls", type=int, default=5_000, help="W2's HTTP calls")
    parser.add_argument("--w3-seconds", type=float, default=100.0, help="W3's work: its 2,000 items' seconds together")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--resume-driver", metavar="ADDRESSES", help=argparse.SUPPRESS)  # the resume scenario's first run
    parser.add_argument("--resume-ran", metavar="DIR", help=argparse.SUPPRESS)  # where its rows run are logged
    parser.add_argument("--ray-resume-driver", metavar="RUN_DIR", help=argparse.SUPPRESS)  # a run of Ray's checkpointed job
    parser.add_argument("--ray-actors", type=int, default=1, help=argparse.SUPPRESS)  # its actor pool's size
    args = parser.parse_args()
    if args.resume_driver:
        resume_driver(args)
        return
    if args.ray_resume_driver:
        ray_resume_driver(Path(args.ray_resume_driver), args.ray_actors)
        return
    if args.workload in ("w1", "all"):
        w1(args)
    if args.workload in ("w2", "all"):
        w2(args)
    if args.workload in ("w3", "all"):
        w3(args)
    if args.workload in ("resume", "all"):
        resume(args)


def w1(args: argparse.Namespace) -> None:
    """W1: digits predicted by map_batches with a model class and by predict_batch_udf."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    import conveyor.spark as cs
    from conveyor.client.pool import QueuePool
    from conveyor.spark.session import get_or_create_session

    model, frame, want = w1_input(args.rows)
    spark = get_or_create_session("local[2]", app_name="bench-inference")
    df = spark.createDataFrame(frame).repartition(4).cache()
    progress(f"{df.count():,} rows of {len(COLUMNS)} columns cached; model: {type(model).__name__}")

    def make_predict_fn() -> Callable[[Any], Any]:
        def predict(inputs: Any) -> Any:
            return model.predict(inputs)

        return predict

    spark_udf = predict_batch_udf(make_predict_fn, return_type=LongType(), batch_size=1024, input_tensor_shapes=[[64]])

    def spark_run() -> Callable[[], None]:
        df.select(spark_udf(F.array(*COLUMNS)).alias("digit")).write.format("noop").mode("overwrite").save()
        return lambda: None

    with QueuePool.local(n_servers=2) as pool:

        def conveyor_run(**options: Any) -> Callable[[], Callable[[], None]]:
            def run() -> Callable[[], None]:
                out, stats = cs.map_batches(
                    df, Predictor, schema="digit long", fn_args=(model,), queue_pool=pool, progress=False, stats=True, **options
                )

                def check() -> None:  # after the clock: the output checked against the model's own predictions
                    # instances: 0 once the Python workers hold the model from an earlier call with the same class and arguments
                    assert stats.failed == 0 and stats.rows == args.rows and stats.instances <= 2, stats
                    assert sorted(r["digit"] for r in out.select("digit").collect()) == sorted(want.tolist())
                    progress(f"  map_batches: consume {stats.consume_s:.2f} s, read back {stats.read_s:.2f} s")
                    out.unpersist()
                    pool.drop(stats.queue)

                return check

            return run

        ray = start_ray()
        # in Ray's object store, as the Spark input is cached, and in as many blocks as it has partitions (from_pandas
        # makes one block, which only one actor of the pool would work on)
        ray_frame = ray.data.from_pandas(frame).repartition(4).materialize()

        def ray_run() -> Callable[[], None]:
            out = ray_frame.map_batches(
                RayPredictor, fn_constructor_args=(model,), batch_size=1024, batch_format="pandas", concurrency=2
            ).materialize()

            def check() -> None:
                assert sorted(out.to_pandas()["digit"].tolist()) == sorted(want.tolist())

            return check

        variants: dict[str, Callable[[], Callable[[], None]]] = {
            "(a) Spark predict_batch_udf": spark_run,
            "(b) map_batches, model class, defaults": conveyor_run(),
            "(c) map_batches, model class, concurrency=1": conveyor_run(concurrency=1),
            "(d) Ray Data map_batches, actor pool of 2": ray_run,
        }
        # not measured: Python workers started, the model cached in them, and the JVM's code compiled (its
        # optimising compiler works through the first runs of each: a first round alone left runs 1-3 of
        # predict_batch_udf at 162-208k items/s, run 5 at 246k, and map_batches slower right after it)
        for warm_up in range(2):
            for name, variant in variants.items():
                variant()()
                progress(f"warm-up {warm_up + 1}: {name}")
        rates: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for run in range(args.runs):
            # each run in another order, so that no system always follows the same one: map_batches right after
            # predict_batch_udf or Ray measured 0.70-0.76x predict_batch_udf, right after another map_batches 0.83-0.85x
            for name in names[run % len(names) :] + names[: run % len(names)]:
                variant = variants[name]
                # Ray's daemons kept working for a few seconds after its runs: whatever ran next was slowed
                # (map_batches' consume 1.1-1.4 s right after it, 0.9 s after another map_batches)
                settle()
                t0 = time.perf_counter()
                check = variant()
                seconds = time.perf_counter() - t0
                check()
                rates[name].append(args.rows / seconds)
                progress(f"run {run + 1}: {name}: {seconds:.2f} s, {args.rows / seconds:,.0f} items/s")
    ray.shutdown()
    spark.stop()
    print(f"\nW1: {args.rows:,} digits predicted, local[2], medians of {args.runs}")
    best = statistics.median(rates["(a) Spark predict_batch_udf"])
    for name, got in rates.items():
        median = statistics.median(got)
        runs = ", ".join(f"{r:,.0f}" for r in got)
        print(f"  {name:46s} {median:>10,.0f} items/s  ({median / best:.2f}x predict_batch_udf; runs {runs})")


W3_ITEMS = 2000
W3_DDL = "i long, start double, finish double"


@dataclasses.dataclass(frozen=True)
class Ran:
    """A W3 run: the items done, and the seconds they took (set-up before the clock left out)."""

    done: int
    seconds: float


def clocked(run: Callable[[], int]) -> Ran:
    """`run()` timed: the items it says it did, and its seconds."""
    t0 = time.perf_counter()
    done = run()
    return Ran(done, time.perf_counter() - t0)


def w3_item(row: dict[str, Any]) -> dict[str, Any]:
    """One W3 item: busy for its seconds; returns when it ran."""
    from conveyor.cli.corpus import busy  # on the executors: from the installed library

    start = time.time()
    busy(row["seconds"])
    return {"i": row["i"], "start": start, "finish": time.time()}


def w3(args: argparse.Namespace) -> None:
    """W3: CPU-bound items of lognormal cost: efficiency of mapInPandas, conveyor.spark.map's defaults and Ray Data."""
    import pandas as pd

    import conveyor.spark as cs
    from conveyor.client.pool import QueuePool
    from conveyor.spark.session import get_or_create_session
    from workloads import skewed

    durations = skewed(W3_ITEMS, args.w3_seconds)
    work = sum(durations)
    items = [{"i": i, "seconds": d} for i, d in enumerate(durations)]
    spark = get_or_create_session("local[2]", app_name="bench-inference-w3")
    df = spark.createDataFrame(pd.DataFrame(items)).repartition(16).cache()
    warm = spark.createDataFrame(pd.DataFrame(items[:32]).assign(seconds=0.0)).repartition(16).cache()
    progress(f"{df.count():,} items, {work:.0f} s of work, the longest {max(durations):.2f} s; {warm.count()} to warm up")

    def in_pandas(frames: Iterator[Any]) -> Iterator[Any]:
        for f in frames:
            yield pd.DataFrame([w3_item(r) for r in f.to_dict("records")], columns=["i", "start", "finish"])

    with QueuePool.local(n_servers=2) as pool:

        def conveyor_run(frame: Any) -> int:
            out = cs.map(frame, w3_item, schema=W3_DDL, queue_pool=pool, progress=False)
            n = out.where("_error IS NULL").count()
            out.unpersist()
            return int(n)

        def ray_run(warm_up: bool) -> Ran:
            # Ray runs for its own turns only: idle, its daemons took 1.7% of the 2 cores (30 s measured), which
            # the other systems' runs would pay (Spark's JVM and the queue servers idle: 0.3%). Started and
            # warmed up (its workers started) before the clock, stopped after it.
            ray = start_ray()
            try:
                ray.data.from_items(items[:32]).map(w3_item).materialize()
                ray_items = ray.data.from_items(items, override_num_blocks=16)
                return Ran(0, 0.0) if warm_up else clocked(lambda: int(ray_items.map(w3_item).materialize().count()))
            finally:
                ray.shutdown()

        variants: dict[str, Callable[[bool], Ran]] = {
            "(a) Spark mapInPandas, 16 partitions": lambda warm_up: clocked(
                lambda: len((warm if warm_up else df).mapInPandas(in_pandas, W3_DDL).collect())
            ),
            "(b) conveyor.spark.map, defaults": lambda warm_up: clocked(lambda: conveyor_run(warm if warm_up else df)),
            "(c) Ray Data map, 16 blocks": ray_run,
        }
        for name, variant in variants.items():
            variant(True)
            progress(f"warm-up: {name}")
        efficiency: dict[str, list[float]] = {name: [] for name in variants}
        for run in range(args.runs):
            for name, variant in variants.items():
                ran = variant(False)
                assert ran.done == W3_ITEMS, f"{name}: {ran.done} items done"
                efficiency[name].append(work / (2 * ran.seconds))
                progress(f"run {run + 1}: {name}: {ran.seconds:.2f} s, efficiency {efficiency[name][-1]:.3f}")
    spark.stop()
    print(f"\nW3: {W3_ITEMS:,} CPU-bound items, {work:.0f} s of work, local[2], medians of {args.runs}")
    for name, got in efficiency.items():
        runs = ", ".join(f"{e:.3f}" for e in got)
        print(f"  {name:46s} efficiency {statistics.median(got):.3f}  (runs {runs})")


RESUME_JOB = "w1-resume"
KILL_AT = 0.5  # of the job's messages done when its first driver is killed


def w1_input(rows: int) -> Any:
    """W1's model, its input images as a pandas DataFrame, and the model's own predictions: the same in every process."""
    import numpy as np
    import pandas as pd

    model, images = train()
    rng = np.random.default_rng(40)
    frame = pd.DataFrame(images[rng.integers(0, len(images), rows)], columns=COLUMNS)
    return model, frame, model.predict(frame.to_numpy())


def resume_job(spark: Any, model: Any, frame: Any, pool: Any, job: str, ran: Path) -> Any:
    """The resume scenario's call: W1 through map_batches as the resumable job `job` (its input the same each time)."""
    import conveyor.spark as cs

    df = spark.createDataFrame(frame).repartition(4)
    ran.mkdir(parents=True, exist_ok=True)
    out, st = cs.map_batches(
        df,
        CountingPredictor,
        schema="digit long",
        fn_args=(model, str(ran)),
        queue_pool=pool,
        job=job,
        progress=False,
        stats=True,
    )
    progress(f"  {job}: input put (or named) {st.enqueue_s:.2f} s, consumed {st.consume_s:.2f} s, read back {st.read_s:.2f} s")
    return out


def resume_driver(args: argparse.Namespace) -> None:
    """The resume scenario's first run, in a driver of its own, which the scenario kills."""
    from conveyor.client.pool import QueuePool
    from conveyor.spark.session import get_or_create_session

    model, frame, _ = w1_input(args.rows)
    spark = get_or_create_session("local[2]", app_name="bench-resume-driver")
    with QueuePool.connect(args.resume_driver) as pool:
        resume_job(spark, model, frame, pool, RESUME_JOB, Path(args.resume_ran)).count()


@dataclasses.dataclass(frozen=True)
class Resumed:
    """One system's resume figures: full runs, runs again after a kill, rows run twice, exactness; or why it could not."""

    system: str
    full: list[float]  # a full run's seconds, each run
    again: list[float]  # a run again's seconds after a kill, each run that finished
    twice: list[int]  # rows the killed run and its run again both ran, each run
    exact: list[bool]  # the output exact, each run again
    notes: list[str]  # what else was measured: where the kills fell, hangs

    def row(self) -> str:
        """Its line of the table."""
        full = f"{statistics.median(self.full):8.2f}" if self.full else f"{'-':>8}"
        again = f"{statistics.median(self.again):8.2f}" if self.again else f"{'-':>8}"
        ratio = (
            f"{statistics.median(self.again) / statistics.median(self.full):6.2f}x" if self.full and self.again else f"{'-':>7}"
        )
        twice = "/".join(f"{t:,}" for t in self.twice) or "-"
        exact = "yes" if self.exact and all(self.exact) else ("no" if self.exact else "-")
        return f"  {self.system:34s} {full} {again} {ratio}  {twice:>22s}  {exact}"


def resume(args: argparse.Namespace) -> None:
    """Resume: W1 as a resumable job, its first driver killed halfway, run again; against full runs. Then Ray Data's."""
    from conveyor.client.pool import QueuePool
    from conveyor.spark.session import get_or_create_session

    model, frame, want = w1_input(args.rows)
    spark = get_or_create_session("local[2]", app_name="bench-resume")
    queue = f"map_batches-job-{RESUME_JOB}"
    notes: list[str] = []
    twice: list[int] = []
    with tempfile.TemporaryDirectory() as data, QueuePool.local(n_servers=2, data_dir=data) as pool:
        full: list[float] = []
        for run in range(args.runs + 1):  # the first one warms up (Python workers started)
            t0 = time.perf_counter()
            resume_job(spark, model, frame, pool, f"w1-full-{run}", Path(data) / f"ran-full-{run}").count()
            if run:
                full.append(time.perf_counter() - t0)
            progress(f"full run {run}: {time.perf_counter() - t0:.2f} s" + ("" if run else " (warm-up)"))
        seconds: list[float] = []
        for run in range(args.runs):
            ran = Path(data) / f"ran-again-{run}"
            done, in_flight = killed_halfway(pool, queue, args, ran)
            t0 = time.perf_counter()
            out = resume_job(spark, model, frame, pool, RESUME_JOB, ran)
            seconds.append(time.perf_counter() - t0)
            assert sorted(r["digit"] for r in out.select("digit").collect()) == sorted(want.tolist())
            assert out.where("_error IS NOT NULL").count() == 0 and queue not in pool.stats()
            twice.append(rows_ran(ran) - args.rows)
            notes.append(
                f"run {run + 1}: killed at {done:.0%} of the messages done, {in_flight} messages in flight "
                f"({in_flight * 1024:,} rows at most); {twice[-1]:,} rows run twice; run again {seconds[-1]:.2f} s"
            )
            progress(notes[-1])
    spark.stop()
    conveyor = Resumed("Conveyor map_batches(job=...)", full, seconds, twice, [True] * len(seconds), notes)
    ray = ray_resume(args, model, frame, want)
    print(
        f"\nResume: W1 ({args.rows:,} digits), the first driver SIGKILLed at ~{KILL_AT:.0%}, the same program run again; "
        f"2 cores, medians of {args.runs}"
    )
    print(f"  {'system':34s} {'full s':>8} {'again s':>8} {'ratio':>7}  {'rows re-run (each run)':>22s}  exact")
    for system in (conveyor, ray):
        print(system.row())
    for system in (conveyor, ray):
        print(f"\n  {system.system}: full runs {', '.join(f'{x:.2f}' for x in system.full) or 'none'} s")
        for note in system.notes:
            print(f"    {note}")


def killed_halfway(pool: Any, queue: str, args: argparse.Namespace, ran: Path) -> tuple[float, int]:
    """Run the resumable job in a driver of its own; SIGSTOP then SIGKILL it with its Spark at KILL_AT of the messages done.

    Returns the share of messages done then, and the messages in flight (delivered, not settled).
    """
    command = [sys.executable, __file__, "--rows", str(args.rows), "--resume-driver", ",".join(pool.addresses)]
    command += ["--resume-ran", str(ran)]
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # the driver starts Spark, puts the input, then consumes
        while True:
            st = pool.stats().get(queue)
            if st is not None and st.acked + st.pending and st.acked >= KILL_AT * (st.acked + st.pending):
                break
            if driver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the first run ended (exit {driver.poll()}) or timed out before half its work was done")
            time.sleep(0.005)
        _stop_tree(driver.pid)
        st = pool.stats()[queue]
        done, in_flight = st.acked / (st.acked + st.pending), st.delivered
    finally:
        _kill_tree(driver)
    return done, in_flight


def _stop_tree(pid: int) -> None:
    """SIGSTOP a driver and its descendants, so that what is measured next is what the kill finds."""
    for p in _tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGSTOP)


def _kill_tree(driver: subprocess.Popen[Any]) -> None:
    """SIGKILL a driver (started in a session of its own) and its descendants, and reap it."""
    tree = _tree(driver.pid) if driver.poll() is None else []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(driver.pid, signal.SIGKILL)
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    driver.wait(60)


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (Spark's Python daemon is in a process group of its own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if entry.isdigit():
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


RAY_FILES = 25  # Ray's input: parquet files of 8,000 rows, repartitioned to as many blocks, each written (and checkpointed)
# on its own, about as fine as Conveyor's chunks of 8,192 rows (one block read whole is checkpointed all or nothing)
RAY_PROBE_S = 180.0  # the bound on a full run with an actor pool of 2, which hangs on 2 CPUs (its reads get no CPU)
RAY_HANG = 5.0  # a Ray run again that takes longer than this many full runs (with Ray's start) is killed as a hang
RAY_START_S = 300.0  # for a Ray driver to start Ray and checkpoint half its rows (or finish), on a busy machine


class RayIdPredictor:
    """W1's model in a Ray Data actor of the checkpointed job: keeps the id column its checkpoint needs; logs the ids it ran."""

    def __init__(self, model: Any, ran: str) -> None:
        self.model, self.ran = model, ran

    def __call__(self, batch: Any) -> Any:
        import pandas as pd

        out = pd.DataFrame({"id": batch["id"].to_numpy(), "digit": self.model.predict(batch[COLUMNS].to_numpy())})
        with open(os.path.join(self.ran, f"{os.getpid()}.ids"), "ab") as log:  # for the rows run twice
            log.write(out["id"].to_numpy().astype("<i8").tobytes())
        return out


def ray_resume_driver(run: Path, actors: int) -> None:
    """One run of Ray Data's checkpointed W1 job, in a driver of its own with a Ray of its own: prints its seconds."""
    import pickle

    from ray.data.checkpoint import CheckpointConfig

    model = pickle.loads((run.parent / "model.pickle").read_bytes())
    ray = start_ray(address="local")  # a Ray of its own, never one another program runs
    ray.data.DataContext.get_current().checkpoint_config = CheckpointConfig(
        id_column="id", checkpoint_path=str(run / "checkpoint")
    )
    t0 = time.perf_counter()
    ray.data.read_parquet(str(run.parent / "input")).repartition(RAY_FILES).map_batches(
        RayIdPredictor,
        fn_constructor_args=(model, str(run / "ran")),
        batch_size=1024,
        batch_format="pandas",
        concurrency=actors,
    ).write_parquet(str(run / "output"))
    print(time.perf_counter() - t0, flush=True)
    ray.shutdown()


def ray_resume(args: argparse.Namespace, model: Any, frame: Any, want: Any) -> Resumed:
    """Ray Data's checkpoint in the resume scenario's shape: full runs, then runs killed at KILL_AT of the rows and run again.

    Every run is a driver of its own (a child process with its own Ray), under a bound: a hang is killed and reported.
    Its time is its job's, from after Ray started. First, one full run with an actor pool of 2 (as W1's (d)); the
    scenario runs with an actor pool of 1, which leaves Ray's read and write tasks a CPU.
    """
    import pickle

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    system = f"Ray Data {ray_version()} CheckpointConfig"
    notes: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="bench-ray-resume-"))
    try:
        (base / "input").mkdir()
        (base / "model.pickle").write_bytes(pickle.dumps(model))
        table = pa.Table.from_pandas(frame.assign(id=np.arange(len(frame), dtype=np.int64)), preserve_index=False)
        for i, at in enumerate(np.array_split(np.arange(len(frame)), RAY_FILES)):
            pq.write_table(table.slice(int(at[0]), len(at)), base / "input" / f"part-{i:03d}.parquet")
        seconds, outcome = _ray_run(base / "probe", RAY_PROBE_S, 2)
        notes.append(f"actor pool of 2: full run {outcome if seconds is None else f'{seconds:.2f} s'}")
        progress(f"Ray Data {notes[-1]}")
        full: list[float] = []
        walls: list[float] = []
        for run in range(args.runs + 1):  # the first one warms up (files read into the page cache, Ray's modules)
            t0 = time.perf_counter()
            seconds, outcome = _ray_run(base / f"full-{run}", RAY_START_S, 1)
            wall = time.perf_counter() - t0
            if seconds is not None:
                outcome = _ray_output(base / f"full-{run}", want)
            if seconds is None or outcome != "output exact":
                notes.append(f"actor pool of 1: full run {run}: {outcome}; no run again measured")
                return Resumed(system, full, [], [], [], notes)
            if run:
                full.append(seconds)
                walls.append(wall)
            progress(f"Ray Data full run {run}: {seconds:.2f} s ({wall:.2f} s with Ray's start)" + ("" if run else " (warm-up)"))
        again: list[float] = []
        twice: list[int] = []
        exact: list[bool] = []
        for run in range(args.runs):
            where = base / f"again-{run}"
            try:
                killed_at = _ray_killed_halfway(where, args.rows)
            except RuntimeError as e:
                notes.append(f"run {run + 1}: {e}")
                continue
            bound = RAY_HANG * statistics.median(walls)
            seconds, outcome = _ray_run(where, bound, 1)
            ran = np.concatenate([np.fromfile(f, dtype="<i8") for f in (where / "ran").glob("*.ids")] or [np.array([], "<i8")])
            if seconds is None:  # a run again that hung ran nothing: no rows run twice to count
                notes.append(f"run {run + 1}: killed at {killed_at:.0%} of the rows checkpointed; run again {outcome}")
            else:
                twice.append(len(ran) - len(np.unique(ran)))
                again.append(seconds)
                outcome = _ray_output(where, want)
                exact.append(outcome == "output exact")
                notes.append(
                    f"run {run + 1}: killed at {killed_at:.0%} of the rows checkpointed; run again {seconds:.2f} s, "
                    f"{outcome}; {twice[-1]:,} rows run twice"
                )
            progress(f"Ray Data {notes[-1]}")
        return Resumed(system, full, again, twice, exact, notes)
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def _ray_driver(run: Path, actors: int) -> subprocess.Popen[Any]:
    """A Ray driver (`--ray-resume-driver`) on `run`, its stderr in run/driver.err."""
    (run / "ran").mkdir(parents=True, exist_ok=True)
    with open(run / "driver.err", "ab") as err:
        return subprocess.Popen(
            [sys.executable, __file__, "--ray-resume-driver", str(run), "--ray-actors", str(actors)],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _ray_run(run: Path, bound_s: float, actors: int) -> tuple[float | None, str]:
    """A Ray run to its end: its job's seconds, or None and why: it failed, or hung (killed after `bound_s`)."""
    driver = _ray_driver(run, actors)
    try:
        out, _ = driver.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        _kill_tree(driver)
        return None, f"hung, killed after {bound_s:.0f} s"
    if driver.returncode == 0 and out.split():
        return float(out.split()[-1]), "ran"
    return None, f"failed (exit {driver.returncode}; see {run / 'driver.err'})"


def _ray_killed_halfway(run: Path, rows: int) -> float:
    """A Ray run SIGSTOPped then SIGKILLed, with its Ray, once KILL_AT of the rows are checkpointed; returns the share then."""
    import pyarrow.parquet as pq

    counted: dict[str, int] = {}

    def checkpointed() -> int:  # the rows of committed checkpoint files (a pending one ends in .pending.parquet)
        for f in (run / "checkpoint").glob("*.parquet"):
            if not f.name.endswith(".pending.parquet") and f.name not in counted:
                with contextlib.suppress(OSError):
                    counted[f.name] = pq.read_metadata(f).num_rows
        return sum(counted.values())

    driver = _ray_driver(run, 1)
    try:
        deadline = time.monotonic() + RAY_START_S
        while checkpointed() < KILL_AT * rows:
            if driver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the first run ended (exit {driver.poll()}) or hung ({RAY_START_S:.0f} s) before half its rows were "
                    "checkpointed"
                )
            time.sleep(0.01)
        _stop_tree(driver.pid)
        return checkpointed() / rows
    finally:
        _kill_tree(driver)


def _ray_output(run: Path, want: Any) -> str:
    """Whether a Ray run's output is exact: every row once, with the model's prediction; else what is wrong."""
    import numpy as np
    import pyarrow.parquet as pq

    files = sorted((run / "output").glob("*.parquet"))
    if not files:
        return "no output"
    table = pq.read_table(files, columns=["id", "digit"])
    ids, digits = table.column("id").to_numpy(), table.column("digit").to_numpy()
    unique = len(np.unique(ids))
    wrong = int(np.count_nonzero(want[ids] != digits)) if len(ids) else 0
    if len(ids) == unique == len(want) and not wrong:
        return "output exact"
    return f"output NOT exact: {len(ids):,} rows for {len(want):,}, {len(ids) - unique:,} twice, {wrong:,} wrong"


def ray_version() -> str:
    """The installed Ray's version."""
    import ray

    return str(ray.__version__)


def delay_of(item: int) -> float:
    """W2's answer delay for `item`: lognormal, median 50 ms, p99 about 1 s, the same in every variant."""
    rng = random.Random(item)
    return min(DELAY_CAP_S, math.exp(math.log(0.05) + 1.288 * rng.gauss(0.0, 1.0)))


RAY_W2_BATCH = 64  # rows per Ray Data batch in W2: each batch's calls in flight together, many batches per actor
DELAY_CAP_S = 5.0  # the lognormal's far tail cut, so that one draw does not decide a makespan


class InFlight:
    """The calls the W2 server is answering now, and the most at once since `reset` (its loop's thread only)."""

    def __init__(self) -> None:
        self.now = self.most = 0

    def reset(self) -> int:
        """The most at once since the last reset."""
        most, self.most = self.most, self.now
        return most


@contextlib.contextmanager
def slow_server(in_flight: InFlight) -> Iterator[str]:
    """An HTTP server answering `/item/<n>` with `n` after `delay_of(n)`, counting `in_flight`; yields its base URL."""
    import asyncio

    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        in_flight.now += 1
        in_flight.most = max(in_flight.most, in_flight.now)
        try:
            await asyncio.sleep(delay_of(n))
        finally:
            in_flight.now -= 1
        return web.Response(text=str(n))

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/item/{n}", answer)
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    sock = socket.create_server(("127.0.0.1", 0), backlog=4096)  # its port known before the site starts
    loop.run_until_complete(web.SockSite(runner, sock).start())
    port = sock.getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def fetch(base: str, item: int) -> int:
    """One W2 call: a plain, blocking HTTP GET (what a sync function does)."""
    with urllib.request.urlopen(f"{base}/item/{item}", timeout=60) as r:
        return int(r.read())


class AsyncFetch:
    """W2's call as an async client: one aiohttp session per consumer, opened on its loop at the first call."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.session: Any = None

    async def __call__(self, row: dict[str, Any]) -> int:
        import aiohttp

        if self.session is None:  # no cap on connections: the consumer's concurrency is the cap
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        async with self.session.get(f"{self.base}/item/{row['id']}") as r:
            return int(await r.text())

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()


class RayFetch:
    """W2's call in a Ray Data actor: an async class, a batch's calls awaited together on its loop."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.session: Any = None

    async def __call__(self, batch: Any) -> Any:
        import asyncio

        import aiohttp
        import numpy as np

        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        async def one(item: int) -> int:
            async with self.session.get(f"{self.base}/item/{item}") as r:
                return int(await r.text())

        yield {"n": np.array(await asyncio.gather(*(one(int(i)) for i in batch["id"])))}


def w2(args: argparse.Namespace) -> None:
    """W2: HTTP calls of lognormal latency: Spark mapInPandas with threads written by hand, and conveyor.spark.map."""
    import pandas as pd

    import conveyor.spark as cs
    from conveyor.client.pool import QueuePool
    from conveyor.spark.session import get_or_create_session

    spark = get_or_create_session("local[2]", app_name="bench-api-calls")
    n = args.calls
    df = spark.range(n).repartition(16).cache()
    progress(f"{df.count():,} calls; serial time {sum(delay_of(i) for i in range(n)):,.0f} s")
    in_flight = InFlight()
    with slow_server(in_flight) as base, QueuePool.local(n_servers=2) as pool:

        def call(row: dict[str, Any]) -> int:
            return fetch(base, row["id"])

        def spark_threads(batches: Any) -> Any:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(32) as ex:
                for b in batches:
                    yield pd.DataFrame({"n": list(ex.map(lambda i: fetch(base, int(i)), b["id"]))})

        def spark_run() -> None:
            got = df.mapInPandas(spark_threads, "n long").agg({"n": "sum"}).collect()[0][0]
            assert got == n * (n - 1) // 2, got

        def conveyor_run(fn: Any = call, **options: Any) -> Callable[[], None]:
            def run() -> None:
                out, stats = cs.map(df, fn, schema="n long", queue_pool=pool, progress=False, stats=True, **options)
                assert stats.failed == 0 and out.agg({"n": "sum"}).collect()[0][0] == n * (n - 1) // 2
                pool.drop(stats.queue)

            return run

        ray = start_ray()
        ray_items = ray.data.range(n).materialize()

        def ray_run() -> None:
            out = ray_items.map_batches(RayFetch, fn_constructor_args=(base,), batch_size=RAY_W2_BATCH, concurrency=2)
            got = int(out.to_pandas()["n"].sum())
            assert got == n * (n - 1) // 2, got

        variants: dict[str, Callable[[], None]] = {
            "(a) Spark mapInPandas, 16 x 32 threads": spark_run,
            "(b) map, defaults": conveyor_run(),
            "(c) map, concurrency=32, rows_per_message=1": conveyor_run(concurrency=32, rows_per_message=1),
            "(c') map, concurrency=128, rows_per_message=1": conveyor_run(concurrency=128, rows_per_message=1),
            "(d) map, async class (aiohttp), defaults": conveyor_run(AsyncFetch, fn_args=(base,)),
            f"(e) Ray Data, async class, 2 actors, batches of {RAY_W2_BATCH}": ray_run,
        }
        spark_run()  # Python workers started, Ray's actors too: not measured
        ray_run()
        took: dict[str, list[float]] = {name: [] for name in variants}
        most: dict[str, list[int]] = {name: [] for name in variants}
        for run in range(args.runs):
            for name, variant in variants.items():
                in_flight.reset()
                t0 = time.perf_counter()
                variant()
                took[name].append(time.perf_counter() - t0)
                most[name].append(in_flight.reset())
                progress(f"run {run + 1}: {name}: {took[name][-1]:.1f} s, at most {most[name][-1]:,} calls in flight")
        ray.shutdown()
    spark.stop()
    print(f"\nW2: {n:,} HTTP calls of lognormal latency (median 50 ms), local[2], makespan, medians of {args.runs}")
    base_s = statistics.median(took["(a) Spark mapInPandas, 16 x 32 threads"])
    for name, got in took.items():
        median = statistics.median(got)
        runs = ", ".join(f"{t:.1f}" for t in got)
        print(
            f"  {name:46s} {median:>7.1f} s  ({median / base_s:.2f}x mapInPandas; runs {runs}; "
            f"at most {statistics.median(most[name]):,.0f} calls in flight)"
        )


if __name__ == "__main__":
    main()
