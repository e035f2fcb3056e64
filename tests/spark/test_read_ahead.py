"""ReadAhead: the read-back starts once the work is done, before the consumers' job ends, and never after it failed."""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest

from conveyor.spark.read_ahead import ReadAhead

pytestmark = pytest.mark.timeout(30)

WAIT_S = 10.0  # bound on each wait below: the thread acts within milliseconds


class Steps:
    """A read-back's steps as plain callables, recording what ran."""

    def __init__(self, read_blocks: bool = False) -> None:
        self.done = threading.Event()  # the work is done, as the servers would say
        self.reading = threading.Event()
        self.cancelled = threading.Event()
        self.read_blocks = read_blocks  # a read that runs until cancelled
        self.waits: list[float] = []

    def plan(self) -> Any:
        return "plan"

    def read(self, plan: Any) -> Any:
        self.reading.set()
        if self.read_blocks:
            assert self.cancelled.wait(WAIT_S), "the read was never cancelled"
            raise RuntimeError("cancelled")
        return f"frame of {plan}"

    def work_done(self, wait_s: float) -> bool:
        self.waits.append(wait_s)
        return self.done.is_set()

    def cancel(self) -> None:
        self.cancelled.set()

    def ahead(self) -> ReadAhead:
        return ReadAhead(self.plan, self.read, self.work_done, self.cancel)


def test_the_read_starts_once_the_work_is_done_before_the_consumers_end() -> None:
    steps = Steps()
    with steps.ahead() as ahead:
        assert not steps.reading.wait(0.1)  # the work is not done: no read yet
        steps.done.set()
        assert steps.reading.wait(WAIT_S)  # the consumers' job has not ended: the read runs already
        assert cast(str, ahead.result()) == "frame of plan"
    assert not steps.cancelled.is_set()


def test_the_consumers_ending_well_starts_the_read_whatever_the_servers_said() -> None:
    steps = Steps()
    with steps.ahead() as ahead:
        assert cast(str, ahead.result()) == "frame of plan"  # work_done never said so
    assert steps.reading.is_set() and steps.waits


def test_a_failure_of_the_consumers_before_the_work_is_done_runs_no_read() -> None:
    steps = Steps()
    with pytest.raises(KeyboardInterrupt), steps.ahead():
        raise KeyboardInterrupt
    steps.done.set()  # too late: the thread has ended
    assert not steps.reading.is_set() and not steps.cancelled.is_set()


def test_a_failure_of_the_consumers_during_the_read_cancels_it() -> None:
    steps = Steps(read_blocks=True)
    steps.done.set()
    with pytest.raises(RuntimeError, match="consumers failed"), steps.ahead():
        assert steps.reading.wait(WAIT_S)
        raise RuntimeError("consumers failed")
    assert steps.cancelled.is_set()


def test_a_failed_read_raises_in_the_caller() -> None:
    steps = Steps(read_blocks=True)
    steps.done.set()
    steps.cancelled.set()  # the read fails at once
    with steps.ahead() as ahead, pytest.raises(RuntimeError, match="cancelled"):
        ahead.result()
