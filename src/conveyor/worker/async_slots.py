"""Async slots: a consumer's tasks as coroutines on one event loop, many calls in flight.

For tasks that wait (web APIs, language models, anything behind a socket): `n` calls run at once on
one loop in one thread of the consumer, where threads would cost a thread each. An `async def` task
is awaited on the loop (`run_message_async`). A plain one (`runs_on_loop` tells them apart) would
block every call there: it goes to `ThreadSlots` of its own, `ASYNC_PLAIN_THREADS` daemon threads at
most, started with the first, and is theirs from then on (its time limit counts from when a thread
starts it).

A call over its time limit is cancelled (`stop_task`: the coroutine gets `CancelledError`); the
consumer fails it as a time limit, and whatever the call does after is dropped. A plain task's
thread cannot be cancelled: it is abandoned (it may still run) and another thread takes its place,
as thread slots do. `close` either lets what runs and what waits in line end, or cancels it all for
the consumer to hand back; a cancelled call is awaited before the loop closes, however long it takes
to end. While every call waits, the loop sleeps in its selector, and the consumer's loop on its
completions: nothing polls.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass

from conveyor.client.sharded import format_id
from conveyor.constants import ASYNC_PLAIN_THREADS
from conveyor.message import Message
from conveyor.tasks.runner import run_message_async, runs_on_loop, take_loop_end
from conveyor.worker.completions import Completions
from conveyor.worker.connections import WorkerConnections
from conveyor.worker.executors import Completion, ThreadSlots, failure

log = logging.getLogger("conveyor.worker")

CANCEL_WAIT_S = 5.0  # how long cancelled calls may take to end before they are named in the log and cancelled again


@dataclass(eq=False, slots=True)
class _Call:
    """One message's run on the loop."""

    message: Message
    started: float  # monotonic
    task: asyncio.Task[None] | None = None  # set on the loop as it starts
    stopped: bool = False  # cancelled by stop_task or close: what it does from then on is no one's


