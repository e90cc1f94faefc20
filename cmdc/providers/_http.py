"""Plumbing shared by the HTTP providers: settings, the client, retries, SSE, images, arguments.

Needs the `http` extra (httpx). Every request goes through `HTTPProvider._post`:

- the body is sent with `client.stream(...)` inside `async with`, so a cancelled or failed
  request (streaming or not) closes its response and never leaves a connection checked out;
- a failure is classified (`overflow.classify`); rate limits, overload, 5xx, 408, 409, cut
  connections and truncated streams are retried (exponential backoff with jitter, as stamina
  does it, sleeping with `trio.sleep`), waiting at least what `retry-after-ms` / `retry-after`
  asks for; each retry is logged to the stdlib logger `cmdc.providers` (silent unless the
  application configured logging: a library never prints);
  an overflow, an auth, quota or bad-request error is raised at once;
- an `OutputBudgetOverflow` that leaves a useful output budget is retried once with the output
  limit lowered to what fits.

Everything from the endpoint is bounded (`ReplyLimits`): the body's bytes, one SSE line, the
number of tool calls, and one response's duration (raising `ReplyTooLarge`,
`TooManyToolCalls` or `ProviderTimeout`, never retried). `timeout` is httpx's per-request
timeout (connect, and each read: for a stream, the gap between chunks); `deadline` bounds a
whole `complete()` call, retries and their waits included (`ProviderTimeout`). The caller's
cancel scopes still apply on top.
"""

from __future__ import annotations

import base64
import logging
import math
import mimetypes
import os
import random
import re
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Self

import attrs
import httpx
import orjson
import trio

from .._check import flag, is_number, text
from .._frozen import past_bounds
from ..errors import (
    ConfigError,
    ConnectionFailed,
    InvalidMessage,
    OutputBudgetOverflow,
    ProviderError,
    ProviderTimeout,
    ReplyTooLarge,
)
from ..message import ImagePart, Message, ToolCall
from ._settings import HTTPKeywords, HTTPSettings, ReplyLimits
from .base import (
    CONTEXT_EXCEEDED_KEY,
    INVALID_ARGUMENTS_KEY,
    OUTPUT_REDUCED_KEY,
    REFUSED_ARGUMENTS_KEY,
    STOP_REASON_KEY,
)
from .overflow import classify, retryable

MAX_RETRY_AFTER = 60.0
"""A server asking to wait longer than this (seconds) is not retried: the classified error
(with its `retry_after`) is raised for the caller to decide."""
MIN_REDUCED_OUTPUT = 1024
"""An `OutputBudgetOverflow` is retried with a lower output limit only if at least this many
output tokens still fit; with less room, compaction is the better remedy."""
DRAIN_SECONDS = 1.0
"""How long a stream's body is read after its terminal event before the connection is cut."""
WAIT_INITIAL = 0.5
WAIT_MAX = 8.0
WAIT_JITTER = 1.0

_log = logging.getLogger("cmdc.providers")


def retry_wait(exc: Exception, retry: int) -> float | None:
    """Seconds to wait before retry number `retry` (1-based) after `exc`, or None to raise it:
    exponential backoff (`WAIT_INITIAL` doubling, at most `WAIT_MAX`) plus up to `WAIT_JITTER`
    of jitter; a server's `retry_after` is honoured but never shortens the backoff, and one
    longer than `MAX_RETRY_AFTER` is not waited."""
    if not retryable(exc):
        return None
    backoff = min(WAIT_MAX, WAIT_INITIAL * 2.0 ** min(retry - 1, 32))
    wait: float | None = getattr(exc, "retry_after", None)
    if wait is None:
        return min(WAIT_MAX, backoff + random.uniform(0, WAIT_JITTER))
    if wait > MAX_RETRY_AFTER:
        return None
    return max(float(wait), backoff)


USER_AGENT = "cmdc"

ERROR_BODY_BYTES = 64 * 1024
"""How much of an error response's body is read to classify it (the rest is not read)."""


_DEFAULT_LIMITS = ReplyLimits()

Parse = Callable[[httpx.Response], Awaitable[Message]]
"""Reads a successful response (JSON or SSE) into an assistant message, or raises."""


# -- settings --------------------------------------------------------------------------------------


def setting(value: str | None, env: str, default: str | None = None) -> str | None:
    """An explicit value, else the environment variable `env` (empty counts as unset), else `default`."""
    if value is not None:
        if not isinstance(value, str):
            raise ConfigError(f"the value for {env} must be a string, got a {type(value).__name__}")
        return value
    from_env = os.environ.get(env)
    return from_env if from_env else default


