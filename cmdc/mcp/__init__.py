"""Tools from MCP servers (extra `mcp`, on the official `mcp` SDK).

    async with cmdc.open_runtime() as rt:
        everything = cmdc.mcp.stdio("npx", "-y", "@modelcontextprotocol/server-everything")
        agent = await rt.spawn("a1", provider, tools=[read_file, everything])

`stdio(command, *args)` runs a server as a child process, `http(url)` reaches one over
streamable HTTP, `in_process(server)` serves an `mcp.server.mcpserver.MCPServer` (the SDK's
FastMCP: plain Python functions) in this process. Each is a `ToolSource`: the runtime starts it
in its own nursery at the first spawn that names it (the server's tools are listed before
`spawn` returns; a server that cannot start fails the spawn), shares it between the agents
given it, and stops it when the runtime closes: a child process is ended (stdin closed, then
SIGTERM, then SIGKILL, each wait bounded) with every process it started (it runs in its own
process group, on Linux below a child subreaper: `cmdc/mcp/_reaper.py`), never orphaned. A
stdio server that died is restarted (`Restarts`), and its messages are read by a bounded reader
(`cmdc/mcp/_transport.py`: `max_message_bytes`, a tool result past it clipped with a note).

The server's tools become cmdc `Tool` values: their JSON schemas are the parameters the model
sees and the arguments are checked against them, and a call runs under the agent's tool timeout
and fan-out bound like any tool. When the server says its tools changed (`tools/list_changed`),
they are listed again and the agent's next request offers the new set. A tool error, a server
that failed or died, a call past its timeout: each is a tool result the model can read
(`is_error`), never an exception in the agent. Results are text: media and binary resources are
named, not pasted; a result over `max_result_bytes` is clipped in the middle.

The SDK is written on anyio, which runs on trio's own event loop (its trio backend): no asyncio
loop, no thread; cancelling a call cancels its request.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Mapping
from typing import Any, TextIO

import attrs
import orjson
import trio

from .._version import install_hint

try:
    import mcp_types
    from mcp import Client, MCPError, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.lowlevel import Server as LowLevelServer
    from mcp.server.mcpserver import MCPServer
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"cmdc.mcp needs the mcp extra: {install_hint('mcp')} ({exc})") from exc

from .._check import integer, optional_seconds, seconds, validator
from .._clip import clip
from ..errors import ConfigError, MCPServerError, MCPToolError
from ..events import (
    MCP_MESSAGE_CLIPPED,
    MCP_SERVER_FAILED,
    MCP_SERVER_GAVE_UP,
    MCP_SERVER_RESTART,
    MCP_TOOL_DROPPED,
    MCP_TOOLS_CHANGED,
    MCP_TOOLS_LIST_FAILED,
    Event,
    log_event,
    logging_enabled,
)
from ..tools import Tool, ToolSet
from ._transport import Link, stdio_transport

__all__ = ["MCPServerError", "MCPToolError", "MCPTools", "Restarts", "http", "in_process", "stdio"]

MAX_TOOLS = 512
"""Tools listed from one server beyond this many are dropped (a hostile or broken server)."""
MAX_DESCRIPTION_BYTES = 4096
MAX_SCHEMA_BYTES = 64 * 1024
STDERR_TAIL_BYTES = 4096
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The default cap on one message from a stdio server (`stdio(max_message_bytes=...)`)."""
_SAFE = re.compile(r"[^A-Za-z0-9_-]")


def _prefix(_inst: object, _attr: object, value: object) -> None:
    if not isinstance(value, str) or _SAFE.search(value) or len(value) > 32:
        raise ConfigError(f"prefix must be at most 32 letters, digits, '_' or '-', got {value!r}")


@attrs.frozen
class Restarts:
    """How a stdio server that died is restarted: after `backoff` seconds, doubling with each
    restart up to `max_backoff`, at most `max_restarts` times in a row; a server that ran
    `reset_after` seconds before dying starts the count again. Each restart is an
    `mcp_server_restart` event, giving up an `mcp_server_gave_up` event. Meanwhile (and after
    giving up) its tools answer the model that the server is not running."""

    max_restarts: int = attrs.field(default=5, validator=validator(integer, "Restarts.{}", minimum=0))
    backoff: float = attrs.field(default=0.5, validator=validator(seconds, "Restarts.{}"))
    max_backoff: float = attrs.field(default=30.0, validator=validator(seconds, "Restarts.{}"))
    reset_after: float = attrs.field(default=60.0, validator=validator(seconds, "Restarts.{}"))

    def delay(self, restart: int) -> float:
        """Seconds to wait before restart number `restart` (1, 2, ...)."""
        return float(min(self.max_backoff, self.backoff * 2 ** min(restart - 1, 62)))


