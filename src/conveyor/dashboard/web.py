"""The dashboard's web side (aiohttp): the page, the JSON endpoints behind it, and the login.

The dashboard's web side (aiohttp): the page (static files shipped in the package, no build step,
nothing fetched from elsewhere), the JSON endpoints behind it (documented in docs/dashboard.md), and
the login a dashboard off loopback requires.

Security: only a Host it was told is answered (`hosts`: no DNS rebinding); every response forbids
inline scripts and foreign sources (a Content-Security-Policy), so an error text holding HTML or
script can only ever show as text; a POST needs the header `X-Conveyor: 1`, which a page of another
site cannot send here without the browser asking first (and this server never says yes); with a
token, a session cookie (an HMAC of the token, never the token) or `Authorization: Bearer <token>`
is required, and wrong ones are slowed per source address (`conveyor.protocol.throttle`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.constants import ERR_NO_QUEUE
from conveyor.dashboard.hosts import Hosts
from conveyor.dashboard.state import PoolWatch
from conveyor.dashboard.task_lookup import DEFAULT_TASKS, MAX_TASKS
from conveyor.errors import ConveyorError, RequestError
from conveyor.protocol.http import HttpService, bearer_ok, serve_app
from conveyor.protocol.task_pages import TaskState
from conveyor.protocol.throttle import Throttle

log = logging.getLogger("conveyor.dashboard")

STATIC = Path(__file__).with_name("static")
SESSION_COOKIE = "conveyor_dashboard"
CSRF_HEADER = "X-Conveyor"
MAX_PAGE = 500  # dead letters per page at most
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
OPEN_PATHS = ("/login", "/static/style.css")  # reachable before logging in

if TYPE_CHECKING:
    from aiohttp import web

    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# aiohttp is imported where used: `conveyor` commands other than `dashboard` do not pay for it


def session_of(token: str) -> str:
    """The session cookie's value for a token: proves the login without being the token."""
    return hmac.new(token.encode(), b"conveyor dashboard session", hashlib.sha256).hexdigest()


