"""Records the index confirmed and the segments no longer hold, found on opening.

Records the index confirmed and the segments no longer hold: found on opening, refused without
repair, and with it reported id by id and kept as FAILED messages whose dead letters say why.

The index records every change after a put: a delivery, a requeue, an ack with its result's place,
a failure with its dead letter's. So an unfinished message it names must still have its body in the
segments, and a result or dead letter it places must still be there. A crash tears off only records
written after the last ones the index confirmed; a segment that ends before what the index confirms
was cut short (or lost records to damage). Opening then refuses, naming the file, where its records
end and how many confirmed records lie beyond, so that nothing vanishes behind a torn-tail warning.

With `repair=True` each such id becomes FAILED with a dead letter whose error says what was lost and
where; its payload is the message's if the body is still there (a lost result), else empty. So the
ids read as failed, with a reason, rather than as never put, and the next opening is clean. Messages
put and never delivered have no index record: those in a cut-off part cannot be named.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from conveyor.constants import SEGMENT_NAME, ST_ACKED, ST_FAILED
from conveyor.errors import CorruptStoreError
from conveyor.storage.bodies import dead_letter_bodies, message_bodies
from conveyor.storage.segment_scan import Found
from conveyor.storage.state import QueueState

LOST_PREFIX = "lost:"  # how the error of a dead letter made by a repair begins
_SHOWN = 10  # id ranges an error names before "..."


@dataclass(frozen=True)
class Loss:
    """What one segment should hold and does not: the ids whose message body, result or dead letter is gone."""

    segment: Path
    end: int  # where its intact records end (0: the file is gone)
    messages: list[int]  # unfinished messages whose bodies are gone
    kept: list[int]  # results and dead letters gone
    bodies: dict[int, tuple[int, int, int]]  # of `kept`: (seg, off, size) of the message body, if still there

    def where(self) -> str:
        if self.end == 0:
            return f"{self.segment.name}, which is gone or held no intact record"
        return f"{self.segment.name}, whose intact records end at offset {self.end}"

    def errors(self) -> dict[int, str]:
        """The error of the dead letter a repair makes for each id."""

        def said(what: str, left: str) -> str:
            return (
                f"{LOST_PREFIX} the index confirmed {what}, but the record is gone from {self.where()} (the file "
                f"was cut short or damaged, and opened with repair); {left} is kept"
            )

        out = dict.fromkeys(self.messages, said("its message", "nothing of it"))
        for i in self.kept:
            out[i] = said("its result or dead letter", "its message" if i in self.bodies else "nothing of it")
        return out


def find_losses(
    path: Path, sizes: dict[int, int], found: Found, lost_messages: Sequence[int], lost_kept: dict[int, int]
) -> list[Loss]:
    """The losses by segment, in segment order.

    `sizes`: segment -> where its intact records end; `found`: the message records found (ascending
    ids); `lost_messages`: ids the index names unfinished whose bodies are not found; `lost_kept`:
    id -> segment of results and dead letters not found. A lost message is placed in the segment
    holding the message before it (bodies are appended in id order), or the first segment.
    """
    ids = found.id
    first = min(sizes, default=1)
    by_seg: dict[int, tuple[list[int], list[int]]] = {}
    for i in lost_messages:
        before = bisect.bisect_left(ids, i) - 1
        by_seg.setdefault(found.seg[before] if before >= 0 else first, ([], []))[0].append(i)
    bodies: dict[int, tuple[int, int, int]] = {}
    for i, s in sorted(lost_kept.items()):
        by_seg.setdefault(s, ([], []))[1].append(i)
        k = bisect.bisect_left(ids, i)
        if k < len(ids) and ids[k] == i:
            bodies[i] = (found.seg[k], found.off[k], found.size[k])
    return [
        Loss(path / SEGMENT_NAME.format(s), sizes.get(s, 0), m, k, {i: bodies[i] for i in k if i in bodies})
        for s, (m, k) in sorted(by_seg.items())
    ]


def refusal(losses: list[Loss]) -> CorruptStoreError:
    """The error of an opening without repair: the first segment short of what the index confirms."""
    x = losses[0]
    parts = [
        f"unfinished messages {ranges(x.messages)}" if x.messages else "",
        f"results or dead letters {ranges(x.kept)}" if x.kept else "",
    ]
    others = sum(len(y.messages) + len(y.kept) for y in losses[1:])
    more = f"; {others:,} more ids in {len(losses) - 1} other segment(s)" if others else ""
    where = "beyond this offset, where its intact records end" if x.segment.exists() else "in it, and the file is gone"
    return CorruptStoreError(
        str(x.segment),
        x.end,
        f"the index confirms the records of {len(x.messages) + len(x.kept):,} ids {where} "
        f"({'; '.join(p for p in parts if p)}): the file was cut short or damaged (a crash tears "
        f"off only records the index never confirmed){more}",
    )


def lost_dead_letters(
    st: QueueState, losses: list[Loss], read: Callable[[int, int, int], bytes], now: float
) -> tuple[list[int], list[int], list[bytes]]:
    """(ids, attempts, dead-letter bodies) for every id in `losses`, in id order.

    (ids, attempts, dead-letter bodies) for every id in `losses`, in id order: each error says what
    was lost and where; the message's body is kept where it is still there (`read(seg, off, size)`:
    so a lost result's message can be requeued), else the body has an empty payload.
    """
    error = {i: e for x in losses for i, e in x.errors().items()}
    where = {i: loc for x in losses for i, loc in x.bodies.items()}
    ids = sorted(error)
    attempts = st.column_of("attempts", ids)
    zero = [0] * len(ids)
    empty = message_bodies(ids, zero, zero, [0.0] * len(ids), [b""] * len(ids), None, 0.0)  # where the body is gone too
    bodies = [read(*where[i]) if i in where else e for i, e in zip(ids, empty, strict=True)]
    return ids, attempts, dead_letter_bodies([error[i] for i in ids], now, attempts, bodies)


def mark_failed(st: QueueState, ids: Sequence[int], failed_before: set[int]) -> None:
    """Count `ids` (each finished or lost) as FAILED from now on; `failed_before`: the ids that were."""
    was_acked = 0
    for i in ids:
        if st.base <= i < st.next_id:
            st.status[i - st.base] = ST_FAILED
        elif i not in failed_before:
            was_acked += 1
    st.finished_below_base[ST_ACKED] -= was_acked
    st.finished_below_base[ST_FAILED] += was_acked


def ranges(ids: list[int], most: int | None = _SHOWN) -> str:
    """Ids as ascending ranges ("3-7, 9"): the first `most` ranges, then how many more (None: all)."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    out = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if most is None or len(out) <= most:
        return ", ".join(out)
    return f"{', '.join(out[:most])}, ... ({len(out) - most} more ranges)"
