"""A queue job's read-back started once its work is done, while the consumers' Spark job ends.

The consumers end once the queue is drained, but their Spark job takes another 30-90 ms to end
(each task returns its counts, the driver hears of it, reads and drops the job's bookkeeping), and
a Spark job run after it takes 50-100 ms before its tasks run (planned, submitted, handed to the
Python workers): in W1, two tenths of a second of a 1.2 s map. Started from a thread as soon as
the servers say the work is done, the read-back's job is planned and submitted while the
consumers' job ends, and its tasks take the consumers' slots as they free them. Spark's FIFO
scheduling offers a free slot to the consumers' job first, so that a consumer task run again
(after a failure) never waits behind the read-back.

Done means every row put (`work_done`: each fed task recorded its rows) and nothing pending in
the job's queue on any server: every result is then stored, and the read-back reads what a
read-back after the consumers' job would. The consumers' job ending well means the work is done
too: from then on the thread waits no more, so the read-back runs whatever the servers said.
The consumers' job failing stops the thread, and cancels the read-back's Spark job if it had
started.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("conveyor.spark")

POLL_S = 0.02  # how often the servers are asked whether every row is put (a stats call of ~1 ms each)
DRAIN_WAIT_S = 0.5  # then, how long each ask waits for the queue to drain (the servers answer when it does)
ABANDON_S = 30.0  # a read-back cancelled after the consumers failed: how long their error waits for it to stop


class ReadAhead:
    """In a thread: `plan()` at once, then `read(plan)` once `work_done(wait_s)` or once told the consumers ended (`result`).

    `work_done(wait_s)` may wait up to `wait_s` for the work to be done.

    A context: leaving it otherwise than through `result` (the consumers' job failed, or Ctrl-C)
    stops the thread, and `cancel()`s the read-back's Spark job if `read` was called.
    """

    def __init__(
        self,
        plan: Callable[[], DataFrame],
        read: Callable[[DataFrame], DataFrame],
        work_done: Callable[[float], bool],
        cancel: Callable[[], None],
    ) -> None:
        self._plan, self._read, self._work_done, self._cancel = plan, read, work_done, cancel
        self._consumers_ended = threading.Event()
        self._lock = threading.Lock()  # `_abandoned` and `_reading`: a read never starts after an abandon
        self._abandoned = False
        self._reading = False
        self._frame: DataFrame | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="conveyor-read-ahead", daemon=True)

    def __enter__(self) -> ReadAhead:
        self._thread.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        if not self._thread.is_alive():  # `result` saw it end
            return
        with self._lock:
            self._abandoned, reading = True, self._reading
        self._consumers_ended.set()  # the thread's wait ends at once
        if reading:
            self._cancel()
        self._thread.join(ABANDON_S)
        if self._thread.is_alive():
            log.warning("the read-back's Spark job did not stop within %.0f s of its cancel", ABANDON_S)

    def result(self) -> DataFrame:
        """The consumers' job ended well: the read-back's output, once it has run (its error, if it failed).

        Waits for the read-back's Spark job as the job's other steps wait for theirs: Spark's own
        bounds (a task's failures, an executor's loss) end it.
        """
        self._consumers_ended.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._frame is not None  # set by the thread when it ended without an error
        return self._frame

    def _run(self) -> None:
        try:
            plan = self._plan()  # Spark's plan of the read-back, made while the consumers run (~30 ms of py4j)
            while not self._consumers_ended.is_set():
                try:
                    if self._work_done(DRAIN_WAIT_S):
                        break
                except Exception as e:  # a server out of reach: the consumers' job deals with it
                    log.debug("read-ahead: could not tell whether the work is done: %s", e)
                self._consumers_ended.wait(POLL_S)
            with self._lock:
                if self._abandoned:
                    return
                self._reading = True
            self._frame = self._read(plan)
        except BaseException as e:  # handed to `result`, in the caller's thread
            self._error = e