def require_key(
    provider: str,
    *,
    api_key: str | None,
    env: str,
    base_url: str,
    vendor_url: str,
    headers: Mapping[str, str],
    auth_headers: tuple[str, ...],
    client: object,
) -> None:
    """A provider bound for its vendor's own endpoint with no key (argument, environment or
    header) fails at construction with `ConfigError`, not at its first request after retries.
    Another endpoint (a local or compatible server) may need no key; with your own `client`,
    its headers may carry one."""
    if api_key or client is not None or base_url.rstrip("/") != vendor_url.rstrip("/"):
        return
    if any(k.lower() in auth_headers for k in headers):
        return
    raise ConfigError(
        f"{provider}: no API key for {vendor_url}: pass api_key=... or set {env} "
        "(a local or compatible server that needs no key: pass its base_url=...)"
    )


REDACTED = "***"
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_SECRET_PARAM = re.compile(r"([?&][^=&#\s]*=)[^&#\s]*")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@]*@")


def redact_url(url: str) -> str:
    """`url` with its userinfo and the value of every query parameter replaced by `***`
    (`https://***@host/v1?key=***`): what reprs, errors, logs and events show of a URL."""
    return _SECRET_PARAM.sub(lambda m: m[1] + REDACTED, _USERINFO.sub(lambda m: m[1] + REDACTED + "@", url))


def redact_urls(text: str) -> str:
    """`text` with every URL in it redacted (`redact_url`)."""
    return _URL.sub(lambda m: redact_url(m[0]), text) if "://" in text else text


def endpoint(base_url: str, path: str) -> str:
    """`path` appended to `base_url`'s path, keeping its query (Azure's `?api-version=...`)."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL as exc:
        raise ConfigError(f"base_url {redact_url(base_url)!r} is not a valid URL: {redact_urls(str(exc))}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"base_url must be an http(s) URL, got {redact_url(base_url)!r}")
    return str(url.copy_with(path=url.path.rstrip("/") + path))


def dumps(value: object) -> bytes:
    return orjson.dumps(value)


def count(value: object) -> int:
    """A token figure from a usage object: a non-negative integer, 0 for anything else (null)."""
    if not is_number(value) or not 0 <= value < 2**63:
        return 0
    return int(value)


def items(value: object, what: str) -> list[Any]:
    """A reply field that must be a list (or absent): anything else is a `ProviderError`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProviderError(f"the reply's {what} is a {type(value).__name__}, not a list: {value!r:.100}")
    return value


def new_call_id() -> str:
    return f"call_{secrets.token_hex(8)}"


# -- tool calls ------------------------------------------------------------------------------------


def tool_call(
    call_id: str | None,
    name: object,
    arguments: object,
    invalid: dict[str, str],
    limits: ReplyLimits | None = None,
    refused: dict[str, str] | None = None,
) -> ToolCall:
    """A `ToolCall` from a model's call. Arguments that are not a JSON object (text that does not
    parse, a list, a number) are delivered as `{}` and their raw text recorded in `invalid`
    (reply metadata `cmdc.invalid_tool_arguments`): the tool's validation then answers the model
    with a readable error and the agent keeps working. Arguments past the `limits`' argument
    bounds are delivered as `{}` and the reason recorded in `refused` (nothing of them kept)."""
    cid = call_id or new_call_id()
    limits = limits or _DEFAULT_LIMITS
    if not isinstance(name, str) or not name:
        raise ProviderError(f"the model called a tool without a name (call {cid!r}, arguments {arguments!r:.200})")
    raw: str | None = None
    value: object = arguments
    bounds = f"max_argument_values={limits.max_argument_values:,}, max_argument_depth={limits.max_argument_depth}"
    if isinstance(arguments, str) and _surely_too_many_keys(arguments, limits.max_argument_values):
        if refused is not None:  # refused unparsed: parsing them would stall every agent
            many = f"more than {limits.max_argument_values:,} values in all, {len(arguments):,} characters"
            refused[cid] = f"the arguments of this call were refused: {many} (the limits: {bounds})"
        return ToolCall(id=cid, name=name, arguments={})
    if isinstance(arguments, str):
        if arguments.strip():
            try:
                value = orjson.loads(arguments)
            except orjson.JSONDecodeError:
                raw = arguments
        else:
            value = {}
    elif arguments is None:
        value = {}
    if raw is None and not isinstance(value, Mapping):
        raw = arguments if isinstance(arguments, str) else orjson.dumps(arguments, default=str).decode()
    if raw is None and (past := past_bounds(value, limits.max_argument_values, limits.max_argument_depth)):
        size = f", {len(arguments):,} characters" if isinstance(arguments, str) else ""
        if refused is not None:
            refused[cid] = f"the arguments of this call were refused: {past}{size} (the limits: {bounds})"
        return ToolCall(id=cid, name=name, arguments={})
    if raw is None:
        try:
            return ToolCall(id=cid, name=name, arguments=value)
        except InvalidMessage:
            raw = orjson.dumps(arguments, default=str).decode() if not isinstance(arguments, str) else arguments
    invalid[cid] = raw
    return ToolCall(id=cid, name=name, arguments={})


