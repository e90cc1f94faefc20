"""The web page as an ASGI app (Starlette) served on trio (Hypercorn's trio worker).

Every request passes `Guard` first: its `Host` must name this server on a loopback address
(a DNS-rebinding page's requests carry the attacker's host name), an `Origin`, when sent, must
be this server's (a cross-site request is refused; a POST must send one), and it must carry the
token: `?token=...` in the URL printed at start (the first such request sets a cookie and is
redirected to the same page without the token, as Jupyter does), then the cookie. Responses
carry a strict Content-Security-Policy: only the page's own script file runs, so even a text
that escaped escaping could not run a script.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import orjson
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from .._trio import one_of
from ..errors import CmdcError, ConfigError
from ..state import validate_agent_id
from . import pages
from .data import Recorder, Source, Watcher

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RANGE_MAX = 200  # journal records one page reads
SEARCH_LIMIT = 50
RAW_CHUNK = 1_000_000  # characters of one record one raw response gives
AGENTS_SHOWN = 5_000  # rows of the agents page (the rest: counted)
COALESCE = 0.5  # seconds a live page's updates gather before one is sent
HEARTBEAT = 15.0
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


class Guard:
    """The checks every request passes (see the module docstring); `port` is set once bound."""

    def __init__(self, app: ASGIApp, token: str, host: str) -> None:
        self.app = app
        self.token = token
        self.host = host
        self.port = 0

    @property
    def cookie(self) -> str:
        return f"cmdc-ui-{self.port}"

    def hosts(self) -> set[str]:
        names = {*LOOPBACK, self.host if ":" not in self.host else f"[{self.host}]"}
        return {f"{n}:{self.port}" for n in names}

    def origins(self) -> set[str]:
        return {f"http://{h}" for h in self.hosts()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return  # no websockets: the connection is closed unanswered
        started = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                took = f"app;dur={(time.perf_counter() - started) * 1000:.2f}".encode()
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS, (b"server-timing", took)]
            await send(message)

        host = headers.get("host", "")
        if host not in self.hosts():
            await _refuse(secured, 421, f"Host {host!r} is not this server (a DNS-rebinding attempt?)")
            return
        origin = headers.get("origin")
        if origin is not None and origin not in self.origins():
            await _refuse(secured, 403, f"requests from {origin!r} are refused (cross-site)")
            return
        if scope["method"] not in ("GET", "HEAD") and origin is None:
            await _refuse(secured, 403, "a request that changes something must come from this page (no Origin sent)")
            return
        query = scope.get("query_string", b"").decode("latin-1")
        pairs = parse_qsl(query, keep_blank_values=True)
        given = [v for k, v in pairs if k == "token"]
        if given:
            if not secrets.compare_digest(given[-1].encode(), self.token.encode()):
                await _refuse(secured, 403, "wrong token: open the URL the server printed")
                return
            rest = urlencode([(k, v) for k, v in pairs if k != "token"])
            location = quote(scope["path"]) + (f"?{rest}" if rest else "")
            cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
            await secured(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode())],
                }
            )
            await secured({"type": "http.response.body", "body": b""})
            return
        if not secrets.compare_digest(_cookie(headers.get("cookie", ""), self.cookie).encode(), self.token.encode()):
            await _refuse(secured, 403, "no token: open the URL the server printed (it holds ?token=...)")
            return
        await self.app(scope, receive, secured)


def _cookie(header: str, name: str) -> str:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


async def _refuse(send: Send, status: int, why: str) -> None:
    body = pages.message_page("refused", why).encode()
    headers = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _int(request: Request, key: str, default: int | None = None, minimum: int = 0) -> int | None:
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{key} must be a whole number, got {raw[:40]!r}") from None
    if value < minimum:
        raise ValueError(f"{key} must be at least {minimum}, got {value}")
    return value


def _agent(request: Request) -> str:
    name: str = request.path_params["name"]
    validate_agent_id(name)
    return name


def _page(title: str, text: str, status: int) -> HTMLResponse:
    return HTMLResponse(pages.message_page(title, text), status_code=status)


def build_app(source: Source, recorder: Recorder | None, token: str, host: str = "127.0.0.1") -> Guard:
    """The app, behind its `Guard` (whose `port` the server sets once bound)."""

    async def agents(request: Request) -> Response:
        rows = await source.rows()
        return HTMLResponse(pages.agents_page(rows, source=source.title, live=source.live, shown=AGENTS_SHOWN))

    async def agents_json(request: Request) -> Response:
        return JSONResponse([r.to_json() for r in (await source.rows())[:AGENTS_SHOWN]])

    async def agent(request: Request) -> Response:
        name = _agent(request)
        detail = await source.detail(name)
        if detail is None:
            return _page("not found", f"no agent called {name}", 404)
        return HTMLResponse(pages.agent_page(detail, source=source.title, writable=source.writable))

    async def journal(request: Request) -> Response:
        name = _agent(request)
        store = source.journal(name)
        if store is None:
            return _page("no journal", f"agent {name} has no journal that can be read now", 404)
        query = request.query_params.get("q", "").strip()[:500]
        try:
            first = _int(request, "first", minimum=1)
            last = _int(request, "last", minimum=1)
        except ValueError as exc:
            return _page("bad request", str(exc), 400)
        note = ""
        total: int | None = None
        if query:
            records = await store.search(name, query, SEARCH_LIMIT, max_chars=pages.SHOWN_CHARS)
        else:
            if first is None or last is None:
                every = await store.records(name, max_chars=0)
                total = every[-1].seq if every else 0
                if last is None:
                    last = total if first is None else first + 99
                if first is None:
                    first = max(1, last - 99)
            if last < first:
                return _page("bad request", f"last ({last}) is before first ({first})", 400)
            if last - first + 1 > RANGE_MAX:
                note = f"a page reads at most {RANGE_MAX} records: records {first}-{first + RANGE_MAX - 1} shown"
                last = first + RANGE_MAX - 1
            records = await store.read_range(name, first, last, max_chars=pages.SHOWN_CHARS)
        return HTMLResponse(
            pages.journal_page(
                name,
                records,
                source=source.title,
                live=False,
                query=query,
                first=first,
                last=last,
                total=total,
                note=note,
            )
        )

    async def raw(request: Request) -> Response:
        name = _agent(request)
        store = source.journal(name)
        try:
            seq = _int(request, "seq", minimum=1)
            offset = _int(request, "offset", 0) or 0
        except ValueError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        if store is None or seq is None:
            return PlainTextResponse("give ?seq=N of a record of this agent's journal", status_code=404)
        found = await store.read_range(name, seq, seq)
        if not found:
            return PlainTextResponse(f"no record {seq} in the journal of {name}", status_code=404)
        text = found[0].message.text
        chunk = text[offset : offset + RAW_CHUNK]
        headers = {"x-cmdc-record-chars": str(len(text))}
        if offset + RAW_CHUNK < len(text):
            headers["link"] = f'<{pages.raw_url(name, seq, offset + RAW_CHUNK)}>; rel="next"'
        return PlainTextResponse(chunk, headers=headers)

    async def compact(request: Request) -> Response:
        name = _agent(request)
        if not source.writable:
            return _page("read-only", "this page is read-only (start it with writable=True to act)", 403)
        try:
            await source.compact(name)
        except CmdcError as exc:
            return _page("compaction failed", f"{type(exc).__name__}: {exc}", 409)
        return RedirectResponse(pages.agent_url(name), status_code=303)

    async def events(request: Request) -> Response:
        if recorder is None:
            return PlainTextResponse("no live updates: this page shows a store", status_code=404)
        wanted = request.query_params.get("agent") or None
        if wanted is not None:
            validate_agent_id(wanted)
        watcher = Watcher(wanted)
        recorder.add(watcher)
        return StreamingResponse(
            _stream(source, recorder, watcher), media_type="text/event-stream", headers={"x-accel-buffering": "no"}
        )

    async def static(request: Request) -> Response:
        name = request.path_params["file"]
        kinds = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
        if name not in kinds:
            return PlainTextResponse("not found", status_code=404)
        data = resources.files("cmdc.ui").joinpath("static", name).read_bytes()
        return Response(data, media_type=kinds[name])

    async def bad_name(request: Request, exc: Exception) -> Response:
        return _page("not found", str(exc), 404)

    app = Starlette(
        routes=[
            Route("/", agents),
            Route("/api/agents", agents_json),
            Route("/events", events),
            Route("/static/{file}", static),
            Route("/agent/{name}", agent),
            Route("/agent/{name}/journal", journal),
            Route("/agent/{name}/raw", raw),
            Route("/agent/{name}/compact", compact, methods=["POST"]),
        ],
        exception_handlers={ConfigError: bad_name},
    )
    return Guard(app, token, host)


async def _stream(source: Source, recorder: Recorder, watcher: Watcher) -> AsyncIterator[str]:
    """A live page's updates: what changed, coalesced over `COALESCE` seconds; a heartbeat
    comment while nothing does. Per page at most the set of agents changed is held."""
    try:
        yield "retry: 2000\n\n"
        while True:
            with trio.move_on_after(HEARTBEAT) as scope:
                everything, changed = await watcher.wait()
            if scope.cancelled_caught:
                yield ": ping\n\n"
                continue
            if everything or (watcher.agent is None and len(changed) > 500):
                payload: dict[str, Any] = {"all": True}
            else:
                payload = {"rows": [r.to_json() for r in source.rows_of(sorted(changed))]}
            yield f"data: {orjson.dumps(payload).decode()}\n\n"
            await trio.sleep(COALESCE)
    finally:
        recorder.remove(watcher)


class UIServer:
    """A running web page: `url` opens it (with its token); `stop()` ends it."""

    def __init__(self, host: str, port: int, token: str, scope: trio.CancelScope) -> None:
        self.host = host
        self.port = port
        self.token = token
        self._scope = scope

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/?token={self.token}"

    def __repr__(self) -> str:
        return f"<UIServer http://{self.host}:{self.port}/>"

    def stop(self) -> None:
        self._scope.cancel()


async def start_server(nursery: trio.Nursery, app: Guard, *, host: str = "127.0.0.1", port: int = 0) -> UIServer:
    """Serve `app` in `nursery` on `host:port` (0: a free port); return once it listens."""
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.errorlog = logging.getLogger("cmdc.ui.server")  # quiet unless the application logs
    config.accesslog = None
    config.graceful_timeout = 1.0

    async def run(task_status: trio.TaskStatus[tuple[trio.CancelScope, list[str]]]) -> None:
        with trio.CancelScope() as scope:

            async def serve_it(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
                await serve(app, config, task_status=task_status)  # type: ignore[arg-type]

            async with trio.open_nursery() as inner:
                binds: list[str] = await inner.start(serve_it)
                task_status.started((scope, binds))

    try:
        scope, binds = await nursery.start(run)
    except (OSError, BaseExceptionGroup) as exc:  # the bind's error comes out of `run`'s nursery
        error = one_of(exc) if isinstance(exc, BaseExceptionGroup) else exc
        if not isinstance(error, OSError):
            raise
        raise ConfigError(f"the web page cannot listen on {host}:{port}: {error}") from None
    bound = int(binds[0].rsplit(":", 1)[1])
    app.port = bound
    return UIServer(host, bound, app.token, scope)
