"""Crash durability: a child process works a DurableStore and is SIGKILLed at random moments.

The child writes a journal line (fsynced) after each operation returns, so the parent knows what
the store acknowledged. After each kill the parent reopens the store and checks that nothing the
store acknowledged was lost or undone, then drains it; the next child continues on the same store.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conveyor.constants import INDEX_NAME, SEGMENT_GLOB
from conveyor.message import Message, Status
from conveyor.storage import DurableStore

SEGMENT_BYTES = 256 * 1024
MAX_ATTEMPTS = 3
ROUNDS = 20
LONG = 3600.0

# argv: store path, journal path, round, seed, segment bytes, max attempts
CHILD = r"""
import os, random, sys, time

import conveyor.storage.durable as durable
from conveyor.message import Message
from conveyor.storage import DurableStore

path, journal, rnd, seed, seg_bytes, max_att = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
durable.INDEX_REWRITE_MIN_RECORDS = 512  # rewrite the index often, so that kills land in rewrites too
rng = random.Random(seed * 1000 + rnd)
fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def note(line):
    os.write(fd, (line + "\n").encode())
    os.fsync(fd)


def payload(k):
    return b"p-%d-%d-" % (rnd, k) + bytes([97 + k % 26]) * (k * 37 % 300)


s = DurableStore(path, segment_bytes=seg_bytes, fsync="batch", max_attempts=max_att)
note("S")
k = 0
held = {}  # delivered to us, not finished: id -> payload
with_result = []  # acked with a result, not forgotten
deadline = time.monotonic() + 60  # the parent kills us long before
while time.monotonic() < deadline:
    op = rng.random()
    if op < 0.3:
        n = rng.randint(1, 200)
        ids = s.put([Message(payload=payload(k + j), priority=rng.randint(0, 2)) for j in range(n)])
        note("P %d %s" % (k, ",".join(map(str, ids))))
        k += n
    elif op < 0.55 or (not held and op < 0.9) or (not with_result and op >= 0.9):
        got = s.get(rng.randint(1, 200), lease_s=600)
        note("G " + ",".join(str(m.id) for m in got))
        held.update((m.id, m.payload) for m in got)
    elif op < 0.8:
        ids = rng.sample(sorted(held), rng.randint(1, min(len(held), 100)))
        results = [b"r" + held[i] if rng.random() < 0.7 else None for i in ids]
        ok = [s.ack(ids[0], results[0])] if len(ids) == 1 else s.ack_many(ids, results)
        assert all(ok), ("an ack of a held message was refused", ids, ok)
        note("A " + " ".join("%d:%s" % (i, "-" if r is None else r.hex()) for i, r in zip(ids, results)))
        for i, r in zip(ids, results):
            del held[i]
            if r is not None:
                with_result.append(i)
    elif op < 0.9:
        ids = rng.sample(sorted(held), rng.randint(1, min(len(held), 20)))
        delay = rng.choice([0.0, 0.01, 0.05])
        if len(ids) == 1:
            ok = [s.nack(ids[0], "e%d" % ids[0], delay)]
        else:
            ok = s.nack_many(ids, ["e%d" % i for i in ids], delay)
        assert all(ok), ("a nack of a held message was refused", ids, ok)
        note("N " + ",".join(map(str, ids)))
        for i in ids:
            del held[i]
    else:
        ids = rng.sample(with_result, rng.randint(1, len(with_result)))
        note("f " + ",".join(map(str, ids)))  # intent: the kill may come before forget returns
        assert s.forget(ids) == len(ids)
        note("F " + ",".join(map(str, ids)))
        with_result = [i for i in with_result if i not in set(ids)]
"""


def payload(rnd: int, k: int) -> bytes:
    """The child's payload of its k-th message in round `rnd` (must match CHILD)."""
    return b"p-%d-%d-" % (rnd, k) + bytes([97 + k % 26]) * (k * 37 % 300)


PAYLOAD = re.compile(rb"p-(\d+)-(\d+)-")


def well_formed(p: bytes) -> bool:
    """Whether p is exactly some payload the child could have put (for ids whose put was not journaled)."""
    m = PAYLOAD.match(p)
    return m is not None and p == payload(int(m[1]), int(m[2]))


