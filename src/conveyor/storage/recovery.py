"""Opening a durable store: its segments and index WAL replayed into a `QueueState`.

The last index record of an id wins; a message body with no index record is READY as put; one
that was DELIVERED stays delivered until its lease deadline. Results and dead letters are found
where their records say, or, if a repair moved them, by kind and id among the records scanned.
What the repair lost is logged, never dropped silently.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from conveyor.constants import INDEX_NAME, KIND_DEAD, KIND_RESULT, ST_ACKED, ST_DELAYED, ST_FAILED, ST_NONE, ST_READY
from conveyor.storage.ids import member
from conveyor.storage.segment_scan import KEPT_DTYPE, SCAN_DTYPE, Scan
from conveyor.storage.segments import SegmentLog
from conveyor.storage.state import QueueState
from conveyor.storage.wal import IndexLog, gap_ranges, last_per_id

log = logging.getLogger("conveyor.storage")


@dataclass
class Recovered:
    """What a durable store keeps beside its state, as found on opening."""

    kept: dict[int, tuple[int, int, int]]  # id -> (seg, off, size) of its result or dead letter
    failed: list[int]  # every failed id, forgotten or not
    live: dict[int, int]  # segment -> records in it still needed


def recover(path: Path, segments: SegmentLog, index: IndexLog, st: QueueState, reserved_upto: int,
            repair: bool) -> Recovered:  # fmt: skip
    """Open `segments` and `index` (repairing damage if `repair`) and load what they hold into `st`,
    a new state; no id below `reserved_upto` (or any id the files name) is assigned again."""
    scan = segments.open(repair)
    had_index = index.file.exists()
    rec = index.open(repair)
    if not had_index and scan.messages:
        log.warning("%s: no %s beside the segments: every message in them is READY again", path, INDEX_NAME)
    header = index.header
    st.base = st.low = st.next_id = header.base
    if not header.acked_below and not header.failed_below:  # none below base was ever assigned (or all purged)
        st.first_id = header.base
    st.finished_below_base = {ST_ACKED: header.acked_below, ST_FAILED: header.failed_below}
    now = time.time()

    msgs = np.concatenate(scan.messages) if scan.messages else np.zeros(0, SCAN_DTYPE)
    msgs = msgs[msgs["id"] >= header.base]
    last = last_per_id(rec)
    kept = _kept(path, segments, scan, last)
    failed = last["id"][last["status"] == ST_FAILED].tolist()
    st.add_gaps(r for r in gap_ranges(last) if r[0] < header.base)
    last = last[last["id"] >= header.base]

    # merge: a message body with no index record is READY as put (both id lists are sorted)
    m_ids, l_ids = msgs["id"], last["id"].astype(np.int64)
    ids = m_ids
    if len(l_ids) and not member(l_ids, m_ids).all():
        ids = np.sort(np.concatenate([m_ids, l_ids]), kind="stable")  # radix sort: linear for ints
        ids = ids[np.r_[True, ids[1:] != ids[:-1]]]
    n = len(ids)
    in_msgs = member(ids, m_ids)
    in_last = member(ids, l_ids)
    status = np.full(n, ST_READY, np.uint8)
    attempts = np.zeros(n, np.uint16)
    until = np.zeros(n, np.float64)
    prio = np.zeros(n, np.int32)
    max_att = np.zeros(n, np.uint16)
    prio[in_msgs], max_att[in_msgs], until[in_msgs] = msgs["priority"], msgs["max_attempts"], msgs["not_before"]
    status[in_last], attempts[in_last], until[in_last] = last["status"], last["attempts"], last["until"]
    lost = ~in_msgs & (status != ST_ACKED) & (status != ST_FAILED) & (status != ST_NONE)
    if lost.any():
        log.warning("%s: %d messages have index records but no body (lost to repair): %s",
                    path, int(lost.sum()), ids[lost][:10].tolist())  # fmt: skip
        status[lost] = ST_NONE
    status[status == ST_DELAYED] = ST_READY
    idx = st.load(ids, status, prio, attempts, max_att, until, now)
    c = st.cols
    body_idx = idx[in_msgs]
    for name in ("seg", "off", "size"):
        c[name][body_idx] = msgs[name]
    # ids a put reserved before a crash stay unused: keys written for them must never name another message
    st.skip_to(max(header.next_id, scan.id_floor, st.next_id, reserved_upto))  # may slide the window
    segments.id_floor = st.next_id

    # segment liveness: unfinished message bodies plus kept results and dead letters
    live: dict[int, int] = {}
    unfinished = in_msgs & (status != ST_ACKED) & (status != ST_FAILED) & (status != ST_NONE)
    for s, k in zip(*np.unique(c["seg"][ids[unfinished] - st.base], return_counts=True), strict=True):
        live[int(s)] = live.get(int(s), 0) + int(k)
    for s, _, _ in kept.values():
        live[s] = live.get(s, 0) + 1
    return Recovered(kept, failed, live)


def _kept(path: Path, segments: SegmentLog, scan: Scan, last: np.ndarray) -> dict[int, tuple[int, int, int]]:
    """Where the results and dead letters still kept are, whatever their id (`last`: the last index
    record per id); those lost (cut off or damaged) are logged."""
    out: dict[int, tuple[int, int, int]] = {}
    kept = ((last["status"] == ST_ACKED) | (last["status"] == ST_FAILED)) & (last["len"] > 0)
    cols = (last[c][kept].tolist() for c in ("id", "status", "seg", "off", "len"))
    found: dict[tuple[int, int], tuple[int, int, int]] | None = None
    for i, status_, s, o, n in zip(*cols, strict=True):
        kind = KIND_RESULT if status_ == ST_ACKED else KIND_DEAD
        loc: tuple[int, int, int] | None = (s, o, n)
        if not segments.holds(s, o, n, kind, i):
            # the record moved (a repaired segment) or is gone: look for it by kind and id
            if found is None:
                k = np.concatenate(scan.kept) if scan.kept else np.zeros(0, KEPT_DTYPE)
                found = dict(zip(zip(k["kind"].tolist(), k["id"].tolist(), strict=True),
                                 zip(k["seg"].tolist(), k["off"].tolist(), k["size"].tolist(), strict=True),
                                 strict=True))  # fmt: skip
            loc = found.get((kind, i))
        if loc is not None:
            out[i] = loc
        else:
            what = "result" if kind == KIND_RESULT else "dead letter"
            log.warning("%s: the %s of message %d was lost (cut off or damaged)", path, what, i)
    return out