def make_app(watch: PoolWatch, token: str | None, secure: bool, hosts: Hosts) -> web.Application:
    """The dashboard over `watch`, answering requests to `hosts`.

    The dashboard over `watch`, answering requests to `hosts`; with `token`, everything but the
    login needs it (`secure`: over HTTPS, so the cookie is marked Secure).
    """
    from aiohttp import web

    key, session = (None, None) if token is None else (token.encode(), session_of(token).encode())
    throttle = Throttle()  # the login, the cookie and the Bearer header alike

    async def authorized(request: web.Request) -> bool:
        if key is None or session is None:
            return True
        given, cookie = request.headers.get("Authorization", ""), request.cookies.get(SESSION_COOKIE, "").encode()
        if not given and not cookie:  # no guess: sent to the login at once
            return False
        return await throttle.check(request.remote, lambda: bearer_ok(given, key) or hmac.compare_digest(cookie, session))

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        sockname = None if request.transport is None else request.transport.get_extra_info("sockname")
        if not hosts.answers(request.headers.get("Host"), -1 if not sockname else sockname[1], request.raw_path):
            response: web.StreamResponse = _error(
                421,
                f"this dashboard answers only to loopback names and those given by --allow-host, not "
                f"{request.headers.get('Host')!r:.80}: if that is how you reach it, add --allow-host with that name",
            )
        elif request.path not in OPEN_PATHS and not await authorized(request):
            if request.path.startswith("/api/"):
                response = _error(401, "log in first (or send Authorization: Bearer <token>)")
            else:
                response = _redirect("/login")
        elif request.method == "POST" and request.path != "/login" and request.headers.get(CSRF_HEADER) != "1":
            response = _error(403, f"a POST needs the header {CSRF_HEADER}: 1")
        else:
            try:
                response = await handler(request)
            except web.HTTPException as e:  # a 404, say: shown with the same headers
                response = web.Response(status=e.status, text=e.text or e.reason, content_type="text/plain")
        response.headers.update(SECURITY_HEADERS)
        return response

    async def login_page(request: web.Request) -> web.StreamResponse:
        if session is None:
            return _redirect("/")
        return web.FileResponse(STATIC / "login.html")

    async def login(request: web.Request) -> web.StreamResponse:
        if key is None or session is None:
            return _redirect("/")
        given = (await request.post()).get("token")
        if not isinstance(given, str) or not await throttle.check(
            request.remote, lambda: hmac.compare_digest(given.strip().encode(), key)
        ):
            log.warning("dashboard: a wrong token from %s", request.remote)
            return _redirect("/login?failed=1")
        response = _redirect("/")
        response.set_cookie(SESSION_COOKIE, session.decode(), httponly=True, samesite="Strict", secure=secure)
        return response

    async def index(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def overview(request: web.Request) -> web.StreamResponse:
        return _json(watch.overview())

    async def history(request: web.Request) -> web.StreamResponse:
        return _json(watch.history(request.query.get("queue") or None, request.query.get("internal") == "1"))

    async def dead_letters(request: web.Request) -> web.StreamResponse:
        q = request.query
        try:
            limit = int(q.get("limit", "50"))
        except ValueError:
            return _error(400, "limit must be an integer")
        if not q.get("queue") or not 1 <= limit <= MAX_PAGE:
            return _error(400, f"give a queue, and a limit in 1..{MAX_PAGE}")
        cursor = q.get("cursor", "")
        if cursor and not _is_cursor(cursor):
            return _error(400, "a cursor is what the last page's 'next' said")
        return await _off_loop(lambda: watch.dead_letters(q["queue"], cursor, limit))

    async def requeue(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            queue, ids = body["queue"], body["ids"]
            if not isinstance(queue, str) or not (ids == "all" or (isinstance(ids, list) and ids)):
                raise ValueError("no queue name, or no ids")
            wanted = None if ids == "all" else [watch.tasks.parse_id(i) for i in ids]
        except (ValueError, KeyError, TypeError) as e:
            return _error(400, f'send {{"queue": NAME, "ids": [ID, ...] or "all"}} ({type(e).__name__}: {e})')
        log.info(
            "dashboard: requeue of %s dead letter(s) of %s asked by %s", ids if ids == "all" else len(ids), queue, request.remote
        )
        return await _off_loop(lambda: watch.requeue(queue, wanted))

    async def tasks(request: web.Request) -> web.StreamResponse:
        q = request.query
        try:
            limit = int(q.get("limit", str(DEFAULT_TASKS)))
            state = TaskState.named(q["state"]) if q.get("state") else None
            msg_id = watch.tasks.parse_id(q["id"]) if q.get("id", "").strip() else 0
        except ValueError as e:
            return _error(400, str(e))
        if not q.get("queue") or not 1 <= limit <= MAX_TASKS:
            return _error(400, f"give a queue, and a limit in 1..{MAX_TASKS}")
        name = q.get("task", "").strip()
        return await _off_loop(lambda: watch.tasks.page(q["queue"], name, state, msg_id, limit))

    async def task(request: web.Request) -> web.StreamResponse:
        q = request.query
        try:
            msg_id = watch.tasks.parse_id(q.get("id", ""))
        except ValueError as e:
            return _error(400, str(e))
        if not q.get("queue"):
            return _error(400, "give a queue, and the task's id (shard:n)")
        return await _off_loop(lambda: watch.tasks.task(q["queue"], msg_id))

    async def cancel(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            queue, given = body["queue"], body["ids"]
            if not isinstance(queue, str) or not queue or not isinstance(given, list) or not 0 < len(given) <= MAX_PAGE:
                raise ValueError(f"no queue name, or not 1 to {MAX_PAGE} ids")
            ids = [watch.tasks.parse_id(i) for i in given]
        except (ValueError, KeyError, TypeError) as e:
            return _error(400, f'send {{"queue": NAME, "ids": [ID, ...]}}, ids as shard:n ({type(e).__name__}: {e})')
        log.info("dashboard: cancel of %d task(s) of %s asked by %s", len(ids), queue, request.remote)
        return await _off_loop(lambda: watch.tasks.cancel(queue, ids))

    app = web.Application(middlewares=[guard], client_max_size=1 << 20)
    app.router.add_get("/", index)
    app.router.add_get("/login", login_page)
    app.router.add_post("/login", login)
    app.router.add_get("/api/overview", overview)
    app.router.add_get("/api/history", history)
    app.router.add_get("/api/dead-letters", dead_letters)
    app.router.add_post("/api/requeue", requeue)
    app.router.add_get("/api/tasks", tasks)
    app.router.add_get("/api/task", task)
    app.router.add_post("/api/cancel", cancel)
    app.router.add_static("/static/", STATIC)
    return app


async def _off_loop(work: Callable[[], Any]) -> web.StreamResponse:
    """Run a blocking call on the pool in a thread; a server's error becomes a 4xx or 502 with its text."""
    try:
        return _json(await asyncio.get_running_loop().run_in_executor(None, work))
    except RequestError as e:  # the server answered: no such queue (404), or the request refused
        return _error(404 if e.kind == ERR_NO_QUEUE else 400, str(e))
    except (ConveyorError, OSError) as e:
        return _error(502, f"{type(e).__name__}: {e}")


def _json(data: Any) -> web.Response:
    from aiohttp import web

    return web.Response(text=json.dumps(data, allow_nan=False), content_type="application/json")


def _redirect(location: str) -> web.Response:
    from aiohttp import web

    return web.Response(status=303, headers={"Location": location})


def _error(status: int, message: str) -> web.Response:
    from aiohttp import web

    return web.Response(status=status, text=json.dumps({"error": message}), content_type="application/json")


def _is_cursor(cursor: str) -> bool:
    shard, _, after = cursor.partition(":")
    return all(x.isascii() and x.isdecimal() for x in (shard, after))


async def start(
    watch: PoolWatch, host: str, port: int, token: str | None, tls: ssl.SSLContext | None, hosts: Hosts
) -> tuple[HttpService, int]:
    """Serve the dashboard on host:port (0: a free port) to `hosts`; (the service to clean up, the port)."""
    return await serve_app(make_app(watch, token, tls is not None, hosts), host, port, tls)
