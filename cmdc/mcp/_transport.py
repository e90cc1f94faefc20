"""The stdio transport of `cmdc.mcp.stdio`: a server as a child process, newline-delimited
JSON-RPC over its stdin and stdout, with bounds the SDK's own transport lacks.

- Lines are split from the raw bytes as they arrive: each chunk is scanned once, a line's pieces
  are joined once (`LineReader`); nothing is re-joined per chunk. A line past `max_message_bytes`
  is never held whole: its head and tail are kept (for its request id and the start of its text)
  and the rest only counted. A reply to `tools/call` past the cap becomes a result with the
  start of its text and a note saying it was clipped, its size and the cap; a reply to any other
  request past the cap becomes a JSON-RPC error saying so; anything else past it is dropped.
- Lines past `OFF_THREAD_BYTES` are parsed in a worker thread (pydantic's parser lets the trio
  thread run meanwhile).
- The server runs under `_reaper.py` (see there): in its own session and process group and,
  on Linux, below a child subreaper, so every process it starts ends with it, also one that
  left its process group. Closing: stdin closed, then SIGTERM, then SIGKILL, each wait bounded
  and shielded from cancellation.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TextIO

import anyio
import attrs
import mcp_types
import orjson
import trio
from mcp import StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

OFF_THREAD_BYTES = 256 * 1024
"""Lines longer than this are parsed in a worker thread."""
TAIL_BYTES = 4096
"""The end of an oversized line kept (its request id may come last)."""
CHUNK_BYTES = 65536
STOP_GRACE = 2.0
"""Seconds for each step of the shutdown: stdin closed, then SIGTERM, then SIGKILL."""
_REAPER = str(Path(__file__).with_name("_reaper.py"))
_LIFELINES: set[int] = set()
"""The write ends of the lifelines of the servers running now (see `stdio_transport`)."""


def _close_lifelines_in_child() -> None:
    """In a forked child (multiprocessing's fork, `os.fork`): close the lifelines' write ends,
    which are not its own; held open there, they would keep the servers alive after cmdc died."""
    for fd in list(_LIFELINES):
        with contextlib.suppress(OSError):
            os.close(fd)
    _LIFELINES.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_lifelines_in_child)

_PENDING_MAX = 4096  # requests remembered by id (for an oversized reply's method)
_CLIPPED_KEY = "cmdc.clipped"


@attrs.frozen
class Oversized:
    """A line past the cap: its size, its first bytes and its last bytes."""

    size: int
    head: bytes
    tail: bytes


@attrs.frozen
class Pieces:
    """A long line as the chunks it came in (joined by `join`, in a worker thread)."""

    parts: tuple[bytes, ...]

    def join(self) -> bytes:
        return b"".join(self.parts)


class LineReader:
    """Splits a byte stream into lines, linearly and within a bound: `feed` returns the lines a
    chunk completes (bytes, without the newline) and an `Oversized` for each line past `cap`.

    A line past `join_elsewhere` bytes comes as its `Pieces`, for the caller to join where the
    copy cannot stall anyone (a worker thread). `held` is the bytes it holds (at most `cap`, or
    `keep + TAIL_BYTES` for a line past it); `copied` counts the bytes its own joins copied
    (each line's bytes once at most, never a line re-joined per chunk)."""

    def __init__(self, cap: int, keep: int, join_elsewhere: int = OFF_THREAD_BYTES) -> None:
        self.cap = cap
        self.join_elsewhere = join_elsewhere
        self.keep = min(cap, keep)
        self.copied = 0
        self._parts: list[bytes] = []
        self._size = 0  # the current line's bytes so far (also past the cap)
        self._head: bytes | None = None  # set once the line went past the cap
        self._tail = bytearray()

    @property
    def held(self) -> int:
        return sum(len(p) for p in self._parts) + (len(self._head or b"") + len(self._tail))

    def feed(self, chunk: bytes | bytearray) -> list[bytes | Pieces | Oversized]:
        chunk = bytes(chunk)  # a stream may hand over a bytearray (mutable): one copy of the chunk
        out: list[bytes | Pieces | Oversized] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._add(chunk[start:end] if start or end < len(chunk) else chunk)
            out.append(self._finish())
            start = end + 1
        if start < len(chunk):
            self._add(chunk[start:] if start else chunk)
        return out

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        self._size += len(piece)
        if self._head is None and self._size <= self.cap:
            self._parts.append(piece)
            return
        if self._head is None:  # this piece takes the line past the cap: keep its head only
            self._parts.append(piece)
            head, room = [], self.keep
            for part in self._parts:  # only the first `keep` bytes are copied
                if room <= 0:
                    break
                head.append(part[:room])
                room -= len(head[-1])
            self._head, self._parts = b"".join(head), []
            self.copied += len(self._head)
        self._tail += piece[-TAIL_BYTES:]
        del self._tail[:-TAIL_BYTES]

    def _finish(self) -> bytes | Pieces | Oversized:
        line: bytes | Pieces | Oversized
        if self._head is not None:
            line = Oversized(self._size, self._head, bytes(self._tail))
        elif len(self._parts) == 1:
            line = self._parts[0]
        elif self._size > self.join_elsewhere:
            line = Pieces(tuple(self._parts))
        else:
            line = b"".join(self._parts)
            self.copied += len(line)
        self._parts, self._size, self._head = [], 0, None
        self._tail.clear()
        return line


# -- an oversized reply ----------------------------------------------------------------------------

_ID = rb'(-?\d{1,20}|"(?:[^"\\]|\\.){0,256}")'
_HEAD_ID = re.compile(rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*' + _ID)
_TAIL_ID = re.compile(rb'"id"\s*:\s*' + _ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*\Z')
_TEXT = re.compile(rb'"text"\s*:\s*"')
_PARTIAL_ESCAPE = re.compile(rb"\\(?:u[0-9A-Fa-f]{0,3})?\Z")


def reply_id(line: Oversized) -> int | str | None:
    """The request id of an oversized JSON-RPC reply: a top-level `"id"` before its first
    nested value (as the Python SDK writes it) or last (as the TypeScript SDK does)."""
    found = _HEAD_ID.match(line.head) or _TAIL_ID.search(line.tail)
    if found is None:
        return None
    with contextlib.suppress(orjson.JSONDecodeError):
        value = orjson.loads(found[1])
        if isinstance(value, (int, str)):
            return value
    return None


def head_text(head: bytes, max_bytes: int) -> str:
    """The start of the first `"text"` string in a (cut) JSON text, decoded, at most
    `max_bytes` of it read; "" when there is none."""
    found = _TEXT.search(head)
    if found is None:
        return ""
    raw = head[found.end() : found.end() + max_bytes]
    end = re.match(rb'(?:[^"\\]|\\.)*', raw)
    raw = raw[: end.end()] if end else b""
    raw = _PARTIAL_ESCAPE.sub(b"", raw)
    for cut in range(4):  # a UTF-8 character cut at the end
        with contextlib.suppress(orjson.JSONDecodeError):
            text = orjson.loads(b'"' + raw[: len(raw) - cut] + b'"')
            return text if isinstance(text, str) else ""
    return ""


def clipped_reply(line: Oversized, request: tuple[int | str, str], cap: int, keep: int) -> SessionMessage:
    """What an oversized reply to `request` (id, method) is replaced with (see the module docstring)."""
    rid, method = request
    what = (
        f"the MCP server's reply to {method} was {line.size:,} bytes, past the cap of {cap:,} bytes (max_message_bytes)"
    )
    message: mcp_types.JSONRPCResponse | mcp_types.JSONRPCError
    if method == "tools/call":
        note = f"[clipped: {what}; only its start is shown]"
        text = head_text(line.head, max(0, keep - 512))  # room for the note
        meta = {_CLIPPED_KEY: {"bytes": line.size, "cap": cap}}
        result = {"content": [{"type": "text", "text": f"{text}\n{note}" if text else note}], "_meta": meta}
        message = mcp_types.JSONRPCResponse(jsonrpc="2.0", id=rid, result=result)
    else:
        error = mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR, message=what)
        message = mcp_types.JSONRPCError(jsonrpc="2.0", id=rid, error=error)
    return SessionMessage(message)


def parse_line(line: bytes | Pieces) -> SessionMessage | Exception:
    """A line as a message, or the error that says why it is not one (the session surfaces it)."""
    if isinstance(line, Pieces):
        line = line.join()
    if not line.strip():
        return ValueError("an empty line")
    try:
        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        return exc
    return SessionMessage(message)


# -- the transport -----------------------------------------------------------------------------------


@attrs.define
class Link:
    """What the session's owner can watch: `closed` is set once the server's output ended or
    the server exited; `oversized` counts replies past the cap."""

    closed: trio.Event = attrs.field(factory=trio.Event)
    on_oversized: Callable[[int, str | None], None] = lambda size, method: None
    """Told of each message past the cap: its size, and the method it answers (None: dropped)."""
    returncode: int | None = None
    oversized: int = 0
    dropped: int = 0


@contextlib.asynccontextmanager
async def stdio_transport(
    params: StdioServerParameters,
    errlog: TextIO | None,
    *,
    max_message_bytes: int,
    keep_bytes: int,
    link: Link,
    stop_grace: float = STOP_GRACE,
) -> AsyncIterator[tuple[Any, Any]]:
    """An MCP transport (the streams a `mcp.Client` takes) to a server run as a child process."""
    env = get_default_environment() | (params.env or {})
    # The lifeline: the reaper holds the read end, only this process the write end (pipes are
    # not inherited; `pass_fds` hands the read end to the reaper alone). When this process ends,
    # however it ends, the kernel closes the write end and the reaper ends the server.
    lifeline, keep = os.pipe()
    _LIFELINES.add(keep)
    argv = [
        *(sys.executable, "-I", "-S", _REAPER, str(os.getpid()), str(stop_grace), str(lifeline)),
        *(params.command, *params.args),
    ]
    try:
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog if errlog is not None else subprocess.DEVNULL,
            env=env,
            cwd=params.cwd,
            start_new_session=True,
            pass_fds=(lifeline,),
        )
    except BaseException:
        _LIFELINES.discard(keep)
        os.close(keep)
        raise
    finally:
        os.close(lifeline)
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
    pending: dict[int | str, str] = {}  # request id -> method, for an oversized reply
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    async def read() -> None:
        reader = LineReader(max_message_bytes, keep_bytes + TAIL_BYTES)
        async with read_send:
            with contextlib.suppress(
                trio.ClosedResourceError, trio.BrokenResourceError, anyio.ClosedResourceError, anyio.BrokenResourceError
            ):
                while chunk := await stdout.receive_some(CHUNK_BYTES):
                    for line in reader.feed(chunk):
                        message = await _message(line)
                        if message is not None:
                            await read_send.send(message)
        link.closed.set()

    async def _message(line: bytes | Pieces | Oversized) -> SessionMessage | Exception | None:
        if isinstance(line, Oversized):
            link.oversized += 1
            rid = reply_id(line)
            method = pending.pop(rid, None) if rid is not None else None
            link.on_oversized(line.size, method)
            if rid is None or method is None:
                link.dropped += 1
                return None
            return await trio.to_thread.run_sync(clipped_reply, line, (rid, method), max_message_bytes, keep_bytes)
        if isinstance(line, Pieces) or len(line) > OFF_THREAD_BYTES:
            message = await trio.to_thread.run_sync(parse_line, line)
        elif not line.strip():
            return None
        else:
            message = parse_line(line)
        if (
            isinstance(message, SessionMessage)
            and isinstance(message.message, (mcp_types.JSONRPCResponse, mcp_types.JSONRPCError))
            and message.message.id is not None
        ):
            pending.pop(message.message.id, None)
        return message

    async def write() -> None:
        async with write_receive:
            try:
                async for session_message in write_receive:
                    message = session_message.message
                    if isinstance(message, mcp_types.JSONRPCRequest):
                        pending[message.id] = message.method
                        if len(pending) > _PENDING_MAX:
                            del pending[next(iter(pending))]
                    data = message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                    await stdin.send_all(data)
            except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
                await read_send.aclose()  # the server stopped reading: the session sees the end

    async def exited() -> None:
        link.returncode = await process.wait()
        link.closed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        nursery.start_soon(write)
        nursery.start_soon(exited)
        try:
            yield read_receive, write_send
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await _stop(process, stop_grace)
                finally:
                    _LIFELINES.discard(keep)
                    os.close(keep)
                link.returncode = process.returncode
                for stream in (read_receive, write_send):
                    await stream.aclose()
            nursery.cancel_scope.cancel()


async def _stop(process: trio.Process, grace: float) -> None:
    """Close stdin; wait `grace`; SIGTERM (the reaper ends the server and everything below it);
    wait; SIGKILL the reaper and the server's group. Every wait bounded."""
    assert process.stdin is not None
    with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError, OSError):
        await process.stdin.aclose()
    for step, wait in (("close", grace), ("term", 2 * grace + 1), ("kill", grace)):
        if step == "term":
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        elif step == "kill":
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        with trio.move_on_after(wait):
            await process.wait()
            break
    if process.stdout is not None:
        with contextlib.suppress(trio.ClosedResourceError, OSError):
            await process.stdout.aclose()
