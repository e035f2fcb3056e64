"""Servers out of reach, as a consumer sees them.

It says so when it notices, then once a minute while one stays out (naming it and how long), and
again when it answers; a consumer keeps serving the servers that answer meanwhile, and gives up
only past its `unreachable_s` (see `Consumer`).
"""

from __future__ import annotations

import logging
import time

from conveyor.client.backend import QueueBackend
from conveyor.client.transport import Transport
from conveyor.constants import OUT_OF_REACH_SAY_S

log = logging.getLogger("conveyor.worker")


def duration(seconds: float) -> str:
    """`seconds` as an operator reads it: "45 s", "3 min 5 s", "2 h 10 min"."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class Outages:
    """Says which of `pool`'s servers are out of reach (`who`: the consumer, at the start of each line)."""

    def __init__(self, pool: QueueBackend, who: str, limit_s: float | None, every_s: float = OUT_OF_REACH_SAY_S) -> None:
        self._clients = [c for c in pool.clients if isinstance(c, Transport)]  # an in-process backend has none
        self._who, self._limit_s, self._every_s = who, limit_s, every_s
        self._said: dict[str, float] = {}  # by address: when it was last said to be out of reach

    def say(self) -> None:
        """Log the servers out of reach not said within `every_s`, and those back since."""
        now, gone = time.monotonic(), {c.address: c.unreachable_s() for c in self._clients}
        for address, s in gone.items():
            if s == 0.0:
                if self._said.pop(address, None) is not None:
                    log.warning("%s: queue server %s answers again", self._who, address)
            elif now - self._said.get(address, -self._every_s) >= self._every_s:
                self._said[address] = now
                answering = sum(1 for g in gone.values() if g == 0.0)
                meanwhile = f"serving the {answering} that answer meanwhile" if answering else "no server answers"
                until = "for as long as it takes" if self._limit_s is None else f"until out of reach {duration(self._limit_s)}"
                log.warning(
                    f"{self._who}: queue server {address} out of reach for {duration(s)}: retrying it {until} ({meanwhile})"
                )
