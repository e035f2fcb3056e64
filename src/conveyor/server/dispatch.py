"""One request to the handler of its operation, and whatever that raises to an error reply.

A request's failure is its own: the reply says what went wrong (a store error, a bad argument, an
unknown operation) and the connection carries on. Only declared operations are timed, so that a
client cannot make the metrics' labels without end.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from conveyor.constants import ERR_BAD_ARGUMENT, ERR_INTERNAL, ERR_STORE, ERR_UNKNOWN_OP
from conveyor.errors import RequestError, StoreError
from conveyor.protocol.framing import Frames, Header
from conveyor.server.handlers import HANDLERS
from conveyor.server.metrics import RequestTimes
from conveyor.server.queues import QueueHost
from conveyor.storage.files import store_error

log = logging.getLogger("conveyor.server.queue_server")


async def answer(
    host: QueueHost, times: RequestTimes, peer: str, header: Header, frames: Frames
) -> tuple[dict[str, Any], Frames]:
    """The reply to one request from `peer`: its header fields (with the request's id) and frames."""
    rid, op = header["id"], header["op"]
    t0 = time.perf_counter()
    reply: dict[str, Any]
    out: Frames = []
    try:
        found = HANDLERS.get(op)
        if found is None:
            raise RequestError(ERR_UNKNOWN_OP, f"unknown operation {op!r:.60}; known: {', '.join(HANDLERS)}")
        declared, handler = found
        reply, out = await handler(host, declared.arguments(header), frames)
        reply["id"] = rid
    except RequestError as e:
        reply = {"id": rid, "error": e.kind, "message": str(e)}
    except StoreError as e:
        log.error("%s %s: %s", peer, op, e)
        reply = {"id": rid, "error": ERR_STORE, "message": f"{op}: {e}"}
    except (TypeError, ValueError) as e:  # the stores' own checks of what a request holds
        reply = {"id": rid, "error": ERR_BAD_ARGUMENT, "message": f"{op}: {e}"}
    except OSError as e:  # a file the server writes beside the stores (blobs, settings): a full disk, say
        log.error("%s %s: %s", peer, op, e)
        reply = {"id": rid, "error": ERR_STORE, "message": f"{op}: {store_error(e, 'server files')}"}
    except Exception as e:
        log.exception("%s %s failed", peer, op)
        reply = {"id": rid, "error": ERR_INTERNAL, "message": f"{op}: internal error: {type(e).__name__}: {e}"}
    if op in HANDLERS:  # not an unknown name: clients could make those labels without end
        times.observe(op, time.perf_counter() - t0)
    return reply, out
