"""One request, from its task's start to its reply.

One request, from its task's start to its reply: its handler, whatever that raises as an error
reply, and the memory it holds on the way.

A request's failure is its own: the reply says what went wrong (a store error, a bad argument, an
unknown operation) and the connection carries on. Only declared operations are timed, so that a
client cannot make the metrics' labels without end.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from conveyor.constants import CONNECTION_FREE_BYTES, ERR_BAD_ARGUMENT, ERR_INTERNAL, ERR_STORE, ERR_UNKNOWN_OP
from conveyor.errors import RequestError, StoreError
from conveyor.protocol.framing import Frames, Header
from conveyor.server.budget import REQUEST_BYTES, RequestBytes
from conveyor.server.connection import Connection
from conveyor.server.handlers import HANDLERS
from conveyor.server.metrics import RequestTimes
from conveyor.server.queues import QueueHost
from conveyor.storage.files import store_error

log = logging.getLogger("conveyor.server.queue_server")


async def handle(
    conn: Connection, host: QueueHost, times: RequestTimes, header: Header, frames: Frames, request_bytes: RequestBytes
) -> None:
    """Run a request from `conn` and send its reply (a request's task).

    What it holds of the memory budget (`request_bytes`: its bytes, let in as it was read, then room
    for its reply) is given back once its handler is done; its reply counts until its peer takes it.
    """
    REQUEST_BYTES.set(request_bytes)
    rid, op = header["id"], header["op"]
    t0 = time.perf_counter()
    found = HANDLERS.get(op)
    reply: dict[str, Any]
    out: Frames = []
    try:
        if conn.share.unsent > CONNECTION_FREE_BYTES:  # a peer that does not take its replies
            await conn.share.replies_taken()  # gets no more until it does
            if conn.writer.transport.is_closing():  # gone while this waited: nobody will read it
                return
        if found is None:
            raise RequestError(ERR_UNKNOWN_OP, f"unknown operation {op!r:.60}; known: {', '.join(HANDLERS)}")
        declared, handler = found
        reply, out = await handler(host, declared.arguments(header), frames)
        reply["id"] = rid
    except RequestError as e:
        reply = {"id": rid, "error": e.kind, "message": str(e)}
    except StoreError as e:
        log.error("%s %s: %s", conn.peer, op, e)
        reply = {"id": rid, "error": ERR_STORE, "message": f"{op}: {e}"}
    except (TypeError, ValueError) as e:  # the stores' own checks of what a request holds
        reply = {"id": rid, "error": ERR_BAD_ARGUMENT, "message": f"{op}: {e}"}
    except OSError as e:  # a file the server writes beside the stores (blobs, settings): a full disk, say
        log.error("%s %s: %s", conn.peer, op, e)
        reply = {"id": rid, "error": ERR_STORE, "message": f"{op}: {store_error(e, 'server files')}"}
    except Exception as e:
        log.exception("%s %s failed", conn.peer, op)
        reply = {"id": rid, "error": ERR_INTERNAL, "message": f"{op}: internal error: {type(e).__name__}: {e}"}
    finally:
        del frames
        request_bytes.release()  # the reply counts as itself from now on (`send`)
    if found is not None:  # not an unknown name: clients could make those labels without end
        times.observe(op, time.perf_counter() - t0)
    sending = conn.send(reply, out)
    del reply, out  # `send` lets them go once the transport has them
    await sending