class AsyncSlots:
    """`n` calls at once on one event loop, in a thread of its own (see the module docstring)."""

    kind = "async"

    def __init__(self, n: int, done: Completions[Completion], conns: WorkerConnections | None) -> None:
        self.n = n
        self._done = done
        self._conns = conns
        self._plain = ThreadSlots(min(n, ASYNC_PLAIN_THREADS), done, conns)  # plain tasks' threads
        self._plain_started = False  # with the first plain task (under the lock)
        self._loop = asyncio.new_event_loop()
        # over all that the consumer's thread and the loop's share: the line, the calls (and each one's
        # `stopped`), the flags below; `_tasks` is the loop's alone, `_broken` is set once under it
        self._lock = threading.Lock()
        self._line: collections.deque[Message] = collections.deque()  # submitted, waiting for a call to end
        self._calls: dict[tuple[str, int], _Call] = {}  # running, by message key
        self._tasks: dict[asyncio.Task[None], Message] = {}  # every call's task until it ends, stopped ones included (loop only)
        self._fill_due = False  # a fill is scheduled on the loop: submits in a row wake it once
        self._closing = False  # close was called: the loop's end is asked for
        self._ended = False  # the loop runs no more: it is being wound down, or closed
        self._broken: str | None = None  # why the loop ended without being asked to
        self._ran_out = threading.Event()  # run_forever has returned: no call starts or ends from now on
        self._thread = threading.Thread(target=self._serve, name="conveyor-async", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        """The loop's thread: run until `close`, then cancel what is left and close the loop.

        A loop that ends unasked breaks the slots: asyncio lets a SystemExit or KeyboardInterrupt
        out of a task a call created, and a call may stop the loop. Its calls can never end: the
        consumer, told by `broken`, stops and hands their messages back.
        """
        asyncio.set_event_loop(self._loop)  # for tasks that ask for the loop the old way
        why = "a call stopped it (tasks share the loop: none may stop it)"
        try:
            self._loop.run_forever()
        except BaseException as e:
            why = f"{e!r} came out of it (asyncio lets SystemExit and KeyboardInterrupt out of a task a call creates)"
        finally:
            with self._lock:
                self._ended = True
                if not self._closing:
                    self._broken = f"its event loop ended: {why}; its calls are handed back"
                    for call in self._calls.values():
                        call.stopped = True  # ended here, not failed: the consumer hands them back
                    self._calls.clear()
            self._ran_out.set()
            if self._broken is not None:
                log.error("async slots: %s", self._broken)
            self._wind_down()

    def _wind_down(self) -> None:
        """Cancel the calls left and await them, then close the loop: none is destroyed while pending.

        Their finally blocks run. A call that goes on after its cancel (it catches CancelledError, or
        cleans up slowly) is named in the log every CANCEL_WAIT_S and cancelled again; the thread is a
        daemon, so such a call keeps neither the consumer (`close` does not wait for it) nor the process.
        """
        while pending := [t for t in self._tasks if not t.done()]:
            try:
                for task in pending:
                    task.cancel()
                self._loop.run_until_complete(asyncio.wait(pending, timeout=CANCEL_WAIT_S))
            except BaseException as e:  # a SystemExit, say, from a call's finally block: the others are awaited still
                log.error("async slots: %r came out of the event loop as its calls were cancelled", e)
            if going_on := sorted(self._tasks[t].id for t in pending if not t.done()):
                log.warning(
                    "async slots: calls of messages %s go on %g s after their cancel; cancelled again", going_on, CANCEL_WAIT_S
                )
        for close in take_loop_end(self._loop):  # what tasks keep open across calls (an instance's aclose)
            try:
                self._loop.run_until_complete(asyncio.wait_for(close(), CANCEL_WAIT_S))
            except BaseException as e:
                log.warning("async slots: closing what a task kept open on the loop failed: %r", e)
        with contextlib.suppress(BaseException):  # async generators left by the calls: their cleanup, if it fails, is theirs
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    @property
    def broken(self) -> str | None:
        """Why no call will ever run (the loop ended unasked): the consumer stops; None while it runs.

        Set once, under the lock, before the loop's thread ends; read as one reference.
        """
        return self._broken

    # --- the consumer's side ----------------------------------------------------------------
    def submit(self, message: Message) -> None:
        """Run `message` as soon as fewer than `n` calls run (it waits in line meanwhile)."""
        with self._lock:
            self._line.append(message)
            if self._fill_due:
                return
            self._fill_due = True
        with contextlib.suppress(RuntimeError):  # the loop has closed (`broken` says why): the message waits in line, given back
            self._loop.call_soon_threadsafe(self._fill)

    def started(self, key: tuple[str, int]) -> float | None:
        """When the call of the message `key` started, or a thread its plain task (None: it waits in line, or has ended)."""
        with self._lock:  # the calls change on the loop's thread; and a plain task moves to the threads under it
            call = self._calls.get(key)
            if call is not None:
                return call.started
        return self._plain.started(key)

    def unstarted(self) -> list[Message]:
        """Take back the messages waiting in line (a stopping consumer gives them back)."""
        with self._lock:
            out = list(self._line)
            self._line.clear()
        return out + self._plain.unstarted()

    def stop_task(self, key: tuple[str, int]) -> str | None:
        """Cancel the call of the message `key`, or abandon its plain task's thread; its place goes to the next in line."""
        with self._lock:
            call = self._calls.pop(key, None)
            if call is not None:
                call.stopped = True
        if call is None:
            return self._plain.stop_task(key)
        with contextlib.suppress(RuntimeError):  # the loop has closed: the call ended with it
            self._loop.call_soon_threadsafe(self._cancel, [call])
        return "its call was cancelled"

    def close(self, wait: bool = True) -> None:
        """End the slots once what runs and what waits in line has ended (`wait`), else at once.

        Waiting, as thread slots do, the calls run to their end and so does the line, plain tasks
        included: messages acked on delivery, which a stopping consumer puts back in line to run
        here, are not dropped. A loop that has ended (`broken`) runs nothing more. Not waiting, the
        calls are cancelled, the plain tasks' threads abandoned and the line dropped: the consumer
        hands all of them back. Either way, calls cancelled earlier (over their time limit) are the
        loop thread's to await as it winds down, for CANCEL_WAIT_S here at most.
        """
        with self._lock:
            self._closing, ended = True, self._ended
            calls = [] if wait else list(self._calls.values())
            for call in calls:
                call.stopped = True
            if not wait:
                self._calls.clear()
                self._line.clear()
        if not self._thread.ident:  # never started: nothing ran
            self._loop.close()
            return
        if not ended:  # else it winds down on its own
            with contextlib.suppress(RuntimeError):  # it has closed meanwhile
                self._loop.call_soon_threadsafe(self._cancel, calls)  # a fill: it ends the loop once nothing is left
        if not wait:
            self._plain.close(wait=False)  # their tasks go on, in daemon threads; their outcomes are dropped
            return
        self._ran_out.wait()  # the calls and the line have ended: no more plain tasks come
        self._plain.close(wait=True)
        self._thread.join(CANCEL_WAIT_S)

    # --- on the loop -------------------------------------------------------------------------
    def _fill(self) -> None:
        """Start calls for what waits in line, while fewer than `n` run; closing, end the loop once nothing is left."""
        now = time.monotonic()
        starting: list[_Call] = []
        with self._lock:
            self._fill_due = False
            if self._ended:  # winding down (not to be stopped): what waits in line is the consumer's to give back
                return
            while self._line and len(self._calls) < self.n:
                m = self._line.popleft()
                call = self._calls[m.queue, m.id] = _Call(m, now)
                starting.append(call)
            finished = self._closing and not self._calls and not self._line
        if finished:
            self._loop.stop()
        for call in starting:
            call.task = task = self._loop.create_task(self._run(call))
            self._tasks[task] = call.message
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)

    def _cancel(self, calls: list[_Call]) -> None:
        for call in calls:
            if call.task is not None:
                call.task.cancel()
        self._fill()  # their places are free

    async def _run(self, call: _Call) -> None:
        """Run one message; its outcome goes to the consumer unless the call was stopped meanwhile.

        A plain task goes to the threads instead: its place here is free at once.
        """
        m = call.message
        if not runs_on_loop(m, fetch=self._conns):
            self._to_threads(call)
            return
        try:
            result, error = (
                await run_message_async(m, fetch=self._conns, backend=None if self._conns is None else self._conns.pool),
                None,
            )
        except BaseException as e:  # a CancelledError not of ours (from what the task awaited) fails it as any error
            if call.stopped:  # read without the lock: it never goes back to False, and the lock is taken below
                return
            result, error = None, failure(m, e)
        with self._lock:
            if call.stopped:  # over its time limit, settled then; or closing, handed back
                log.info("cancelled call of message %s ended: its outcome is dropped", format_id(m.id))
                return
            del self._calls[m.queue, m.id]
            refill = self._closing or bool(self._line)
        self._done.put(Completion(m, result, error, 0, time.monotonic() - call.started))
        if refill:
            self._fill()

    def _to_threads(self, call: _Call) -> None:
        """Hand a plain task's message to the threads (unless its call was stopped meanwhile: then it is the consumer's)."""
        m = call.message
        with self._lock:  # against close: the threads start and take it before close ends them, or not at all
            if call.stopped:
                return
            if not self._plain_started:
                self._plain.start()
                self._plain_started = True
            del self._calls[m.queue, m.id]
            self._plain.submit(m)  # under the lock too: `started` and `stop_task` find it here or there
        self._fill()
