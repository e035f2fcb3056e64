"""A hypothesis state machine driving each store against a plain-Python model of the contract.

Time plays no part here (leases are long, nothing is delayed); the conformance suite covers time.
After a DurableStore is reopened, READY messages are served in id order within a priority, so the
model re-sequences them the same way.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conveyor.message import Message, Status
from conveyor.storage import DurableStore, MemoryStore, Store

LEASE = 3600.0


@dataclass
class Model:
    payload: bytes
    priority: int
    max_attempts: int
    status: Status = Status.READY
    attempts: int = 0
    seq: int = 0  # when it last became READY: FIFO order within a priority
    result: bytes | None = None
    error: str | None = None


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="conveyor-stateful-"))
        self.store = self.open()
        self.model: dict[int, Model] = {}
        self.seq = itertools.count()

    def open(self) -> Store:
        raise NotImplementedError

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def ids_in(self, *statuses: Status) -> list[int]:
        return [i for i, m in self.model.items() if m.status in statuses]

    @rule(batch=st.lists(st.tuples(st.integers(-2, 2), st.integers(0, 3), st.binary(max_size=40)), min_size=1, max_size=8))
    def put(self, batch: list[tuple[int, int, bytes]]) -> None:
        ids = self.store.put([Message(payload=p, priority=pr, max_attempts=ma) for pr, ma, p in batch])
        assert len(ids) == len(batch) and all(i not in self.model for i in ids)
        for i, (pr, ma, p) in zip(ids, batch, strict=True):
            self.model[i] = Model(p, pr, ma or self.store.max_attempts, seq=next(self.seq))

    @rule(n=st.integers(0, 6))
    def get(self, n: int) -> None:
        got = self.store.get(n, lease_s=LEASE)
        ready = sorted(self.ids_in(Status.READY), key=lambda i: (-self.model[i].priority, self.model[i].seq))
        assert [m.id for m in got] == ready[:n]
        for m in got:
            mm = self.model[m.id]
            mm.status = Status.DELIVERED
            mm.attempts += 1
            assert (m.payload, m.priority, m.attempts) == (mm.payload, mm.priority, mm.attempts)

    @rule(data=st.data(), result=st.none() | st.binary(max_size=20))
    def ack(self, data: st.DataObject, result: bytes | None) -> None:
        i = data.draw(st.sampled_from([*self.model, 10**9]) if self.model else st.just(10**9))
        m = self.model.get(i)
        expected = m is not None and m.status in (Status.READY, Status.DELIVERED)
        assert self.store.ack(i, result) == expected
        if expected:
            assert m is not None
            m.status, m.result = Status.ACKED, result

    @rule(data=st.data(), error=st.text(max_size=10))
    def nack(self, data: st.DataObject, error: str) -> None:
        i = data.draw(st.sampled_from([*self.model, 10**9]) if self.model else st.just(10**9))
        m = self.model.get(i)
        expected = m is not None and m.status == Status.DELIVERED
        assert self.store.nack(i, error) == expected
        if expected:
            assert m is not None
            if m.attempts >= m.max_attempts:
                m.status, m.error = Status.FAILED, error
            else:
                m.status, m.seq = Status.READY, next(self.seq)

    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        done = self.ids_in(Status.ACKED, Status.FAILED)
        if not done:
            return
        ids = data.draw(st.lists(st.sampled_from(done), max_size=3, unique=True))
        n = sum((self.model[i].result is not None) + (self.model[i].error is not None) for i in ids)
        assert self.store.forget(ids) == n
        for i in ids:
            self.model[i].result = self.model[i].error = None

    @invariant()
    def matches_model(self) -> None:
        s = self.store.stats()
        count = {st_: len(self.ids_in(st_)) for st_ in Status}
        assert (s.ready, s.delivered, s.acked, s.failed, s.delayed) == (
            count[Status.READY],
            count[Status.DELIVERED],
            count[Status.ACKED],
            count[Status.FAILED],
            0,
        )
        for i, m in self.model.items():
            assert self.store.status(i) == m.status, i
        assert list(self.store.results()) == sorted((i, m.result) for i, m in self.model.items() if m.result is not None)
        assert [(d.message.id, d.error, d.message.payload) for d in self.store.dead_letters()] == sorted(
            (i, m.error, m.payload) for i, m in self.model.items() if m.error is not None
        )


class MemoryMachine(StoreMachine):
    def open(self) -> Store:
        return MemoryStore("q", max_attempts=2)


class DurableMachine(StoreMachine):
    def open(self) -> Store:
        return DurableStore(self.dir, queue="q", max_attempts=2, fsync="never", segment_bytes=4096)

    @precondition(lambda self: self.model)
    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = self.open()
        # after a restart READY messages are served in id order within their priority
        for i in sorted(self.ids_in(Status.READY)):
            self.model[i].seq = next(self.seq)


TestMemoryStoreModel = MemoryMachine.TestCase
TestMemoryStoreModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestDurableStoreModel = DurableMachine.TestCase
TestDurableStoreModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