def _restarts(_inst: object, _attr: object, value: object) -> None:
    if value is not None and not isinstance(value, Restarts):
        raise ConfigError(f"restarts must be a cmdc.mcp.Restarts or None, got {value!r:.80}")


@attrs.frozen(eq=False)  # hashed by identity: the runtime starts each one once
class MCPTools:
    """An MCP server as a source of tools (`spawn(tools=[...])`). Made by `stdio`, `http` and
    `in_process`; see the module docstring."""

    name: str
    target: StdioServerParameters | str | MCPServer | LowLevelServer[Any] = attrs.field(repr=False)
    prefix: str = attrs.field(default="", validator=_prefix)
    timeout: float | None = attrs.field(default=None, validator=validator(optional_seconds, "{}"))
    connect_timeout: float = attrs.field(default=30.0, validator=validator(seconds, "{}"))
    max_result_bytes: int = attrs.field(default=256 * 1024, validator=validator(integer, "{}", minimum=256))
    headers: Mapping[str, str] | None = attrs.field(default=None, repr=False)
    stderr: TextIO | None = attrs.field(default=None, repr=False)
    max_message_bytes: int = attrs.field(
        default=MAX_MESSAGE_BYTES, validator=validator(integer, "{}", minimum=64 * 1024)
    )
    restarts: Restarts | None = attrs.field(default=None, validator=_restarts)  # type: ignore[assignment]

    async def serve(self, *, task_status: trio.TaskStatus[ToolSet] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the server, list its tools, report them through `task_status`, then keep them
        current until cancelled. Before its tools are listed a failure raises `MCPServerError`;
        after, it is only recorded (`ToolSet.error`, and each call says so), and a stdio server
        with `restarts` is started again (see `Restarts`)."""
        live = ToolSet(self.name)
        tail = bytearray()  # the end of the server's stderr, for error messages
        policy = self.restarts if isinstance(self.target, StdioServerParameters) else None
        current: list[Client] = []  # the connection whose tools are listed now
        started = False
        restarts = 0

        def ready() -> None:
            nonlocal started
            live.error = None
            if not started:
                started = True
                task_status.started(live)

        while True:
            since = trio.current_time()
            try:
                why = await self._connection(live, tail, current, ready)
            except MCPServerError as exc:
                if not started:
                    raise
                why = str(exc)
            except Exception as exc:
                if not started:
                    why = f"{_why(exc)}{_stderr_note(tail)}"
                    raise MCPServerError(f"MCP server {self.name!r} did not start: {why}") from exc
                why = _why(exc)
            current.clear()
            stopped = f"MCP server {self.name!r} is not running: {why}"
            if policy is None:
                live.error = stopped
                _log(MCP_SERVER_FAILED, self.name, error=f"{stopped}{_stderr_note(tail)}")
                return
            if trio.current_time() - since >= policy.reset_after:
                restarts = 0
            if restarts >= policy.max_restarts:
                live.error = f"{stopped}; not restarted again after {restarts} restarts in a row (max_restarts)"
                _log(MCP_SERVER_GAVE_UP, self.name, restarts=restarts, error=f"{why}{_stderr_note(tail)}")
                return
            restarts += 1
            delay = policy.delay(restarts)
            again = f"restart {restarts} of at most {policy.max_restarts}, in {delay:g} s"
            live.error = f"{stopped}; restarting it ({again})"
            _log(MCP_SERVER_RESTART, self.name, restarts=restarts, delay=delay, error=f"{why}{_stderr_note(tail)}")
            await trio.sleep(delay)

    async def _connection(self, live: ToolSet, tail: bytearray, current: list[Client], ready: Any) -> str:
        """One run of the server: connect, list its tools into `live`, call `ready()`, keep the
        tools current. Returns why it ended when a stdio server's link closed (it exited); fails
        with `MCPServerError` when it did not start (listed no tools within the deadline)."""
        started = False
        cap = self.max_message_bytes

        def oversized(size: int, method: str | None) -> None:
            what = f"a reply to {method}, clipped" if method else "not a reply to a pending request, dropped"
            _log(MCP_MESSAGE_CLIPPED, self.name, bytes=size, cap=cap, message=what)

        link = Link(on_oversized=oversized)
        # The start's deadline is a scope around the whole connection (a scope left while the
        # client it was entered around is still open would corrupt trio's scope stack).
        try:
            with trio.CancelScope(deadline=trio.current_time() + self.connect_timeout) as scope:
                async with trio.open_nursery() as nursery, contextlib.AsyncExitStack() as stack:
                    errlog = self._stderr_pipe(nursery, stack, tail)
                    changed_send, changed_receive = trio.open_memory_channel[None](1)

                    listening = False  # a 2026-era stream, whose events the session also tees here

                    async def on_message(message: Any) -> None:
                        if isinstance(message, mcp_types.ToolListChangedNotification) and not listening:
                            with contextlib.suppress(trio.WouldBlock):  # one pending refresh is enough
                                changed_send.send_nowait(None)

                    client = Client(self._transport(errlog, link), cache=None, message_handler=on_message)
                    # Its exit stops a child process, shielded, each wait bounded (a scope of
                    # ours around it would cross the client's own task group).
                    await stack.enter_async_context(client)
                    if errlog is not None and errlog is not self.stderr:
                        errlog.close()  # the child has its own copy
                    current[:] = [client]
                    live.replace(await self._list(client, live, tail, current))
                    scope.deadline = math.inf
                    caps = client.server_capabilities.tools
                    if caps is not None and caps.list_changed and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                        listening = True
                        nursery.start_soon(self._listen, client, changed_send)
                    nursery.start_soon(self._relist, client, live, tail, current, changed_receive)
                    started = True
                    ready()
                    if not isinstance(self.target, StdioServerParameters):
                        await trio.sleep_forever()
                    await link.closed.wait()
                    nursery.cancel_scope.cancel()
            if not started:  # the deadline passed
                why = f"no answer within {self.connect_timeout} s"
                raise MCPServerError(f"MCP server {self.name!r} did not start: {why}{_stderr_note(tail)}")
        except MCPServerError:
            raise
        except Exception as exc:
            if not started:
                why = f"{_why(exc)}{_stderr_note(tail)}"
                raise MCPServerError(f"MCP server {self.name!r} did not start: {why}") from exc
            raise
        code = link.returncode
        return "it exited" + (f" with status {code}" if code else "") if code is not None else "its output ended"

    # -- connecting -------------------------------------------------------------------------
    def _stderr_pipe(self, nursery: trio.Nursery, stack: contextlib.AsyncExitStack, tail: bytearray) -> TextIO | None:
        """For a child process: its stderr, either the one given or a pipe whose last bytes are
        kept for error messages (drained, so a chatty server never blocks on it)."""
        if not isinstance(self.target, StdioServerParameters):
            return None
        if self.stderr is not None:
            return self.stderr
        read_fd, write_fd = os.pipe()
        errlog = os.fdopen(write_fd, "w")
        stack.callback(errlog.close)
        nursery.start_soon(_keep_tail, trio.lowlevel.FdStream(read_fd), tail)
        return errlog

    def _transport(self, errlog: TextIO | None, link: Link) -> Any:
        target = self.target
        if isinstance(target, StdioServerParameters):
            return stdio_transport(
                target, errlog, max_message_bytes=self.max_message_bytes, keep_bytes=self.max_result_bytes, link=link
            )
        if isinstance(target, str):
            http_client = create_mcp_http_client(headers=dict(self.headers or {}))
            return streamable_http_client(target, http_client=http_client)
        return target

    async def _listen(self, client: Client, changed: trio.MemorySendChannel[None]) -> None:
        """A 2026-era server announces list changes on a `subscriptions/listen` stream."""
        with contextlib.suppress(Exception):  # a stream that fails leaves the listing as it was
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    with contextlib.suppress(trio.WouldBlock):
                        changed.send_nowait(None)

    async def _relist(
        self,
        client: Client,
        live: ToolSet,
        tail: bytearray,
        current: list[Client],
        changed: trio.MemoryReceiveChannel[None],
    ) -> None:
        async for _ in changed:
            try:
                with trio.fail_after(self.connect_timeout):
                    tools = await self._list(client, live, tail, current)
            except Exception as exc:  # keep the listing it had; a dead server's calls say so
                _log(MCP_TOOLS_LIST_FAILED, self.name, error=_why(exc))
                continue
            live.replace(tools)
            _log(MCP_TOOLS_CHANGED, self.name, tools=len(tools))

    # -- tools --------------------------------------------------------------------------------
    async def _list(self, client: Client, live: ToolSet, tail: bytearray, current: list[Client]) -> list[Tool]:
        specs: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _page in range(64):  # a paginator that never ends cannot hang the listing
            page = await client.list_tools(cursor=cursor)
            specs.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None or len(specs) >= MAX_TOOLS:
                break
        tools: list[Tool] = []
        names: set[str] = set()
        for spec in specs[:MAX_TOOLS]:
            made = self._tool(client, live, tail, current, spec, names)
            if made is not None:
                names.add(made.name)
                tools.append(made)
        return tools

    def _tool(
        self,
        client: Client,
        live: ToolSet,
        tail: bytearray,
        current: list[Client],
        spec: mcp_types.Tool,
        taken: set[str],
    ) -> Tool | None:
        """The cmdc tool for one listed MCP tool, or None (logged) when it cannot be one: a
        schema that is not a JSON object schema, too large, or a name taken after cleaning."""
        name = _SAFE.sub("_", f"{self.prefix}{spec.name}")[:64]
        schema = spec.input_schema
        try:
            size = len(orjson.dumps(schema))
        except TypeError:
            size = MAX_SCHEMA_BYTES + 1
        if name in taken or size > MAX_SCHEMA_BYTES:
            why = "name taken" if name in taken else "schema too large"
            _log(MCP_TOOL_DROPPED, self.name, tool=spec.name, reason=why)
            return None
        remote = spec.name
        server = self.name
        max_bytes = self.max_result_bytes

        async def call(**arguments: Any) -> str:
            if live.error is not None:
                raise MCPServerError(f"{live.error}{_stderr_note(tail)}")
            try:
                result = await client.call_tool(remote, arguments)
            except MCPError as exc:
                if exc.code == mcp_types.CONNECTION_CLOSED and exc.message == "Connection closed":
                    gone = f"MCP server {server!r} is not running: its connection closed (it exited or crashed)"
                    if current and current[0] is client and live.error is None:
                        live.error = gone  # until the serve loop says more (restarting, or not)
                    raise MCPServerError(f"{gone}{_stderr_note(tail)}") from None
                # the server refused the request (unknown tool, bad parameters, its own failure)
                raise MCPToolError(f"MCP server {server!r} refused the call: {exc.message}") from None
            except Exception as exc:  # the connection failed: a dead or broken server
                raise MCPServerError(f"MCP server {server!r} failed: {_why(exc)}{_stderr_note(tail)}") from None
            text = render_result(result, max_bytes)
            if result.is_error:
                raise MCPToolError(text or "the tool reported an error without text")
            return text

        description = clip(spec.description or spec.title or "", MAX_DESCRIPTION_BYTES, keep="head")
        try:
            return Tool(name, description, dict(schema), call, timeout=self.timeout)
        except ConfigError as exc:
            _log(MCP_TOOL_DROPPED, self.name, tool=spec.name, reason=str(exc))
            return None


def render_result(result: mcp_types.CallToolResult, max_bytes: int) -> str:
    """A tool result as text: text blocks as they are, media and binary resources named (never
    pasted as base64), structured content as JSON when there is no text; clipped to `max_bytes`."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, (mcp_types.ImageContent, mcp_types.AudioContent)):
            parts.append(f"[{block.type}: {block.mime_type}, {len(block.data) * 3 // 4} bytes, not shown]")
        elif isinstance(block, mcp_types.ResourceLink):
            about = f" ({block.description})" if block.description else ""
            parts.append(f"[resource link: {block.uri} {block.name}{about}]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            res = block.resource
            if isinstance(res, mcp_types.TextResourceContents):
                parts.append(f"[resource {res.uri}]\n{res.text}")
            else:
                mime = res.mime_type or "binary"
                parts.append(f"[resource {res.uri}: {mime}, {len(res.blob) * 3 // 4} bytes, not shown]")
    if not parts and result.structured_content is not None:
        parts.append(orjson.dumps(result.structured_content, option=orjson.OPT_NON_STR_KEYS).decode())
    return clip("\n".join(parts), max_bytes, note=" of the MCP tool's result")


# -- making one ---------------------------------------------------------------------------------


def stdio(
    command: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    name: str | None = None,
    prefix: str = "",
    timeout: float | None = None,
    connect_timeout: float = 30.0,
    max_result_bytes: int = 256 * 1024,
    stderr: TextIO | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    restarts: Restarts | None = Restarts(),  # frozen: one shared default is safe
) -> MCPTools:
    """An MCP server run as a child process speaking over its stdin and stdout.

    `env`: variables added to the small safe environment the SDK passes (HOME, PATH, ...).
    `prefix`: put before each tool's name (two servers with a tool of one name need one).
    `timeout`: seconds per call (None: the agent's `tool_timeout`); `connect_timeout`: for
    the start and each listing. `stderr`: where the server's stderr goes (a file with a file
    descriptor); by default it is drained and its last lines are quoted in error messages.
    `max_message_bytes`: the most one message from the server may take (16 MiB); a tool
    result past it is clipped to its start with a note saying so, its size and the cap, and
    never held whole. `restarts`: how a server that died is started again (`Restarts`: 5
    times in a row at most, backing off from 0.5 s); None: it stays down.

    The server runs in its own session and process group, on Linux below a child subreaper:
    when it stops (the runtime closes, or it dies), every process it started ends with it."""
    if not isinstance(command, str) or not command or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"stdio() takes a command and string arguments, got {command!r:.80} {args!r:.80}")
    params = StdioServerParameters(
        command=command, args=list(args), env=None if env is None else dict(env), cwd=None if cwd is None else str(cwd)
    )
    label = name or os.path.basename(args[-1] if command in ("npx", "uvx") and args else command)
    return MCPTools(
        label, params, prefix, timeout, connect_timeout, max_result_bytes, None, stderr, max_message_bytes, restarts
    )


def http(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    name: str | None = None,
    prefix: str = "",
    timeout: float | None = None,
    connect_timeout: float = 30.0,
    max_result_bytes: int = 256 * 1024,
) -> MCPTools:
    """An MCP server reached over streamable HTTP at `url` (`headers`: sent with each request,
    for example an `Authorization`)."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"http() takes an http:// or https:// URL, got {url!r:.80}")
    return MCPTools(name or url, url, prefix, timeout, connect_timeout, max_result_bytes, headers)


def in_process(
    server: MCPServer | LowLevelServer[Any],
    *,
    name: str | None = None,
    prefix: str = "",
    timeout: float | None = None,
    max_result_bytes: int = 256 * 1024,
) -> MCPTools:
    """An MCP server object served in this process: `MCPServer` (the SDK's FastMCP, whose plain
    `def` tools run in worker threads) or a low-level `Server`."""
    if not isinstance(server, (MCPServer, LowLevelServer)):
        raise ConfigError(f"in_process() takes an mcp MCPServer or Server, got {server!r:.80}")
    label = name or str(getattr(server, "name", "in-process"))
    return MCPTools(label, server, prefix, timeout, 30.0, max_result_bytes)


# -- helpers -------------------------------------------------------------------------------------


async def _keep_tail(stream: trio.lowlevel.FdStream, tail: bytearray) -> None:
    async with stream:
        with contextlib.suppress(trio.ClosedResourceError, OSError):
            while chunk := await stream.receive_some(65536):
                tail.extend(chunk)
                del tail[:-STDERR_TAIL_BYTES]


def _stderr_note(tail: bytearray) -> str:
    text = " | ".join(line.strip() for line in bytes(tail).decode("utf-8", "replace").splitlines() if line.strip())
    return f" (its stderr ends: {text[-600:]})" if text else ""


def _why(exc: BaseException) -> str:
    """A readable reason: the innermost exceptions of a group, their types and messages."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_why(e) for e in exc.exceptions[:3])
    if isinstance(exc, trio.TooSlowError):
        return "it did not answer in time"
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text}"


def _log(kind: str, server: str, **data: Any) -> None:
    if logging_enabled():
        log_event(Event(kind, f"mcp:{server}", {"server": server, **data}, trio.current_time()))
