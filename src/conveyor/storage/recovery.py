"""Opening a durable store: its segments and index WAL replayed into a `QueueState`.

The last index record of an id wins; a message body with no index record is READY as put; one
that was DELIVERED stays delivered until its lease deadline. Results and dead letters are found
where their records say, or, if a repair moved them, by kind and id among the records scanned.
What the index confirms and the segments no longer hold is refused, or with repair reported (see
`conveyor.storage.losses`), never dropped silently. Ids start past the highest any file shows, and
past the reservation (or, when it cannot be read, by a margin: `conveyor.storage.reservation`).
"""

from __future__ import annotations

import bisect
import logging
import time
from array import array
from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from typing import Any

from conveyor.constants import (
    INDEX_NAME,
    KEYS_LOG_NAME,
    KIND_DEAD,
    KIND_RESULT,
    ST_ACKED,
    ST_DELAYED,
    ST_DELIVERED,
    ST_FAILED,
    ST_NONE,
    ST_READY,
)
from conveyor.storage.columns import NOT, Where, fill, mask_and, mask_or, nonzero, put_all, table, where
from conveyor.storage.losses import Loss, find_losses, ranges, refusal
from conveyor.storage.reservation import IdReservation, past_lost
from conveyor.storage.segment_scan import Scan, refuse_sealed
from conveyor.storage.segments import SegmentLog
from conveyor.storage.state import QueueState
from conveyor.storage.wal import IndexLog, gap_ranges

log = logging.getLogger("conveyor.storage")

# the columns of the window that opening builds (a QueueState's, and a durable store's own)
_WINDOW = {"priority": "i", "attempts": "H", "max_attempts": "H", "until": "d", "seg": "I", "off": "I", "size": "I"}
_IS_UNFINISHED = table((ST_READY, ST_DELIVERED, ST_DELAYED))
_IS_ENDED = table((ST_ACKED, ST_FAILED))
_IS_FAILED = table((ST_FAILED,))
_DELAYED_AS_READY = bytes(ST_READY if b == ST_DELAYED else b for b in range(256))


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
    found = scan.messages  # ascending ids: bodies are appended in id order
    if not had_index and len(found.id):
        log.warning("%s: no %s beside the segments: every message in them is READY again", path, INDEX_NAME)
    header = index.header
    base = header.base
    st.base = st.low = st.next_id = base
    if not header.acked_below and not header.failed_below:  # none below base was ever assigned (or all purged)
        st.first_id = base
    st.finished_below_base = {ST_ACKED: header.acked_below, ST_FAILED: header.failed_below}
    now = time.time()

    # ACKED and FAILED are where a message ends: no record of another status follows one, but one of
    # the same status that forgets its result or dead letter (no length). Those of ids that ever had
    # a result or a dead letter, or failed, say what is kept and what failed.
    ends = rec.status.translate(_IS_ENDED)
    told = mask_and(ends, mask_or(nonzero(rec.len), rec.status.translate(_IS_FAILED)))
    ended: dict[int, tuple[int, int, int, int]] = {}
    if 1 in told:
        some = set(compress(rec.id, told))
        ends = mask_and(ends, bytes(map(some.__contains__, rec.id)))
        what = zip(*(compress(c, ends) for c in (rec.status, rec.seg, rec.off, rec.len)), strict=True)
        ended = dict(zip(compress(rec.id, ends), what, strict=True))
    failed = [i for i, (status_, _, _, _) in ended.items() if status_ == ST_FAILED]
    kept, lost_kept = _kept(segments, scan, ended)
    st.add_gaps(sorted(r for r in gap_ranges(rec) if r[0] < base))

    # the window from base: a message body with no index record is READY as put; the index records
    # of an id, replayed in order, say what became of it
    m = bisect.bisect_left(found.id, base)
    if min(rec.id, default=base) < base:
        rec = rec.select(bytes(map(base.__le__, rec.id)))
    top = max(found.id[-1] + 1 if m < len(found.id) else base, max(rec.id, default=base - 1) + 1)
    n = top - base
    status = bytearray((ST_NONE,)) * n
    cols: dict[str, array[Any]] = {name: array(code, bytes(n * array(code).itemsize)) for name, code in _WINDOW.items()}
    body = bytearray(n)  # 1 where the message's body is found
    at = _ascending(found.id[m:], base)
    fill(status, at, ST_READY)
    fill(body, at, 1)
    put_all(
        at,
        [
            (cols["priority"], found.priority[m:]),
            (cols["max_attempts"], found.max_attempts[m:]),
            (cols["until"], found.not_before[m:]),
            (cols["seg"], found.seg[m:]),
            (cols["off"], found.off[m:]),
            (cols["size"], found.size[m:]),
        ],
    )
    put_all(rec.id, [(status, rec.status), (cols["attempts"], rec.attempts), (cols["until"], rec.until)], base)
    lost = mask_and(status.translate(_IS_UNFINISHED), body.translate(NOT))
    lost_ids = list(compress(range(base, top), lost)) if 1 in lost else []
    losses = find_losses(path, segments.sizes, found, lost_ids, lost_kept) if lost_ids or lost_kept else []
    if losses and not repair:
        raise refusal(losses)  # before anything is cut: a refused open changes no segment
    refuse_sealed(scan)  # a sealed segment's bad tail that the index confirms nothing in: damage all the same
    segments.settle(scan, {x.segment for x in losses})
    if losses:
        every_lost = [i for x in losses for i in (*x.messages, *x.kept)]
        log.warning(
            "%s: the repair could not keep what the index confirmed of %d ids: %s; each reads FAILED now, "
            "its dead letter saying what was lost where",
            path,
            len(every_lost),
            ranges(every_lost, None),
        )
        fill(status, where(lost_ids, base), ST_FAILED)
    status = status.translate(_DELAYED_AS_READY)
    st.load(
        status,
        cols["priority"],
        cols["attempts"],
        cols["max_attempts"],
        cols["until"],
        now,
        {name: cols[name] for name in ("seg", "off", "size")},
    )
    # ids a put reserved before a crash stay unused: keys written for them must never name another message
    shown = max(header.next_id, scan.id_floor, st.next_id)
    lost_reservation = _lost_reservation(path, reserved, shown)
    st.skip_to(past_lost(shown) if lost_reservation else max(shown, reserved.upto))  # may slide the window
    segments.id_floor = st.next_id

    # segment liveness: unfinished message bodies plus kept results and dead letters
    bodies = array("I", compress(cols["seg"], mask_and(status.translate(_IS_UNFINISHED), body)))
    live = {s: k for s in segments.sizes if (k := bodies.count(s))}
    for s, _, _ in kept.values():
        live[s] = live.get(s, 0) + 1
    return Recovered(kept, failed, live, losses, lost_reservation)


