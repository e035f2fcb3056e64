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
from itertools import compress
from pathlib import Path

from conveyor.constants import ST_ACKED, ST_DELAYED, ST_FAILED, ST_NONE, ST_READY
from conveyor.storage.columns import mask_and, mask_or, nonzero, table
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
    a, b = low - st.base, st.next_id - st.base
    status = bytes(st.status[a:b])
    acked, failed = (st.finished_below_base[s] + st.status.count(s, 0, a) for s in (ST_ACKED, ST_FAILED))
    header = Header(low, max(st.next_id, reserved_upto), acked, failed)
    # fresh READY messages need no record: their body says all; a purged one (ST_NONE with a
    # body) needs its record, or its body would make it READY again on reopening
    purged = mask_and(status.translate(_IS_NONE), nonzero(st.cols["size"][a:b]))
    delivered_once = mask_and(status.translate(_IS_READY), nonzero(st.attempts[a:b]))
    need = mask_or(mask_or(purged, status.translate(_NEITHER)), delivered_once)
    ids = sorted({i for i in kept if i < low} | {i for i in failed_ids if i < low})
    below = len(ids)
    ids += compress(range(low, st.next_id), need)
    stat = [ST_FAILED if i in failed_ids else ST_ACKED for i in ids[:below]]
    stat += compress(status.translate(_DELAYED_AS_READY), need)
    loc = [kept.get(i, (0, 0, 0)) for i in ids]
    attempts = st.column_of("attempts", ids[:below]) + list(compress(st.attempts[a:b], need))
    until = st.column_of("until", ids[:below], 0.0) + list(compress(st.until[a:b], need))
    gaps = make_gap_records(st.gaps_below(low))  # so that ids below the new base still read as absent
    seg, off, size = ([x[j] for x in loc] for j in range(3))
    return header, gaps + make_records(ids, stat, attempts, seg, off, size, until)


_IS_NONE = table((ST_NONE,))
_IS_READY = table((ST_READY,))
_NEITHER = table([c for c in range(256) if c not in (ST_NONE, ST_READY)])  # any other status needs its record
_DELAYED_AS_READY = bytes(ST_READY if c == ST_DELAYED else c for c in range(256))
