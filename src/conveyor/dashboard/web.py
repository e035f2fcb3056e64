"""The dashboard's web side (aiohttp): the page (static files shipped in the package, no build step,
nothing fetched from elsewhere), the JSON endpoints behind it (documented in docs/dashboard.md),
and the login a dashboard off loopback requires.

Security: every response forbids inline scripts and foreign sources (a Content-Security-Policy),
so an error text holding HTML or script can only ever show as text; a POST needs the header
`X-Conveyor: 1`, which a page of another site cannot send here without the browser asking first
(and this server never says yes); with a token, a session cookie (an HMAC of the token, never the
token) or `Authorization: Bearer <token>` is required.
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

from conveyor.dashboard.state import PoolWatch
from conveyor.errors import ConveyorError
from conveyor.protocol.auth import is_loopback
from conveyor.protocol.http import bearer_ok, serve_app

log = logging.getLogger("conveyor.dashboard")

STATIC = Path(__file__).with_name("static")
SESSION_COOKIE = "conveyor_dashboard"
CSRF_HEADER = "X-Conveyor"
MAX_PAGE = 500  # dead letters per page at most
FAILED_LOGIN_DELAY_S = 0.5  # a wrong token is answered this much later: guessing is slow
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}  # fmt: skip
OPEN_PATHS = ("/login", "/static/style.css")  # reachable before logging in

if TYPE_CHECKING:
    from aiohttp import web

    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# aiohttp is imported where used: `conveyor` commands other than `dashboard` do not pay for it


def session_of(token: str) -> str:
    """The session cookie's value for a token: proves the login without being the token."""
    return hmac.new(token.encode(), b"conveyor dashboard session", hashlib.sha256).hexdigest()


def make_app(watch: PoolWatch, token: str | None, secure: bool) -> web.Application:
    """The dashboard over `watch`; with `token`, everything but the login needs it (`secure`: over
    HTTPS, so the cookie is marked Secure)."""
    from aiohttp import web

    session = None if token is None else session_of(token)

    def authorized(request: web.Request) -> bool:
        if session is None:
            return True
        if token is not None and bearer_ok(request.headers.get("Authorization", ""), token.encode()):
            return True
        return hmac.compare_digest(request.cookies.get(SESSION_COOKIE, "").encode(), session.encode())

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if session is None and not _loopback_name(request.host):  # a page of another site, rebound to this address
            response: web.StreamResponse = _error(421, f"this dashboard answers to loopback names only, not {request.host!r:.80}")
        elif request.path not in OPEN_PATHS and not authorized(request):
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
        if session is None or token is None:
            return _redirect("/")
        form = await request.post()
        given = form.get("token")
        if not isinstance(given, str) or not hmac.compare_digest(given.strip().encode(), token.encode()):
            await asyncio.sleep(FAILED_LOGIN_DELAY_S)
            log.warning("dashboard: a wrong token from %s", request.remote)
            return _redirect("/login?failed=1")
        response = _redirect("/")
        response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="Strict", secure=secure)
        return response

    async def index(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def overview(request: web.Request) -> web.StreamResponse:
        return _json(watch.overview())

    async def history(request: web.Request) -> web.StreamResponse:
        return _json(watch.history(request.query.get("queue") or None))

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
            wanted = None if ids == "all" else watch.check_ids(ids)
        except (ValueError, KeyError, TypeError) as e:
            return _error(400, f'send {{"queue": NAME, "ids": [ID, ...] or "all"}} ({type(e).__name__}: {e})')
        log.info("dashboard: requeue of %s dead letter(s) of %s asked by %s", ids if ids == "all" else len(ids), queue,
                 request.remote)  # fmt: skip
        return await _off_loop(lambda: watch.requeue(queue, wanted))

    app = web.Application(middlewares=[guard], client_max_size=1 << 20)
    app.router.add_get("/", index)
    app.router.add_get("/login", login_page)
    app.router.add_post("/login", login)
    app.router.add_get("/api/overview", overview)
    app.router.add_get("/api/history", history)
    app.router.add_get("/api/dead-letters", dead_letters)
    app.router.add_post("/api/requeue", requeue)
    app.router.add_static("/static/", STATIC)
    return app


async def _off_loop(work: Callable[[], Any]) -> web.StreamResponse:
    """Run a blocking call on the pool in a thread; a server's error becomes a 502 with its text."""
    try:
        return _json(await asyncio.get_running_loop().run_in_executor(None, work))
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


def _loopback_name(host: str) -> bool:
    """Whether a Host header names this machine's loopback (with or without a port)."""
    name = host.rsplit("]", 1)[0].lstrip("[") if host.startswith("[") else host.rsplit(":", 1)[0]
    return name == "localhost" or is_loopback(name)


def _is_cursor(cursor: str) -> bool:
    shard, _, after = cursor.partition(":")
    return all(x.isascii() and x.isdecimal() for x in (shard, after))


async def start(watch: PoolWatch, host: str, port: int, token: str | None,
                tls: ssl.SSLContext | None) -> tuple[web.AppRunner, int]:  # fmt: skip
    """Serve the dashboard on host:port (0: a free port); (the runner to clean up, the port)."""
    return await serve_app(make_app(watch, token, tls is not None), host, port, tls)