def _ascending(ids: array[int], base: int) -> Where:
    """The positions of ascending ids: a range when they span no more ids than they are."""
    if len(ids) and ids[-1] - ids[0] == len(ids) - 1:
        return range(ids[0] - base, ids[-1] - base + 1)
    return list(map((-base).__add__, ids))


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


def _kept(
    segments: SegmentLog, scan: Scan, ended: dict[int, tuple[int, int, int, int]]
) -> tuple[dict[int, tuple[int, int, int]], dict[int, int]]:
    """Where the results and dead letters still kept are, and the segment of each one lost.

    Where the results and dead letters still kept are, whatever their id (`ended`: the last ACKED or
    FAILED record of an id, as (status, seg, off, len)); and the segment of each one lost (cut off
    or damaged).
    """
    out: dict[int, tuple[int, int, int]] = {}
    lost: dict[int, int] = {}
    found: dict[tuple[int, int], tuple[int, int, int]] | None = None
    for i, (status_, s, o, n) in ended.items():
        if not n:
            continue
        kind = KIND_RESULT if status_ == ST_ACKED else KIND_DEAD
        loc: tuple[int, int, int] | None = (s, o, n)
        if not segments.holds(s, o, n, kind, i):
            # the record moved (a repaired segment) or is gone: look for it by kind and id
            if found is None:
                k = scan.kept
                found = dict(zip(zip(k.kind, k.id, strict=True), zip(k.seg, k.off, k.size, strict=True), strict=True))
            loc = found.get((kind, i))
        if loc is not None:
            out[i] = loc
        else:
            lost[i] = s
    return out, lost
