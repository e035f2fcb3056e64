"""Failed token checks, slowed per source address, wherever a token is checked.

Failed token checks, slowed per source address: the one rule for every place a token is checked (the
queue protocol's handshake; the dashboard's login, session cookie and Bearer header; the metrics
endpoint's Bearer header).

`Throttle.check(peer, attempt)` runs `attempt` (a quick comparison with the token) for a peer and
says whether it passed. Two rules slow a guesser; neither slows a client that knows the token:

- **A budget of failures.** Each source address has THROTTLE_BURST tries, refilled one per pace
  (THROTTLE_PACE_S: 10 a second) and drained only by failed checks. A check runs only while its
  source has a try left; otherwise it waits its turn (first come, first served) for the next one.
  This bounds the guesses a source gets checked whatever it does: a guesser that never waits for
  its answers, and takes the lack of a prompt success for a failure, still learns at most one
  outcome per pace after its burst.
- **A late answer to a failure.** A source's failing answers go out one per two paces, each at least
  two paces after its check. A guesser that waits for its answers, on however many connections,
  therefore fails at half the refill rate and never empties the budget.

A right token drains nothing and is answered at once. So a client with the right token gets in at
once beside guessers that wait for their answers, even from the same address: they fail at half
the rate the budget refills. It waits only while tries are queued for a turn, and then behind
them, one per pace: for a few seconds after a flood of more tries at once than the burst (32
connections guessing together: about 4.5 s, as the first answers bring tries back to the queue
while it drains), and for as long as a guesser fires tries faster than
the refill without waiting for their answers. That is the price of the bound: nothing tells a
right try from a guess before it is checked, so a try checked out of turn would be a guess too.

Backoff: the pace doubles every THROTTLE_BACKOFF_EVERY failures of a source, up to
THROTTLE_MAX_PACE_S. A source without a failure for THROTTLE_FORGET_S is forgotten; so is the one
that failed least recently once THROTTLE_MAX_SOURCES are remembered (a source costs a few hundred
bytes; a forgotten one starts afresh, as a new address would). Successes store nothing. An IPv6
address counts by its /64, which one host commonly holds whole.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from conveyor.constants import (
    THROTTLE_BACKOFF_EVERY,
    THROTTLE_BURST,
    THROTTLE_FORGET_S,
    THROTTLE_MAX_PACE_S,
    THROTTLE_MAX_SOURCES,
    THROTTLE_PACE_S,
)

_MAX_DOUBLINGS = 32  # past THROTTLE_MAX_PACE_S long before: keeps the power of two small


def source_of(peer: str | None) -> str:
    """The source a peer's failures count against: its IP address, or an IPv6 one's /64 network.

    The source a peer's failures count against: its IP address; an IPv6 one's /64 network (an
    IPv4-mapped one as IPv4); anything that is not an IP address as itself.
    """
    if not peer:
        return "?"
    try:
        ip = ipaddress.ip_address(peer.split("%", 1)[0])  # %: an IPv6 scope, the interface it came in on
    except ValueError:
        return peer
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass(frozen=True)
class Rule:
    """How fast a source may fail: see the module's docstring (the defaults are the constants named there)."""

    pace_s: float = THROTTLE_PACE_S
    max_pace_s: float = THROTTLE_MAX_PACE_S
    burst: int = THROTTLE_BURST
    backoff_every: int = THROTTLE_BACKOFF_EVERY
    forget_s: float = THROTTLE_FORGET_S
    max_sources: int = THROTTLE_MAX_SOURCES

    def __post_init__(self) -> None:
        if not 0 < self.pace_s <= self.max_pace_s or min(self.burst, self.backoff_every, self.max_sources) < 1:
            raise ValueError(f"a throttle needs 0 < pace_s <= max_pace_s and a burst, backoff_every and max_sources >= 1: {self}")
        if self.forget_s < self.burst * self.max_pace_s:  # forgotten, a source starts with a full budget
            raise ValueError(f"a throttle must not forget a source before its budget is full again: {self}")


class _Source:
    """One source address's budget of failures, backoff and schedule of failing answers."""

    __slots__ = ("answer_at", "counted_at", "failed_at", "failures", "rule", "tries", "turns")

    def __init__(self, rule: Rule, now: float) -> None:
        self.rule = rule
        self.tries, self.counted_at = float(rule.burst), now
        self.failures, self.failed_at = 0, now
        self.answer_at = now  # when the latest failing answer goes out
        self.turns: asyncio.Lock | None = None  # first come, first served, while the budget is empty

    def pace(self) -> float:
        rule = self.rule
        return min(rule.max_pace_s, rule.pace_s * (1 << min(self.failures // rule.backoff_every, _MAX_DOUBLINGS)))

    def left(self, now: float) -> float:
        """Tries left now (refilled one per pace since last counted)."""
        self.tries = min(float(self.rule.burst), self.tries + (now - self.counted_at) / self.pace())
        self.counted_at = now
        return self.tries

    def queued(self) -> bool:
        return self.turns is not None and self.turns.locked()

    async def take_turn(self) -> None:
        """Wait, behind the checks queued before, until a try is left."""
        if self.turns is None:
            self.turns = asyncio.Lock()
        async with self.turns:
            while (short := 1.0 - self.left(time.monotonic())) > 0:
                await asyncio.sleep(short * self.pace())

    def failed(self, now: float) -> float:
        """Count a failure; how long its answer waits."""
        self.left(now)
        self.tries -= 1
        self.failures += 1
        self.failed_at = now
        self.answer_at = max(self.answer_at, now) + 2 * self.pace()
        return self.answer_at - now

    def at_rest(self, now: float) -> bool:
        """Nothing to remember: no failure for `forget_s`, no answer or check waiting."""
        return not self.queued() and now >= max(self.failed_at + self.rule.forget_s, self.answer_at)


class Throttle:
    """Failed token checks of one server (all its ways in), slowed per source address: see the module's docstring.

    Used from one event loop.
    """

    def __init__(self, rule: Rule | None = None) -> None:
        self.rule = rule or Rule()
        self._sources: OrderedDict[str, _Source] = OrderedDict()  # least recently failed first

    def __len__(self) -> int:
        """How many sources it remembers."""
        return len(self._sources)

    async def check(self, peer: str | None, attempt: Callable[[], bool]) -> bool:
        """Whether `attempt` (a token check for `peer`, an IP address) passed.

        Whether `attempt` (a token check for `peer`, an IP address) passed: run at once while
        `peer`'s address has tries left, else in its turn; a failure returns only when its answer is
        due.
        """
        key = source_of(peer)
        source = self._sources.get(key)
        if source is not None and (source.queued() or source.left(time.monotonic()) < 1):
            await source.take_turn()
        # no await from the turn to the count below: the next in line sees this failure
        if attempt():
            return True
        await asyncio.sleep(self._failed(key))
        return False

    def _failed(self, key: str) -> float:
        now = time.monotonic()
        source = self._sources.get(key)
        if source is None or source.at_rest(now):
            source = self._sources[key] = _Source(self.rule, now)
        self._sources.move_to_end(key)
        delay = source.failed(now)
        while self._sources and (len(self._sources) > self.rule.max_sources or next(iter(self._sources.values())).at_rest(now)):
            self._sources.popitem(last=False)
        return delay
