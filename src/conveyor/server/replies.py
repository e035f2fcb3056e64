"""What a reply may hold: the limits its client announced, and room in the server's memory budget.

A handler whose reply carries payloads (messages, results, dead letters, a blob) asks for room for a
page of it (`room`) before it reads them, so that replies are made only as fast as the budget lets
them out (`conveyor.server.budget`). An item bigger than a page comes alone, past the page it was
given room for; `check_fits` refuses one that breaks the client's own limits.
"""

from __future__ import annotations

from conveyor.constants import ERR_BAD_ARGUMENT, ERR_TOO_LARGE
from conveyor.errors import RequestError
from conveyor.protocol.declarations import LIMITS_KEY, Arguments
from conveyor.protocol.framing import Limits
from conveyor.server.budget import reply_room

_DEFAULT_LIMITS = Limits()


def reply_limits(a: Arguments) -> Limits:
    """What the client accepts in a reply: it says so when that is not the default (`Limits`)."""
    v = a.header.get(LIMITS_KEY)
    if v is None:
        return _DEFAULT_LIMITS
    try:
        return Limits.from_list(v)
    except ValueError as e:
        raise RequestError(ERR_BAD_ARGUMENT, f"{a.op.name}: '{LIMITS_KEY}': {e}") from None


async def room(lim: Limits) -> Limits:
    """`lim`, once the budget has room for a page of a reply within them (at once outside a server)."""
    if (wait := reply_room(lim.reply_bytes())) is not None:
        await wait
    return lim


def check_fits(what: str, size: int, head: int, lim: Limits, more: str = "") -> None:
    """Check an item a reply holds alone against the client's limits.

    An item a reply holds alone (it came alone: bigger than a page): a `too-large` error if even so
    it breaks the client's limits (`size`: its frame; `head`: its fields in the header).
    """
    if size > lim.max_item_bytes or head > lim.header_room():
        raise RequestError(
            ERR_TOO_LARGE,
            f"{what} of {size:,} bytes (and {head:,} of headers) does not fit in a reply "
            f"to this client, which takes at most {lim.max_frame_bytes:,} bytes per frame, "
            f"{lim.max_message_bytes:,} per reply and {lim.header_room():,} of headers: "
            f"give the client larger limits{more}",
        )
