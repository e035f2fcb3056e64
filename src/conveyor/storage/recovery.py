"""Opening a durable store: its segments and index WAL replayed into a `QueueState`.

The last index record of an id wins; a message body with no index record is READY as put; one
that was DELIVERED stays delivered until its lease deadline. Results and dead letters are found
where their records say, or, if a repair moved them, by kind and id among the records scanned.
What the index confirms and the segments no longer hold is refused, or with repair reported (see
`conveyor.storage.losses`), never dropped silently. Ids start past the highest any file shows, and
past the reservation (or, when it cannot be read, by a margin: `conveyor.storage.reservation`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from conveyor.constants import (
    INDEX_NAME,
    KEYS_LOG_NAME,
    KIND_DEAD,
    KIND_RESULT,
    ST_ACKED,
    ST_DELAYED,
    ST_FAILED,
    ST_NONE,
    ST_READY,
)
from conveyor.storage.ids import member
from conveyor.storage.losses import Loss, find_losses, ranges, refusal
from conveyor.storage.reservation import IdReservation, past_lost
from conveyor.storage.segment_scan import KEPT_DTYPE, SCAN_DTYPE, Scan, refuse_sealed
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
    losses: list[Loss]  # what the index confirmed and a repair could not keep (the store fails those ids)
    reservation_lost: bool  # the reservation could not be read: ids start past `past_lost`


def recover(
    path: Path, segments: SegmentLog, index: IndexLog, st: QueueState, reserved: IdReservation, repair: bool
) -> Recovered:
    """Open `segments` and `index` (repairing damage if `repair`) and load what they hold into `st`.

    Open `segments` and `index` (repairing damage if `repair`) and load what they hold into `st`, a
    new state; no id below the reservation (or any id the files name) is assigned again.
    """
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

    every = np.concatenate(scan.messages) if scan.messages else np.zeros(0, SCAN_DTYPE)
    msgs = every[every["id"] >= header.base]
    last = last_per_id(rec)
    kept, lost_kept = _kept(segments, scan, last)
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
    losses = find_losses(path, segments.sizes, every, ids[lost], lost_kept) if lost.any() or lost_kept else []
    if losses and not repair:
        raise refusal(losses)  # before anything is cut: a refused open changes no segment
    refuse_sealed(scan)  # a sealed segment's bad tail that the index confirms nothing in: damage all the same
    segments.settle(scan, {x.segment for x in losses})
    if losses:
        lost_ids = [i for x in losses for i in (*x.messages, *x.kept)]
        log.warning(
            "%s: the repair could not keep what the index confirmed of %d ids: %s; each reads FAILED now, "
            "its dead letter saying what was lost where",
            path,
            len(lost_ids),
            ranges(lost_ids, None),
        )
        status[lost] = ST_FAILED
    status[status == ST_DELAYED] = ST_READY
    idx = st.load(ids, status, prio, attempts, max_att, until, now)
    c = st.cols
    body_idx = idx[in_msgs]
    for name in ("seg", "off", "size"):
        c[name][body_idx] = msgs[name]
    # ids a put reserved before a crash stay unused: keys written for them must never name another message
    shown = max(header.next_id, scan.id_floor, st.next_id)
    lost_reservation = _lost_reservation(path, reserved, shown)
    st.skip_to(past_lost(shown) if lost_reservation else max(shown, reserved.upto))  # may slide the window
    segments.id_floor = st.next_id

    # segment liveness: unfinished message bodies plus kept results and dead letters
    live: dict[int, int] = {}
    unfinished = in_msgs & (status != ST_ACKED) & (status != ST_FAILED) & (status != ST_NONE)
    for s, k in zip(*np.unique(c["seg"][ids[unfinished] - st.base], return_counts=True), strict=True):
        live[int(s)] = live.get(int(s), 0) + int(k)
    for s, _, _ in kept.values():
        live[s] = live.get(s, 0) + 1
    return Recovered(kept, failed, live, losses, lost_reservation)


def _lost_reservation(path: Path, reserved: IdReservation, shown: int) -> bool:
    """Whether the reservation cannot be read (logged, with what the store does about it).

    A missing (or empty) file is lost only once the files show ids were handed out (`shown`: above
    them all).
    """
    keys = path / KEYS_LOG_NAME
    why = reserved.unreadable
    if why is None and reserved.missing and (shown > 1 or (keys.exists() and keys.stat().st_size > 0)):
        why = "the file is missing or empty, though the store has handed out ids"
    if why is None:
        return False
    log.warning(
        "%s cannot be read (%s): ids up to the lost reservation may have been handed out; ids start at %d, "
        "past the highest any file shows (%d) and the largest reservation that can be lost",
        reserved.file,
        why,
        past_lost(shown),
        shown - 1,
    )
    return True


def _kept(segments: SegmentLog, scan: Scan, last: np.ndarray) -> tuple[dict[int, tuple[int, int, int]], dict[int, int]]:
    """Where the results and dead letters still kept are, and the segment of each one lost.

    Where the results and dead letters still kept are, whatever their id (`last`: the last index
    record per id); and the segment of each one lost (cut off or damaged).
    """
    out: dict[int, tuple[int, int, int]] = {}
    lost: dict[int, int] = {}
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
                found = dict(
                    zip(
                        zip(k["kind"].tolist(), k["id"].tolist(), strict=True),
                        zip(k["seg"].tolist(), k["off"].tolist(), k["size"].tolist(), strict=True),
                        strict=True,
                    )
                )
            loc = found.get((kind, i))
        if loc is not None:
            out[i] = loc
        else:
            lost[i] = s
    return out, lost
