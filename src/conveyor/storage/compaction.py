"""Compaction of a durable store: deleting dead segments, and the contents of a rewritten index.

Compaction of a durable store: deleting segments whose records are all dead, and the contents of a
rewritten index (one record per id that still matters).

A segment whose messages are all finished and whose results and dead letters are all forgotten is
deleted (the active one too, once it is a quarter full, by rolling to a new one) — at once, or,
when syncs run apart from operations, only after the index records saying so are synced. When the
index is rewritten is the store's decision (`DurableStore._compact`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from conveyor.constants import ST_ACKED, ST_DELAYED, ST_FAILED, ST_NONE, ST_READY
from conveyor.storage.segments import SegmentLog
from conveyor.storage.state import QueueState
from conveyor.storage.wal import Header, make_gap_records, make_records

log = logging.getLogger("conveyor.storage")


def drop_dead_segments(path: Path, segs: SegmentLog, live: dict[int, int], doomed: list[int], at_once: bool) -> None:
    """Delete the segments no record in `live` needs, or add them to `doomed` for the next sync.

    Delete the segments no record in `live` needs, or add them to `doomed` (unless `at_once`), to be
    deleted by the next sync: deleted before the index records that say so are synced, a machine
    crash could leave answered puts with neither body nor record.
    """
    for s in [s for s, k in live.items() if k <= 0]:
        if s != segs.active or segs.sizes.get(s, 0) >= segs.segment_bytes // 4:
            if s == segs.active:
                try:
                    segs.roll()  # no more records go to a segment about to be deleted
                except OSError as e:  # a full disk: it stays the active one for now
                    log.warning("%s: no new segment could be started (%s)", path, e)
                    continue
            del live[s]
            if at_once:
                segs.drop(s)
            else:
                doomed.append(s)
    for s in [s for s in segs.sizes if s not in live and s != segs.active and s not in doomed]:
        segs.drop(s)  # segments holding only padding or superseded records (found so on opening)


def index_snapshot(
    st: QueueState, kept: dict[int, tuple[int, int, int]], failed_ids: set[int], reserved_upto: int
) -> tuple[Header, bytes]:
    """The header and records of a rewritten index: one record per id that still matters."""
    low = st.advance_low()
    c = st.cols
    a, b = low - st.base, st.next_id - st.base
    status = st.status[a:b]
    acked, failed = (st.finished_below_base[s] + int(np.count_nonzero(st.status[:a] == s)) for s in (ST_ACKED, ST_FAILED))
    header = Header(low, max(st.next_id, reserved_upto), acked, failed)
    # fresh READY messages need no record: their body says all; a purged one (ST_NONE with a
    # body) needs its record, or its body would make it READY again on reopening
    purged = (status == ST_NONE) & (c["size"][a:b] > 0)
    need = purged | ((status != ST_NONE) & ((status != ST_READY) | (c["attempts"][a:b] > 0)))
    ids = np.flatnonzero(need) + low
    kept_below = sorted({i for i in kept if i < low} | {i for i in failed_ids if i < low})
    ids = np.concatenate([np.array(kept_below, np.int64), ids])
    idx, inside = st.index(ids)
    stat = np.where(inside, st.status[idx], ST_ACKED).astype(np.uint8)
    for i, k in enumerate(kept_below):
        if k in failed_ids:
            stat[i] = ST_FAILED
    stat[stat == ST_DELAYED] = ST_READY
    loc = [kept.get(i, (0, 0, 0)) for i in ids.tolist()]
    seg, off, size = (np.fromiter((x[j] for x in loc), np.uint32, len(loc)) for j in range(3))
    attempts = np.where(inside, c["attempts"][idx], 0)
    until = np.where(inside, c["until"][idx], 0.0)
    gaps = make_gap_records(st.gaps_below(low))  # so that ids below the new base still read as absent
    return header, gaps + make_records(ids, stat, attempts, seg, off, size, until)