@dataclass
class Model:
    """What the journals say the store acknowledged, over all rounds."""

    payloads: dict[int, bytes] = field(default_factory=dict)  # id -> payload, for puts that returned
    acked: dict[int, bytes | None] = field(default_factory=dict)  # id -> the result it must keep
    maybe_forgotten: set[int] = field(default_factory=set)  # forget called, not known to have returned
    known: set[int] = field(default_factory=set)  # every id seen anywhere
    top: int = 0  # the highest id seen
    fresh: set[int] = field(default_factory=set)  # ids put or finished in the current round
    ops: Counter[str] = field(default_factory=Counter)  # journal lines by kind, over all rounds

    def see(self, ids: Iterable[int]) -> None:
        ids = list(ids)
        self.known.update(ids)
        self.fresh.update(ids)
        self.top = max([self.top, *ids])

    def to_check(self, rng: random.Random, full: bool) -> list[int]:
        """The ids to check: all, or this round's plus a random sample of the older ones."""
        ids = sorted(self.payloads.keys() | self.acked.keys())
        if full:
            return ids
        return sorted(self.fresh.union(rng.sample(ids, min(len(ids), 3000))))

    def replay(self, journal: Path, rnd: int, ctx: str) -> None:
        """Apply the complete lines of a child's journal, checking what it observed."""
        for line in journal.read_text().split("\n")[:-1]:  # the last piece is "" or a torn line
            op, _, rest = line.partition(" ")
            self.ops[op] += 1
            if op == "P":
                k0, ids_text = rest.split(" ")
                ids = [int(x) for x in ids_text.split(",")]
                assert ids == list(range(ids[0], ids[0] + len(ids))), f"{ctx}: put ids not consecutive: {line[:200]}"
                assert ids[0] > self.top, f"{ctx}: put reused ids: {ids[:5]}... but {self.top} was seen before"
                for j, i in enumerate(ids):
                    self.payloads[i] = payload(rnd, int(k0) + j)
                self.see(ids)
            elif op == "G":
                ids = [int(x) for x in rest.split(",") if x]
                again = sorted(set(ids) & set(self.acked))
                assert not again, f"{ctx}: the child was served acked messages again: {again[:10]}"
                self.see(ids)
            elif op == "A":
                for item in rest.split(" "):
                    i_text, _, r_text = item.partition(":")
                    i = int(i_text)
                    self.fresh.add(i)
                    self.acked[i] = None if r_text == "-" else bytes.fromhex(r_text)
                    assert i in self.payloads, f"{ctx}: the child acked {i}, which it never put"
                    assert self.acked[i] in (None, b"r" + self.payloads[i]), f"{ctx}: the child acked {i} with a wrong result"
            elif op == "f":
                self.maybe_forgotten.update(int(x) for x in rest.split(","))
            elif op == "F":
                for i in map(int, rest.split(",")):
                    self.acked[i] = None
                    self.maybe_forgotten.discard(i)
            else:
                assert op in ("S", "N"), f"{ctx}: unknown journal line {line[:80]!r}"


def wait_started(proc: subprocess.Popen[bytes], journal: Path, err: Path, ctx: str, timeout: float = 30.0) -> None:
    """Poll the journal until the child has opened the store and said so."""
    deadline = time.monotonic() + timeout
    while not (journal.exists() and journal.read_bytes().startswith(b"S\n")):
        if proc.poll() is not None:
            pytest.fail(f"{ctx}: the child exited ({proc.returncode}) before starting:\n{err.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{ctx}: the child did not start within {timeout} s:\n{err.read_text()}")
        time.sleep(0.005)


