"""The local web page of agents, their context and every compaction (extra `ui`).

Two ways to serve it:

- live, from a running runtime: `open_runtime(ui=True)` or `await rt.serve_ui(port=...)`
  (`cmdc demo --ui`), with live updates from the event bus;
- offline and read-only, from a store: `cmdc ui DIR` or `cmdc ui postgresql://...`
  (`serve_store`).

It binds 127.0.0.1 by default and prints (or returns) a URL holding a random token; see
`cmdc.ui.app` for the checks every request passes. Read-only unless started `writable=True`.
Built on Starlette (ASGI) and Hypercorn's trio worker: `pip install 'cmdc-agents[ui]'`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from .._version import install_hint
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..runtime import Runtime
    from ..store import Store
    from .app import UIServer

EXTRA_HINT = f"the web page needs the ui extra: {install_hint('ui')}"
RECORDER_BUFFER = 10_000  # events the page's bus subscription holds before dropping (counted)


def _require() -> None:
    try:
        import hypercorn.trio  # noqa: F401
        import starlette  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"{EXTRA_HINT} ({exc})") from None


def _check(port: object, host: object) -> tuple[int, str]:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(f"port must be a number from 0 (any free port) to 65535, got {port!r:.80}")
    if not isinstance(host, str) or not host or len(host) > 255:
        raise ConfigError(f"host must be an address such as 127.0.0.1, got {host!r:.80}")
    return port, host


async def serve_runtime(
    runtime: Runtime, nursery: trio.Nursery, *, port: int = 0, host: str = "127.0.0.1", writable: bool = False
) -> UIServer:
    """Serve `runtime`'s page in `nursery` (its own: the page ends with the runtime)."""
    port, host = _check(port, host)
    _require()
    from .app import build_app, start_server
    from .data import LiveSource, Recorder

    recorder = Recorder(trace_all=runtime.tracing is not None)
    nursery.start_soon(recorder.run, runtime.subscribe(buffer=RECORDER_BUFFER))
    source = LiveSource(runtime, recorder, writable=bool(writable))
    app = build_app(source, recorder, secrets.token_urlsafe(24), host)
    return await start_server(nursery, app, host=host, port=port)


async def serve_store(
    store: str | Store,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    on_ready: Callable[[UIServer], Any] | None = None,
    task_status: trio.TaskStatus[UIServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a store's page (read-only) until cancelled; `on_ready(server)` once it listens
    (or `server = await nursery.start(serve_store, store)`)."""
    port, host = _check(port, host)
    _require()
    from ..store import open_store
    from .app import build_app, start_server
    from .data import StoreSource

    chosen = open_store(store)
    await chosen.start()
    try:
        async with trio.open_nursery() as nursery:
            app = build_app(StoreSource(chosen), None, secrets.token_urlsafe(24), host)
            server = await start_server(nursery, app, host=host, port=port)
            if on_ready is not None:
                on_ready(server)
            task_status.started(server)
    finally:
        if chosen is not store:
            with trio.CancelScope(shield=True):
                await chosen.aclose()


__all__ = ["EXTRA_HINT", "serve_runtime", "serve_store"]
