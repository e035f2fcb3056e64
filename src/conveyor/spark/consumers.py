"""SparkConsumerPool: consumers running as long-lived Spark tasks on the executors.

`spark.range(n, numPartitions=n).mapInArrow(...)` starts n Spark tasks; each runs one `Consumer`
(consumer i of n, serving its own shards first and stealing from the others) in the executor's
Python worker until the queues are drained (`until_empty`) or a stop is signalled. Only the
DataFrame API is used, so it runs wherever that exists (Spark Connect included; there the job is
tagged instead of grouped). A Spark task that fails is retried by Spark; the messages its consumer
held come back when their leases end (a running task's lease is extended only while it runs).

A stop travels through the queue servers, not Spark: `stop()` stores a blob whose key the
consumers know, and each checks for it about once a second, then stops gracefully.

With `then=(schema, rows)`, each task yields `rows(task)` once the queues are drained instead of
its counts, which it puts on a queue of their own (with any counts `rows` returns): how `map`
reads its results back in the same Spark job that consumed them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from conveyor.constants import DEFAULT_MAX_CONCURRENCY
from conveyor.errors import ConveyorError
from conveyor.message import Message
from conveyor.spark.session import check_workers_python
from conveyor.tasks.queue_config import QueueConfig
from conveyor.worker.affinity import check_pin
from conveyor.worker.consumer import Consumer
from conveyor.worker.consumer_pool import CONSUMER_SWITCH_INTERVAL_S

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from conveyor.client.pool import QueuePool

log = logging.getLogger("conveyor.spark")

STATS_DDL = ("consumer long, host string, pid long, started double, finished double, processed long, failed long, "
             "retried long, dead long, timed_out long, stolen long, rows long")  # fmt: skip
STOP_PREFIX = b"conveyor-stop:"
FED_PREFIX = b"conveyor-fed:"  # + job and task: that task's prelude is done

Prelude = Callable[[Iterator["pa.RecordBatch"], int], int]  # (the task's input batches, task index) -> rows fed
# task index -> the rows it yields once drained; it may return counts to add to the task's stats row
Epilogue = Callable[[int], Generator["pa.RecordBatch", None, "dict[str, int] | None"]]


def _key(prefix: bytes, job: str) -> str:
    return hashlib.sha256(prefix + job.encode()).hexdigest()


def _fed_keys(job: str, n: int) -> list[str]:
    """The blobs by which each of the n tasks of a job says it has put its rows on the queue."""
    return [_key(FED_PREFIX, f"{job}:{i}") for i in range(n)]


def _stats_queue(job: str) -> str:
    return f"conveyor-consumers-{job}"


def _consume(pool: QueuePool, queues: list[QueueConfig | str], n: int, job: str, options: dict[str, Any],
             prelude: Prelude | None, epilogue: Epilogue | None) -> Any:  # fmt: skip
    """The function each Spark task runs: its prelude (if any), one consumer, then one row of counts
    (or, with an epilogue, the epilogue's rows, the counts going to the stats queue)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        index = cast("TaskContext", TaskContext.get()).partitionId()  # always set inside a Spark task
        rows = 0
        expect_more = None
        if prelude is None:
            for _ in batches:  # the range rows: only the partition number matters
                pass
        else:
            rows = prelude(batches, index)
            pool.put_blob(FED_PREFIX + f"{job}:{index}".encode())
            fed = _fed_keys(job, n)

            def expect_more() -> bool:  # another task is still feeding the queue
                return any(pool.get_blob(k) is None for k in fed)

        stop = _key(STOP_PREFIX, job)
        consumer = Consumer(pool, queues, consumer=index, n_consumers=n, stop_when=lambda: pool.get_blob(stop) is not None,
                            expect_more=expect_more, name=f"spark:{job}:{index}:{os.getpid()}", **options)  # fmt: skip
        old = sys.getswitchinterval()
        sys.setswitchinterval(CONSUMER_SWITCH_INTERVAL_S)  # see conveyor.worker.consumer_pool
        started = time.time()
        try:
            s = consumer.run()
        finally:
            sys.setswitchinterval(old)
        row = {"consumer": index, "host": os.uname().nodename, "pid": os.getpid(), "started": started,
               "finished": time.time(), "processed": s.processed, "failed": s.failed, "retried": s.retried,
               "dead": s.dead, "timed_out": s.timed_out, "stolen": s.stolen, "rows": rows}  # fmt: skip
        if epilogue is None:
            yield pa.RecordBatch.from_pylist([row])
            return
        counts = yield from epilogue(index)
        row.update(counts or {})
        pool.put(_stats_queue(job), [Message(payload=json.dumps(row).encode())])
        pool.close()

    return run


class SparkConsumerPool:
    """Consumers as Spark tasks: `run()` until drained, or `start()` ... `stop()`.

    n_consumers: Spark tasks to run (default: `spark.sparkContext.defaultParallelism`, one per slot).
    The other options are `Consumer`'s; `until_empty=False` keeps consumers running until `stop()`.
    feed: (df, prelude): each consumer task first runs `prelude(batches, task)` over its share of
        df's rows (df coalesced to n_consumers tasks: no shuffle), e.g. to put them on the queue,
        then consumes; drained queues end no consumer before every task's prelude is done. This is
        how `map` overlaps putting rows on the queue with working them off.
    then: (schema, epilogue): `dataframe()` has this schema and each task yields `epilogue(task)`
        once the queues are drained (every task's work done); `consumer_stats()` gives the counts,
        with those the epilogue returned (a generator's return value).
    """

    def __init__(self, spark: SparkSession, pool: QueuePool, n_consumers: int | None = None, *,
                 queues: Sequence[QueueConfig | str] = ("default",), batch_size: int | None = None,
                 max_concurrency: int = DEFAULT_MAX_CONCURRENCY, concurrency: Literal["thread", "process"] = "thread",
                 task_modules: Sequence[str] = (), until_empty: bool = True, pin_core: bool = False,
                 description: str | None = None, feed: tuple[DataFrame, Prelude] | None = None,
                 then: tuple[StructType, Epilogue] | None = None) -> None:  # fmt: skip
        self.spark = spark
        self.pool = pool
        check_consumer_options(n_consumers, max_concurrency, batch_size, concurrency, pin_core)
        self.n_consumers = default_parallelism(spark) if n_consumers is None else n_consumers
        check_workers_python(spark)
        self.queues = list(queues)
        names = ", ".join(q if isinstance(q, str) else q.name for q in self.queues)
        self.options = {"batch_size": batch_size, "max_concurrency": max_concurrency, "concurrency": concurrency,
                        "task_modules": list(task_modules), "until_empty": until_empty, "pin_core": pin_core}  # fmt: skip
        self.job = uuid.uuid4().hex[:12]
        self.description = description or (f"conveyor: {self.n_consumers} consumer(s) x {max_concurrency} "
                                            f"{concurrency}(s) on {names}")  # fmt: skip
        self.feed = feed
        self.then = then
        self.stats: list[dict[str, Any]] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def dataframe(self) -> DataFrame:
        """The (lazy) DataFrame whose evaluation runs the consumers: one row of counts per consumer
        (with `then`: the epilogues' rows)."""
        schema, epilogue = self.then if self.then is not None else (STATS_DDL, None)
        prelude = None if self.feed is None else self.feed[1]
        fn = _consume(self.pool, self.queues, self.n_consumers, self.job, self.options, prelude, epilogue)
        if self.feed is None:
            return self.spark.range(self.n_consumers, numPartitions=self.n_consumers).mapInArrow(fn, schema)
        return self.feed[0].coalesce(self.n_consumers).mapInArrow(fn, schema)

    def job_group(self) -> _JobGroup:
        """A context naming the Spark jobs started inside it after these consumers (in the Spark UI)."""
        return _JobGroup(self.spark, f"conveyor-{self.job}", self.description)

    def run(self) -> list[dict[str, Any]]:
        """Run the consumers as one Spark job and return each one's counts (blocks until they end)."""
        if self.then is not None:
            raise ConveyorError("SparkConsumerPool.run() with `then`: evaluate dataframe() and call consumer_stats()")
        with self.job_group():
            rows = self.dataframe().collect()
        self.stats = sorted((r.asDict() for r in rows), key=lambda r: r["consumer"])
        self._forget_markers()
        return self.stats

    def consumer_stats(self) -> list[dict[str, Any]]:
        """With `then`, once `dataframe()` was evaluated: each consumer's counts (a consumer's Spark
        task that ran again, e.g. after its executor was lost, counts once, as its last run)."""
        name = _stats_queue(self.job)
        latest: dict[str, list[dict[str, Any]]] = {}
        while got := self.pool.get(name, 1000):
            self.pool.ack(name, [m.id for m in got])
            for m in got:
                row = json.loads(m.payload)
                latest.setdefault(row["consumer"], []).append(row)
        self.stats = [max(rows, key=lambda r: r["finished"]) for _, rows in sorted(latest.items())]
        try:
            self.pool.drop(name)  # read once: nothing else needs it
        except ConveyorError as e:  # the work is done; a leftover is no reason to fail it
            log.warning("could not drop %s: %s", name, e)
        self._forget_markers()
        return self.stats

    def _forget_markers(self) -> None:
        """The consumers have ended: the blobs that told them a task had fed the queue, or to stop, can go."""
        keys = _fed_keys(self.job, self.n_consumers) if self.feed is not None else []
        try:
            self.pool.forget_blobs([*keys, _key(STOP_PREFIX, self.job)])
        except ConveyorError as e:
            log.warning("could not remove the markers of %s: %s", self.job, e)

    def start(self) -> SparkConsumerPool:
        """Run in a background thread of the driver; `join()` waits, `stop()` ends it early."""

        def target() -> None:
            try:
                self.run()
            except BaseException as e:
                self._error = e

        self._thread = threading.Thread(target=target, name=f"conveyor-spark-{self.job}", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Wait for the consumers to end; re-raises the Spark job's error."""
        if self._thread is None:
            raise ConveyorError("SparkConsumerPool.join() before start()")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the Spark consumers still run after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self.stats is not None
        return self.stats

    def stop(self, wait: bool = True, timeout: float | None = None) -> None:
        """Tell the consumers to stop (each finishes its running tasks); with `wait`, wait for them."""
        if self._thread is not None and not self._thread.is_alive():
            return  # they have ended (and nobody would remove the marker)
        self.pool.put_blob(STOP_PREFIX + self.job.encode())  # its key: _key(STOP_PREFIX, job)
        if wait and self._thread is not None:
            self.join(timeout)


def check_consumer_options(n_consumers: int | None, max_concurrency: int, batch_size: int | None, concurrency: str,
                           pin_core: bool) -> None:  # fmt: skip
    """Refuse bad consumer settings here, on the driver, rather than in every Spark task."""
    for name, value in (("n_consumers", n_consumers), ("max_concurrency", max_concurrency), ("batch_size", batch_size)):
        if value is not None and (type(value) is not int or value < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if concurrency not in ("thread", "process"):
        raise ValueError(f"concurrency must be 'thread' or 'process', got {concurrency!r}")
    check_pin(pin_core, concurrency)


def default_parallelism(spark: SparkSession) -> int:
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect: no SparkContext; ask the configuration
        return int(spark.conf.get("spark.default.parallelism", "2") or 2)


class _JobGroup:
    """Name a job in the Spark UI: a job group and description, or (Spark Connect) a tag."""

    def __init__(self, spark: SparkSession, group: str, description: str) -> None:
        self.spark, self.group, self.description = spark, group, description
        self._sc: Any = None

    def __enter__(self) -> None:
        try:
            self._sc = self.spark.sparkContext
        except Exception:
            self._sc = None
        if self._sc is not None:
            self._sc.setJobGroup(self.group, self.description, interruptOnCancel=True)
        else:
            try:
                self.spark.addTag(self.group)
            except Exception as e:  # naming is a courtesy: never fail the job for it
                log.debug("could not tag the Spark job: %s", e)

    def __exit__(self, *exc: object) -> None:
        if self._sc is not None:
            self._sc.setLocalProperty("spark.jobGroup.id", None)
            self._sc.setLocalProperty("spark.job.description", None)
        else:
            try:
                self.spark.removeTag(self.group)
            except Exception as e:
                log.debug("could not untag the Spark job: %s", e)