def check_and_drain(s: DurableStore, m: Model, ctx: str, check: list[int]) -> int:
    """Everything acknowledged among `check` is intact; then get/ack every message left. Returns how many were drained."""
    for i in check:
        assert s.status(i) is not None, f"{ctx}: message {i} was put (the put returned) but is gone"
        if i not in m.acked:
            continue
        r = m.acked[i]
        assert s.status(i) == Status.ACKED, f"{ctx}: message {i} was acked but is {s.status(i)!r}"
        got = s.result(i)
        if i in m.maybe_forgotten:
            assert got in (r, None), f"{ctx}: result of {i} is {got!r}, expected {r!r} or forgotten"
        else:
            assert got == r, f"{ctx}: result of {i} is {got!r}, expected {r!r}"
    for i, r in s.results():
        assert s.status(i) == Status.ACKED, f"{ctx}: a result for {i}, which is {s.status(i)!r}"
        assert r[:1] == b"r" and r[1:] == m.payloads.get(i, r[1:]) and well_formed(r[1:]), f"{ctx}: result of {i} is {r!r}"
    for d in s.dead_letters():
        i = d.message.id
        assert i not in m.acked, f"{ctx}: acked message {i} is also a dead letter"
        assert d.message.payload == m.payloads.get(i, d.message.payload) and well_formed(d.message.payload), f"{ctx}: {i}"
        assert d.error == f"e{i}" or d.error.startswith("lease expired"), f"{ctx}: dead letter {i} error {d.error!r}"
        m.see([i])
    # deliveries cut short by the kill come back at once; nacked ones after their (small) delay
    s.expire(time.time() + 2 * LONG)
    drained = 0
    deadline = time.monotonic() + 30
    while True:
        got = s.get(500, lease_s=LONG)
        if not got:
            st = s.stats()
            if st.ready == st.delivered == st.delayed == 0:
                break
            assert time.monotonic() < deadline, f"{ctx}: not drained before the deadline: {st}"
            time.sleep(0.005)
            continue
        for msg in got:
            i = msg.id
            assert i not in m.acked, f"{ctx}: acked message {i} was served again"
            assert msg.payload == m.payloads.get(i, msg.payload) and well_formed(msg.payload), f"{ctx}: payload of {i}"
        assert all(s.ack_many([msg.id for msg in got]))
        m.acked.update((msg.id, None) for msg in got)
        m.see(msg.id for msg in got)
        drained += len(got)
    st = s.stats()
    assert st.acked + st.failed == len(m.known), f"{ctx}: {st} but {len(m.known)} ids were ever seen"
    for i in check:
        assert s.status(i) in (Status.ACKED, Status.FAILED), f"{ctx}: message {i} is {s.status(i)!r} after draining"
    return drained


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkill_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """20 rounds of: a child works the store, SIGKILL at a random moment, the parent checks and drains."""
    seed = int(os.environ.get("CONVEYOR_CRASH_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    path = tmp_path / "q"
    m = Model()
    segs_seen: set[str] = set()
    index_inodes: set[int] = set()
    for rnd in range(ROUNDS):
        ctx = f"[seed {seed} (CONVEYOR_CRASH_SEED), round {rnd}]"
        journal, err = tmp_path / f"journal-{rnd:02d}", tmp_path / f"child-{rnd:02d}.err"
        args = [str(path), str(journal), str(rnd), str(seed), str(SEGMENT_BYTES), str(MAX_ATTEMPTS)]
        with open(err, "wb") as errf:
            proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.DEVNULL, stderr=errf)
        try:
            wait_started(proc, journal, err, ctx)
            time.sleep(rng.uniform(0.05, 0.5))  # the random kill moment (not synchronisation)
            proc.send_signal(signal.SIGKILL)
            rc = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert rc == -signal.SIGKILL, f"{ctx}: the child died on its own ({rc}):\n{err.read_text()}"
        m.fresh.clear()
        m.replay(journal, rnd, ctx)
        segs_seen.update(f.name for f in path.glob(SEGMENT_GLOB))
        index_inodes.add((path / INDEX_NAME).stat().st_ino)
        with DurableStore(path, segment_bytes=SEGMENT_BYTES, fsync="batch", max_attempts=MAX_ATTEMPTS) as s:
            check_and_drain(s, m, ctx, m.to_check(rng, full=False))
            # forget some verified results (and every uncertain forget) so that old segments can go
            gone = sorted(m.maybe_forgotten | {i for i, r in m.acked.items() if r is not None and rng.random() < 0.5})
            s.forget(gone)
            m.acked.update((i, None) for i in gone)
            m.maybe_forgotten.clear()
    ctx = f"[seed {seed} (CONVEYOR_CRASH_SEED)]"
    with DurableStore(path, segment_bytes=SEGMENT_BYTES) as s:
        assert check_and_drain(s, m, ctx, m.to_check(rng, full=True)) == 0
    # the run exercised what it is meant to: many operations, rolled and deleted segments, index rewrites
    assert all(m.ops[op] >= 10 for op in "PGANF"), f"{ctx}: too few operations of some kind: {m.ops}"
    assert len(segs_seen) > 3 and len(list(path.glob(SEGMENT_GLOB))) < len(segs_seen), f"{ctx}: {sorted(segs_seen)}"
    assert len(index_inodes) > 1, f"{ctx}: the index was never rewritten"


def spy_fsync(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files os.fsync is called on from now on, in order (skips where /proc cannot name them)."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to name the files that fsync is called on")
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return synced


def test_batch_fsync_covers_every_segment_an_operation_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync="batch" syncs every segment an operation wrote to, rolled ones too, before it returns.

    fsync="batch": every segment file an operation wrote to is fsynced before it returns, rolled
    ones too (otherwise a machine crash loses records of a put or ack that returned).
    """
    synced = spy_fsync(monkeypatch)
    path = tmp_path / "q"

    def sizes() -> dict[str, int]:
        return {f.name: f.stat().st_size for f in path.glob(SEGMENT_GLOB)}

    with DurableStore(path, segment_bytes=8192, fsync="batch") as s:
        for step in range(30):  # puts and acks of ~half a segment each: many of them roll mid-write
            before = sizes()
            synced.clear()
            if step % 2 == 0:
                s.put([Message(payload=b"%d" % step * 40) for _ in range(25)])
            else:
                got = s.get(25)
                assert all(s.ack_many([x.id for x in got], [b"r" * 150] * len(got)))
            written = sorted(n for n, size in sizes().items() if size != before.get(n))
            assert set(written) <= set(synced), f"step {step}: wrote {written} but fsynced only {sorted(set(synced))}"