def _surely_too_many_keys(text: str, most: int) -> bool:
    """Whether a JSON text surely has more than `most` object keys, found by counting, not
    parsing: outside a string a key ends `":`; inside one, `":` only comes escaped (`\\":`). The
    count is a lower bound (a key with a space before its colon is not counted)."""
    return len(text) > 2 * most and text.count('":') - text.count('\\":') > most


def reply_metadata(
    stop_reason: object, invalid: Mapping[str, str], refused: Mapping[str, str] | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    if isinstance(stop_reason, str) and stop_reason:
        metadata[STOP_REASON_KEY] = stop_reason
    if invalid:
        metadata[INVALID_ARGUMENTS_KEY] = {k: _clip_raw(v) for k, v in invalid.items()}
    if refused:
        metadata[REFUSED_ARGUMENTS_KEY] = dict(refused)
    return metadata


_RAW_KEPT = 4096


def _clip_raw(raw: str) -> str:
    """Invalid arguments' raw text as kept in the reply's metadata: its first 4,096 characters."""
    return raw if len(raw) <= _RAW_KEPT else f"{raw[:_RAW_KEPT]}... [{len(raw) - _RAW_KEPT:,} more characters not kept]"


# -- images ----------------------------------------------------------------------------------------


@attrs.frozen
class Image:
    """An image part resolved for sending: by URL, or as base64 data with its media type."""

    url: str | None
    media_type: str
    data: str = ""

    def data_url(self) -> str:
        return self.url if self.url is not None else f"data:{self.media_type};base64,{self.data}"


async def load_image(part: ImagePart) -> Image:
    """Resolve an `ImagePart`: an http(s) URL is passed by reference, a data URL is decoded, a
    path (or `file://` URL) is read and sent as base64."""
    source = part.source
    if source.startswith(("http://", "https://")):
        return Image(url=source, media_type=part.media_type or _guess(source))
    if source.startswith("data:"):
        header, sep, payload = source[5:].partition(",")
        if not sep:
            raise ProviderError(f"image data URL is malformed: {source[:60]!r}")
        kinds = header.split(";")
        media = part.media_type or kinds[0] or "application/octet-stream"
        if "base64" in kinds[1:]:
            return Image(url=None, media_type=media, data=payload)
        return Image(url=None, media_type=media, data=base64.b64encode(urllib.parse.unquote_to_bytes(payload)).decode())
    path = urllib.parse.unquote(urllib.parse.urlparse(source).path) if source.startswith("file://") else source
    try:
        raw = await trio.Path(path).read_bytes()
    except OSError as exc:
        raise ProviderError(f"cannot read image {source!r}: {exc}") from exc
    return Image(url=None, media_type=part.media_type or _guess(path), data=base64.b64encode(raw).decode())


def _guess(source: str) -> str:
    guessed, _ = mimetypes.guess_type(urllib.parse.urlparse(source).path)
    return guessed or "image/png"


# -- server-sent events ----------------------------------------------------------------------------


@attrs.frozen
class SSEEvent:
    event: str
    data: str


class SSEDecoder:
    """Server-sent events, line by line: `feed` each line (without its line break); an event
    is returned at the blank line that ends it. Comments (`:`) and `id`/`retry` are skipped."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> SSEEvent | None:
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        return None

    def flush(self) -> SSEEvent | None:
        """The pending event, if any (a stream's last event may lack its blank line)."""
        if not self._data and not self._event:
            return None
        event = SSEEvent(self._event or "message", "\n".join(self._data))
        self._event, self._data = "", []
        return event


async def read_body(response: httpx.Response, max_bytes: int, what: str, *, truncate: bool = False) -> bytes:
    """The body of `response`, read chunk by chunk: past `max_bytes`, `ReplyTooLarge` (or,
    with `truncate`, the first `max_bytes` bytes), without ever holding much more."""
    declared = response.headers.get("content-length", "")
    if not truncate and declared.isdigit() and int(declared) > max_bytes:
        raise ReplyTooLarge(f"{what} is {int(declared)} bytes, more than max_reply_bytes={max_bytes}")
    body = bytearray()
    failure: Exception | None = None
    with trio.CancelScope() as scope:  # leave the read by cancelling it (see read_sse)
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > max_bytes:
                if not truncate:
                    failure = ReplyTooLarge(f"{what} is more than max_reply_bytes={max_bytes} bytes")
                del body[max_bytes:]
                scope.cancel()
    if failure is not None:
        raise failure
    return bytes(body)


async def read_sse(response: httpx.Response, handle: Callable[[SSEEvent], bool], limits: ReplyLimits) -> None:
    """Feed each server-sent event of `response` to `handle` until it returns True (the
    terminal event), raises, or the body ends.

    Lines are split here, from the raw bytes, so that `limits` bound them: a line longer than
    `max_line_bytes`, or a stream longer than `max_reply_bytes`, raises `ReplyTooLarge` having
    held at most about that much. Reading stops by cancelling the read rather than by leaving
    the loop: the cancellation runs through httpx's (nested) async generators, so none is
    abandoned half-way (trio would warn and finalize it later). After the terminal event the
    rest of the body (normally just its end) is read for up to `DRAIN_SECONDS`, so the
    connection can go back to the pool. An error `handle` raised is re-raised afterwards."""
    decoder = SSEDecoder()
    failure: Exception | None = None
    finished = False
    buffer = bytearray()
    total = 0
    with trio.CancelScope() as scope:
        async for chunk in response.aiter_bytes():
            if finished:
                continue
            total += len(chunk)
            buffer += chunk
            try:
                if total > limits.max_reply_bytes:
                    raise ReplyTooLarge(f"the stream is more than max_reply_bytes={limits.max_reply_bytes} bytes")
                for line in _split_lines(buffer):
                    event = decoder.feed(line)
                    if event is not None and handle(event):
                        finished = True
                        scope.deadline = trio.current_time() + DRAIN_SECONDS
                        break
                if len(buffer) > limits.max_line_bytes:
                    raise ReplyTooLarge(f"a stream line is more than max_line_bytes={limits.max_line_bytes} bytes")
            except Exception as exc:
                failure, finished = exc, True
                scope.cancel()
    if failure is not None:
        raise failure
    if not finished:  # the body ended: its last line and event may lack their line breaks
        tail = buffer.decode("utf-8", errors="replace").rstrip("\r")
        event = decoder.feed(tail) if tail else None
        event = event or decoder.flush()
        if event is not None:
            handle(event)


def _split_lines(buffer: bytearray) -> list[str]:
    """The complete lines at the head of `buffer` (removed from it), decoded. A line ends with
    LF, CRLF or CR; a CR at the very end waits for the next chunk (it may start a CRLF)."""
    lines: list[str] = []
    start = 0
    cr, lf = buffer.find(b"\r"), buffer.find(b"\n")
    while True:
        if 0 <= cr < start:
            cr = buffer.find(b"\r", start)
        if 0 <= lf < start:
            lf = buffer.find(b"\n", start)
        if cr >= 0 and (lf < 0 or cr < lf):
            if cr + 1 == len(buffer):
                break
            end, start_next = cr, cr + 2 if buffer[cr + 1] == 10 else cr + 1
        elif lf >= 0:
            end, start_next = lf, lf + 1
        else:
            break
        lines.append(buffer[start:end].decode("utf-8", errors="replace"))
        start = start_next
    del buffer[:start]
    return lines


def json_object(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ProviderError(f"{what} is not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise ProviderError(f"{what} is not a JSON object: {text[:200]!r}")
    return value


# -- the provider base -----------------------------------------------------------------------------


class HTTPProvider:
    """What the OpenAI-compatible and Anthropic providers share: settings, the httpx client and
    the request loop. Use a provider as `async with` (or call `aclose()`) to close the client it
    made; a `client` you pass in is yours to close (its own timeout is overridden per request)."""

    def __init__(
        self,
        *,
        model: str,
        stream: bool,
        client: httpx.AsyncClient | None,
        name: str | None,
        kind: str,
        settings: HTTPSettings | None,
        http: HTTPKeywords,
        owner: str,
    ) -> None:
        """`settings` (default `HTTPSettings()`), with `http` (the provider's keywords for its
        fields) replacing fields; `owner` names the provider class in errors."""
        self.model = text(model, "model")
        self.settings = HTTPSettings.given(settings, http, owner)
        self.stream = flag(stream, "stream")
        if client is not None and not isinstance(client, httpx.AsyncClient):
            raise ConfigError(f"client must be an httpx.AsyncClient, got {type(client).__name__}")
        if name is not None:
            text(name, "name")
        self.name: str = name or f"{kind}:{model}"
        self._client = client
        self._owns_client = client is None

    # `settings`' fields, read-only (the provider's settings are one value, `self.settings`)
    @property
    def timeout(self) -> float | None:
        return self.settings.timeout

    @property
    def max_retries(self) -> int:
        return self.settings.max_retries

    @property
    def deadline(self) -> float | None:
        return self.settings.deadline

    @property
    def headers(self) -> Mapping[str, str]:
        return self.settings.headers

    @property
    def limits(self) -> ReplyLimits:
        return self.settings.limits

    # -- the client's lifetime -----------------------------------------------------------------
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(headers={"user-agent": USER_AGENT})
        return self._client

    async def aclose(self) -> None:
        """Close the httpx client this provider made (not one passed in). It is made again on
        the next request."""
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- requests ------------------------------------------------------------------------------
    async def _post(
        self, url: str, headers: Mapping[str, str], body: Mapping[str, Any], parse: Parse, limit_key: str
    ) -> Message:
        """POST `body` with retries, all within `deadline`; on an `OutputBudgetOverflow` that
        leaves at least `MIN_REDUCED_OUTPUT` tokens, once more with `body[limit_key]` lowered to fit."""
        deadline = self.settings.deadline
        with trio.move_on_after(math.inf if deadline is None else deadline) as scope:
            return await self._post_within(url, headers, body, parse, limit_key)
        assert scope.cancelled_caught
        raise ProviderTimeout(f"{self.name}: no reply within the deadline of {deadline} s")

    async def _post_within(
        self, url: str, headers: Mapping[str, str], body: Mapping[str, Any], parse: Parse, limit_key: str
    ) -> Message:
        try:
            return await self._send(url, headers, dumps(body), parse)
        except OutputBudgetOverflow as exc:
            room = exc.reduce_output_to
            current = body.get(limit_key)
            if room is None or room < MIN_REDUCED_OUTPUT or (isinstance(current, int) and room >= current):
                raise
            reduced = room
        reply = await self._send(url, headers, dumps({**body, limit_key: reduced}), parse)
        return reply.evolve(metadata={**reply.metadata, OUTPUT_REDUCED_KEY: reduced, CONTEXT_EXCEEDED_KEY: True})

    async def _send(self, url: str, headers: Mapping[str, str], content: bytes, parse: Parse) -> Message:
        """One request with retries: `1 + max_retries` attempts at most."""
        retry = 0
        while True:
            try:
                return await self._once(url, headers, content, parse)
            except Exception as exc:
                retry += 1
                retries = self.settings.max_retries
                wait = retry_wait(exc, retry) if retry <= retries else None
                if wait is None:
                    raise
                _log.warning(
                    "%s: %s; retry %d of %d in %.2f s", self.name, type(exc).__name__, retry, retries, wait
                )
            await trio.sleep(wait)

    async def _once(self, url: str, headers: Mapping[str, str], content: bytes, parse: Parse) -> Message:
        client = self._http()
        seconds = self.limits.max_stream_seconds
        try:
            with trio.move_on_after(math.inf if seconds is None else seconds) as scope:
                async with client.stream(
                    "POST", url, content=content, headers=headers, timeout=httpx.Timeout(self.settings.timeout)
                ) as response:
                    if not 200 <= response.status_code < 300:
                        raw = await read_body(response, ERROR_BODY_BYTES, "", truncate=True)
                        raise classify(response.status_code, response.headers, raw)
                    reply = await parse(response)
                    self.limits.check_tool_calls(len(reply.tool_calls), self.name)
                    return reply
            assert scope.cancelled_caught
            raise ProviderTimeout(f"{self.name}: the response took more than max_stream_seconds={seconds} s")
        except httpx.TransportError as exc:
            why = redact_urls(str(exc)) or "connection failed"
            raise ConnectionFailed(f"{self.name}: {type(exc).__name__}: {why}") from exc
        except httpx.RequestError as exc:
            raise ProviderError(f"{self.name}: {type(exc).__name__}: {redact_urls(str(exc))}") from exc
