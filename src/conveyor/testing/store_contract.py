"""`StoreContract`: the behaviour every queue store must have, as a pytest test class to subclass.

Every store in Conveyor passes it (`tests/storage/test_store_conformance.py`), and so must a store kept
elsewhere before a server holds queues in it (`conveyor.server.store_kinds`). Subclass it in a test
module, under a name pytest collects, and say how to open a store; every test below then runs
against yours::

    from pathlib import Path
    from conveyor.storage import MemoryStore, Store
    from conveyor.testing import StoreContract

    class TestMyStore(StoreContract):
        def make(self, directory: Path, *, max_attempts: int = 5) -> Store:
            return MemoryStore("q", max_attempts=max_attempts)

It needs pytest (in Conveyor's `test` extra): the tests take pytest fixtures (`tmp_path`,
`monkeypatch`) and check errors with `pytest.raises`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.constants import DEFAULT_MAX_ATTEMPTS
from conveyor.errors import StoreClosedError
from conveyor.message import Message, Status
from conveyor.storage import Store

WAIT_S = 5.0  # the longest a test waits for a delay or a lease to run out (each is under a second)


def _wait_for(cond: Callable[[], object], timeout: float = WAIT_S) -> None:
    """Poll `cond` until it is truthy, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.005)


def _get_when_due(store: Store, n: int) -> list[Message]:
    """The first messages a `get(n)` delivers, polling until one is due (failing after WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while not (got := store.get(n)):
        if time.monotonic() > deadline:
            raise AssertionError(f"no message came due within {WAIT_S} s")
        time.sleep(0.005)
    return got


def _msgs(*payloads: bytes, max_attempts: int = 0) -> list[Message]:
    return [Message(payload=p, max_attempts=max_attempts) for p in payloads]


def _wrong(value: object) -> Any:
    """`value`, typed as anything: an argument of the wrong type, passed on purpose to see it refused."""
    return value


class StoreContract:
    """Behaviour every `Store` must have. Subclasses say how to open one (`make`)."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Store]:
        """A new store, made by `make` in a directory of its own, closed after the test."""
        s = self.make(tmp_path)
        yield s
        s.close()

    def make(self, directory: Path, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Store:
        """Open a new, empty store in `directory` (an empty directory of the test's own).

        max_attempts: the store's default for messages put without their own.
        """
        raise NotImplementedError(f"{type(self).__name__} must define make(directory, *, max_attempts) -> Store")

    # --- put and get ----------------------------------------------------------------------
    def test_put_assigns_ascending_ids(self, store: Store) -> None:
        a = store.put(_msgs(b"a", b"b", b"c"))
        b = store.put(_msgs(b"d"))
        assert a == sorted(a) and len(set(a)) == 3
        assert b[0] > a[-1]
        assert store.put([]) == []

    def test_get_returns_payload_and_metadata(self, store: Store) -> None:
        before = time.time()
        [i] = store.put([Message(payload=b"x" * 100, priority=3, headers={"k": "v"}, max_attempts=7)])
        [m] = store.get(1, lease_s=12.5)
        assert (m.id, m.payload, m.priority, m.headers, m.max_attempts) == (i, b"x" * 100, 3, {"k": "v"}, 7)
        assert m.attempts == 1 and m.lease_s == 12.5
        assert before - 1 <= m.enqueued_at <= time.time() + 1

    def test_priority_order_then_fifo(self, store: Store) -> None:
        ids = store.put([Message(payload=bytes([i]), priority=p) for i, p in enumerate([0, 5, 0, 5, -1, 9])])
        got = [m.id for m in store.get(10)]
        assert got == [ids[5], ids[1], ids[3], ids[0], ids[2], ids[4]]

    def test_get_respects_n_and_empty(self, store: Store) -> None:
        store.put(_msgs(*[b"%d" % i for i in range(10)]))
        assert len(store.get(3)) == 3
        assert len(store.get(0)) == 0
        assert len(store.get(100)) == 7
        assert store.get(5) == []

    def test_requeued_message_goes_behind_waiting_ones(self, store: Store) -> None:
        a, b, c = store.put(_msgs(b"a", b"b", b"c"))
        [m] = store.get(1)
        assert m.id == a
        assert store.nack(a, "retry")
        assert [x.id for x in store.get(3)] == [b, c, a]

    def test_a_message_whose_lease_ran_out_goes_ahead_of_waiting_ones(self, store: Store) -> None:
        """Its worker was lost: it runs again next, not after the backlog (a lost host's work comes back within a lease)."""
        a, b, c = store.put(_msgs(b"a", b"b", b"c"))
        [m] = store.get(1, lease_s=0.05)
        assert m.id == a
        assert store.expire(time.time() + 1) == 1
        assert [x.id for x in store.get(3)] == [a, b, c]

    # --- delays ---------------------------------------------------------------------------
    def test_not_served_before_not_before(self, store: Store) -> None:
        due = time.time() + 0.3
        [late] = store.put([Message(payload=b"late", not_before=due)])
        [now] = store.put(_msgs(b"now"))
        assert [m.id for m in store.get(10)] == [now]
        assert store.stats().delayed == 1
        got = _get_when_due(store, 10)
        assert [m.id for m in got] == [late]
        assert store.clock() >= due  # not before, by the store's clock (the wall clock as of its opening)

    def test_nack_with_delay(self, store: Store) -> None:
        [i] = store.put(_msgs(b"x"))
        store.get(1)
        t0 = store.clock()
        assert store.nack(i, "later", delay_s=0.3)
        assert store.get(1) == []
        assert store.status(i) == Status.READY
        got = _get_when_due(store, 1)
        assert got[0].id == i and got[0].attempts == 2
        assert store.clock() - t0 >= 0.3

    def test_nack_each_gives_each_message_its_own_delay(self, store: Store) -> None:
        assert store.poll_wait(5.0) == 5.0  # nothing delayed or leased: a poll waits all it may
        a, b, c = store.put(_msgs(b"a", b"b", b"c"))
        store.get(3)
        assert store.nack_each([a, b, c, 999], ["ea", "eb", "ec", "none"], [0.0, 60.0, 0.0, 0.0]) == [True, True, True, False]
        assert sorted(m.id for m in store.get(3)) == [a, c]  # b waits its 60 s
        assert store.status(b) == Status.READY
        assert 0 < store.poll_wait(1e9) <= 60.01  # never later than b's delay (maybe earlier: a lease)

    # --- leases ---------------------------------------------------------------------------
    def test_lease_expiry_returns_message_and_counts_attempt(self, store: Store) -> None:
        [i] = store.put(_msgs(b"x"))
        [m] = store.get(1, lease_s=0.1)
        assert m.attempts == 1 and store.status(i) == Status.DELIVERED
        assert store.get(1) == []
        _wait_for(lambda: store.expire() or store.status(i) == Status.READY)
        [m2] = store.get(1)
        assert m2.id == i and m2.attempts == 2

    def test_expire_with_explicit_now(self, store: Store) -> None:
        [i] = store.put(_msgs(b"x"))
        store.get(1, lease_s=100)
        assert store.expire(time.time()) == 0
        assert store.expire(time.time() + 101) == 1
        assert store.status(i) == Status.READY

    def test_a_step_of_the_wall_clock_does_not_end_leases(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        [i] = store.put(_msgs(b"x"))
        store.get(1, lease_s=30)
        wall = time.time
        monkeypatch.setattr(time, "time", lambda: wall() + 3600)  # the system clock is set an hour ahead
        assert store.expire() == 0 and store.status(i) == Status.DELIVERED
        assert store.get(1) == []

    def test_extend_lease(self, store: Store) -> None:
        [i] = store.put(_msgs(b"x"))
        store.get(1, lease_s=0.2)
        assert store.extend_lease(i, 100)
        assert store.expire(time.time() + 1) == 0
        assert store.status(i) == Status.DELIVERED
        assert store.expire(time.time() + 101) == 1
        assert not store.extend_lease(i, 10)  # READY again: nothing to extend
        assert not store.extend_lease(10**9, 10)

    def test_lease_expiry_on_last_attempt_fails(self, store: Store) -> None:
        [i] = store.put([Message(payload=b"x", max_attempts=1)])
        store.get(1, lease_s=0.05)
        assert store.expire(time.time() + 1) == 1
        assert store.status(i) == Status.FAILED
        [dl] = store.dead_letters()
        assert dl.message.id == i and "lease expired" in dl.error

    # --- retries and dead letters ---------------------------------------------------------
    def test_retries_to_dead_letter(self, store: Store) -> None:
        [i] = store.put([Message(payload=b"poison", max_attempts=3)])
        for attempt in range(1, 4):
            [m] = store.get(1)
            assert m.attempts == attempt
            assert store.nack(i, f"boom {attempt}")
        assert store.status(i) == Status.FAILED
        assert store.get(1) == []
        [dl] = store.dead_letters()
        assert (dl.message.id, dl.message.payload, dl.error, dl.message.attempts) == (i, b"poison", "boom 3", 3)
        s = store.stats()
        assert (s.failed, s.ready, s.delivered) == (1, 0, 0)

    def test_store_default_max_attempts(self, tmp_path: Path) -> None:
        s = self.make(tmp_path, max_attempts=2)
        try:
            [i] = s.put(_msgs(b"x"))
            s.get(1)
            s.nack(i, "1")
            s.get(1)
            s.nack(i, "2")
            assert s.status(i) == Status.FAILED
        finally:
            s.close()

    def test_final_nack_fails_at_once(self, store: Store) -> None:
        a, b = store.put(_msgs(b"a", b"b", max_attempts=5))
        store.get(2)
        assert store.nack_many([a, b], ["unknown task", "x"], final=True) == [True, True]
        assert store.status(a) == Status.FAILED and store.stats().failed == 2
        assert [d.error for d in store.dead_letters()] == ["unknown task", "x"]

    def test_totals_count_what_took_effect(self, store: Store) -> None:
        """The counters behind a server's metrics: each operation counts what it did, not what it was asked."""
        a, b, c, d, e = store.put(_msgs(b"a", b"b", b"c", b"d", b"e", max_attempts=2))
        store.get(5, lease_s=100)
        assert store.ack_many([a, a, 10**9], [b"r", b"s", b"t"]) == [True, False, False]
        assert store.nack_many([b, b]) == [True, False]  # an attempt left: ready again
        assert store.nack_many([c], ["no"], final=True) == [True]  # a dead letter
        assert store.release_many([d, a]) == [True, False]
        assert store.expire(time.time() + 101) == 1  # e: back to ready, an attempt left
        got = store.get(3, lease_s=100)  # b, d, e: b and e on their last attempt
        assert store.expire(time.time() + 101) == 3  # b and e dead letters, d ready
        t = store.totals
        assert (t.put, t.delivered, t.acked, t.nacked, t.released, t.expired, t.dead_lettered) == (5, 8, 1, 2, 1, 4, 3)
        assert sorted(m.id for m in got) == [b, d, e] and store.stats().failed == 3

    def test_release_returns_unstarted_messages_without_counting_an_attempt(self, store: Store) -> None:
        a, b = store.put(_msgs(b"a", b"b", max_attempts=1))
        [m, _] = store.get(2)
        assert m.attempts == 1
        assert store.release_many([a, a, 10**9]) == [True, False, False]
        assert store.status(a) == Status.READY
        [again] = store.get(1)
        assert again.id == a and again.attempts == 1  # still its first attempt: not a dead letter
        assert store.release_many([a, b]) == [True, True]

    def test_nack_only_delivered(self, store: Store) -> None:
        [i] = store.put(_msgs(b"x"))
        assert not store.nack(i, "not delivered")
        store.get(1)
        assert store.nack(i, "ok")
        assert not store.nack(i, "twice")
        assert not store.nack(10**9, "unknown")

    # --- acks and results -----------------------------------------------------------------
    def test_first_ack_wins(self, store: Store) -> None:
        [i] = store.put(_msgs(b"x"))
        store.get(1)
        assert store.ack(i, b"first")
        assert not store.ack(i, b"second")
        assert store.result(i) == b"first"
        assert store.status(i) == Status.ACKED
        assert not store.ack(10**9)

    def test_duplicate_ids_in_one_ack_batch(self, store: Store) -> None:
        [i] = store.put(_msgs(b"x"))
        store.get(1)
        assert store.ack_many([i, i], [b"a", b"b"]) == [True, False]
        assert store.result(i) == b"a"
        assert store.stats().acked == 1

    def test_late_ack_after_lease_expiry_counts(self, store: Store) -> None:
        [i] = store.put(_msgs(b"x"))
        store.get(1, lease_s=0.05)
        store.expire(time.time() + 1)
        assert store.status(i) == Status.READY
        assert store.ack(i, b"late but done")
        assert store.get(1) == []  # not served again
        assert store.result(i) == b"late but done"

    def test_ack_after_dead_letter_is_refused(self, store: Store) -> None:
        [i] = store.put([Message(payload=b"x", max_attempts=1)])
        store.get(1)
        store.nack(i, "final")
        assert not store.ack(i, b"too late")
        assert store.result(i) is None

    def test_results_by_id_and_iterator(self, store: Store) -> None:
        ids = store.put(_msgs(b"a", b"b", b"c", b"d"))
        store.get(4)
        assert store.ack_many([ids[2], ids[0], ids[1]], [b"rc", b"ra", None]) == [True, True, True]
        assert store.result(ids[0]) == b"ra"
        assert store.result(ids[1]) is None  # acked without a result
        assert store.result(ids[3]) is None  # not acked
        assert list(store.results()) == [(ids[0], b"ra"), (ids[2], b"rc")]

    def test_forget_drops_results_and_dead_letters(self, store: Store) -> None:
        a, b = store.put([Message(payload=b"a"), Message(payload=b"b", max_attempts=1)])
        store.get(2)
        store.ack(a, b"ra")
        store.nack(b, "dead")
        assert store.forget([a, b, 10**9]) == 2
        assert store.result(a) is None and store.dead_letters() == [] and list(store.results()) == []
        assert store.status(a) == Status.ACKED

    def test_results_and_dead_letters_page_by_id(self, store: Store) -> None:
        ids = store.put([Message(payload=b"%d" % i, max_attempts=1) for i in range(6)])
        store.get(6)
        store.ack_many(ids[:3], [b"r0", None, b"r2"])
        store.nack_many(ids[3:], ["e3", "e4", "e5"])
        assert list(store.results(after=ids[0])) == [(ids[2], b"r2")]
        assert list(store.results(after=ids[-1])) == []
        assert [d.message.id for d in store.dead_letters(after=ids[3])] == ids[4:]
        assert [d.error for d in store.dead_letters(limit=2)] == ["e3", "e4"]

    # --- purge and wake-ups ---------------------------------------------------------------
    def test_purge_drops_ready_and_delayed_only(self, store: Store) -> None:
        ids = store.put(_msgs(b"a", b"b", b"c"))
        [late] = store.put([Message(payload=b"later", not_before=time.time() + 60)])
        [m] = store.get(1)
        assert store.purge() == 3
        assert store.purge() == 0
        assert store.get(10) == []
        assert store.status(ids[1]) is None and store.status(late) is None
        assert store.status(m.id) == Status.DELIVERED
        assert store.ack(m.id, b"still counts")
        assert not store.ack(ids[1])
        s = store.stats()
        assert (s.ready, s.delayed, s.delivered, s.acked) == (0, 0, 0, 1)
        [after] = store.put(_msgs(b"after"))
        assert [x.id for x in store.get(10)] == [after]

    def test_cancel_fails_ready_and_delayed_messages_only(self, store: Store) -> None:
        acked, running, ready = store.put(_msgs(b"acked", b"running", b"ready"))
        [late] = store.put([Message(payload=b"later", not_before=time.time() + 60, headers={"h": "v"})])
        assert [m.id for m in store.get(1)] == [acked] and store.ack(acked)
        assert [m.id for m in store.get(1)] == [running]
        never = store.next_id + 10
        assert store.cancel([ready, running, acked, late, never, ready], "cancelled") == [True, False, False, True, False, False]
        assert store.status(ready) == store.status(late) == Status.FAILED and store.status(running) == Status.DELIVERED
        dead = {d.message.id: d for d in store.dead_letters()}
        assert set(dead) == {ready, late} and {d.error for d in dead.values()} == {"cancelled"}
        assert dead[late].message.payload == b"later" and dead[late].message.headers == {"h": "v"}
        assert store.get(10) == [] and store.cancel([ready], "again") == [False]
        s = store.stats()
        assert (s.ready, s.delayed, s.delivered, s.acked, s.failed) == (0, 0, 1, 1, 2)
        assert store.ack(running)  # a delivered message is left to its task: its ack counts

    def test_next_wakeup_tracks_delays_and_leases(self, store: Store) -> None:
        assert store.next_wakeup() is None
        due = time.time() + 30
        store.put([Message(payload=b"late", not_before=due)])
        assert store.next_wakeup() == pytest.approx(due)
        store.put(_msgs(b"now"))
        t0 = store.clock()  # leases follow the store's steady clock
        store.get(1, lease_s=5)
        wakeup = store.next_wakeup()
        assert wakeup is not None and t0 + 5 <= wakeup <= store.clock() + 5
        store.sync()  # callable on every store

    # --- status and stats -----------------------------------------------------------------
    def test_status_and_stats(self, store: Store) -> None:
        ids = store.put(_msgs(*[b"%d" % i for i in range(6)]))
        store.put([Message(payload=b"later", not_before=time.time() + 60)])
        got = store.get(4)
        store.ack(got[0].id)
        store.nack(got[1].id, "")
        s = store.stats()
        assert (s.ready, s.delivered, s.acked, s.failed, s.delayed) == (3, 2, 1, 0, 1)
        assert store.status(ids[0]) == Status.ACKED
        assert store.status(ids[2]) == Status.DELIVERED
        assert store.status(ids[5]) == Status.READY
        assert store.status(10**9) is None and store.status(0) is None

    def test_many_messages_window_slides(self, store: Store) -> None:
        total = 0
        for _ in range(5):
            ids = store.put(_msgs(*[b"%d" % i for i in range(3000)]))
            got = store.get(5000)
            assert [m.id for m in got] == ids
            assert all(store.ack_many(ids))
            total += 3000
        assert store.stats().acked == total
        assert store.status(ids[0]) == Status.ACKED
        more = store.put(_msgs(b"z"))
        assert more[0] > ids[-1]

    def test_skip_ids_on_a_new_store_moves_the_first_id(self, store: Store) -> None:
        store.skip_ids(5_000_000)
        store.skip_ids(10)  # never back
        assert store.next_id == 5_000_000
        ids = store.put(_msgs(b"a", b"b"))
        assert ids == [5_000_000, 5_000_001]
        assert store.stats().ready == 2 and store.status(17) is None

    def test_skip_ids_keeps_live_messages_and_finished_counts(self, store: Store) -> None:
        ids = store.put(_msgs(b"a", b"b", b"c"))
        store.ack(store.get(1)[0].id, b"r")
        store.skip_ids(ids[-1] + 1000)
        [new] = store.put(_msgs(b"d"))
        assert new == ids[-1] + 1000
        assert [m.id for m in store.get(10)] == [ids[1], ids[2], new]
        s = store.stats()
        assert (s.delivered, s.acked) == (3, 1)
        assert store.result(ids[0]) == b"r" and store.status(ids[0]) == Status.ACKED
        assert not store.ack(new - 1)  # a skipped id is nobody's

    def test_keep_ids_past_never_moves_back(self, store: Store) -> None:
        [first] = store.put(_msgs(b"a"))
        store.keep_ids_past(first + 99)
        store.keep_ids_past(first)  # already past it: nothing changes
        assert store.put(_msgs(b"b")) == [first + 100]
        assert store.status(first) == Status.READY

    def test_a_suspended_store_carries_on_at_its_next_operation(self, store: Store) -> None:
        ids = store.put(_msgs(b"a", b"b"))
        store.sync()
        assert store.suspend()  # nothing waits for a sync: it lets go of what it holds
        [m] = store.get(1)
        assert (m.id, m.payload) == (ids[0], b"a") and store.ack(m.id, b"r")
        assert store.suspend()
        assert store.result(ids[0]) == b"r" and store.put(_msgs(b"c")) == [ids[1] + 1]
        assert [m.payload for m in store.get(10)] == [b"b", b"c"]

    def test_absent_ids_stay_absent_once_the_window_moves_past_them(self, store: Store) -> None:
        purged = store.put(_msgs(*[b"p"] * 10))
        store.purge()
        [live] = store.put(_msgs(b"live"))
        store.skip_ids(store.next_id + 7)
        skipped = store.next_id - 1
        for _ in range(30):  # enough finished messages for the window to slide past all of them
            store.put(_msgs(*[b"y"] * 100))
            store.ack_many([m.id for m in store.get(100)])
        assert store.status(live) == Status.ACKED
        assert store.status(purged[0]) is None and store.status(purged[-1]) is None and store.status(skipped) is None
        assert (store.stats().ready, store.stats().acked) == (1, 3000)

    # --- bad input ------------------------------------------------------------------------
    def test_bad_input_is_rejected_without_side_effects(self, store: Store) -> None:
        store.put(_msgs(b"ok"))
        before = store.stats()
        with pytest.raises(TypeError, match="Message"):
            store.put([Message(payload=b"x"), _wrong(b"raw")])
        with pytest.raises(TypeError, match="payload"):
            store.put([Message(payload=_wrong("text"))])
        with pytest.raises(ValueError, match="priority"):
            store.put([Message(payload=b"x", priority=2**40)])
        with pytest.raises(ValueError, match="max_attempts"):
            store.put([Message(payload=b"x", max_attempts=-1)])
        with pytest.raises(TypeError, match="headers"):
            store.put([Message(payload=b"x", headers=_wrong({"k": 1}))])
        shared = {"k": "v"}  # a bad map after a shared good one is still found
        with pytest.raises(TypeError, match="message 2 headers"):
            store.put_columns([b"x"] * 3, headers=[shared, shared, _wrong({"k": 1})])
        with pytest.raises(ValueError):
            store.get(-1)
        with pytest.raises(ValueError):
            store.get(1, lease_s=0)
        with pytest.raises(TypeError, match="integers"):
            store.ack_many([_wrong("1")])
        with pytest.raises(TypeError, match="bytes"):
            store.ack(1, _wrong("text"))
        with pytest.raises(ValueError, match="results"):
            store.ack_many([1, 2], [b"x"])
        with pytest.raises(TypeError, match="str"):
            store.nack(1, _wrong(b"bytes error"))
        with pytest.raises(ValueError):
            store.nack(1, "x", delay_s=-1)
        assert store.stats() == before
        assert [m.payload for m in store.get(10)] == [b"ok"]

    def test_closed_store_refuses(self, tmp_path: Path) -> None:
        s = self.make(tmp_path)
        s.close()
        s.close()  # idempotent
        with pytest.raises(StoreClosedError):
            s.put(_msgs(b"x"))
        with pytest.raises(StoreClosedError):
            s.stats()

    def test_headers_shared_in_a_put_come_back_as_each_messages_own(self, store: Store) -> None:
        shared = {"task": "t", "ct": "msgpack"}
        sent: list[dict[str, str]] = [shared, shared, {"other": "1"}, {}, shared, {"task": "t", "ct": "msgpack"}]
        store.put_columns([b"p%d" % i for i in range(6)], headers=sent)
        got = store.get_batch(10, 60.0)
        assert got.headers == sent and got.payloads == [b"p%d" % i for i in range(6)]
        got.headers[0]["x"] = "y"  # one message's map: changing it changes no other
        assert got.headers[1] == shared == {"task": "t", "ct": "msgpack"} and got.headers[4] == shared
