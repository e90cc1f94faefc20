"""`AnthropicProvider`: Anthropic's Messages API. Needs the `http` extra (`pip install 'cmdc-agents[http]'`).

The request body, field by field:

- `model`, `max_tokens` (the request's `max_output_tokens`, else the provider's, default 4096);
- `system`: the text of every system message, joined by a blank line (omitted when there is none);
- `messages`: user text and images (`{"type": "image", "source": {"type": "url", "url"}}`, or
  `{"type": "base64", "media_type", "data"}` for a data URL or a file path) as content blocks;
  assistant text and `{"type": "tool_use", "id", "name", "input"}` blocks; a tool result as a
  `{"type": "tool_result", "tool_use_id", "content", "is_error": true (errors only)}` block in a
  user message. Consecutive messages of one role are merged into one (so parallel tool results
  go back in one user message, tool results first); empty text blocks are left out;
- `tools`: `[{"name", "description", "input_schema"}]` (only when there are tools);
- `stream: true` when streaming.

The reply: text blocks joined, `tool_use` blocks as tool calls, usage
`TokenUsage(input_tokens=input + cache_read + cache_creation, output_tokens,
total_tokens=their sum, cache_read_tokens, cache_creation_tokens)`: the context's size counts
cached tokens too. Metadata `cmdc.stop_reason` = `stop_reason`; on `stop_reason ==
"model_context_window_exceeded"` the reply is returned with metadata `{"cmdc.context_exceeded":
True}`, the mark that the conversation must be compacted before the next step. Streaming
accumulates `content_block_delta` events (`text_delta`, `input_json_delta`); usage comes from
`message_start` and is replaced (not added to) by each `message_delta`'s cumulative figures. A
stream without `message_stop` raises `IncompleteStream`; an `error` event is classified.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

import attrs
import httpx

from .._check import flag, integer, text
from .._frozen import thaw
from ..errors import IncompleteStream, ProviderError
from ..message import ImagePart, Message, TextPart, TokenUsage, ToolCall
from ._http import (
    HTTPProvider,
    SSEEvent,
    count,
    endpoint,
    items,
    json_object,
    load_image,
    read_body,
    read_sse,
    redact_url,
    reply_metadata,
    require_key,
    setting,
    tool_call,
)
from ._settings import HTTPKeywords, HTTPSettings, ReplyLimits
from .base import CONTEXT_EXCEEDED_KEY, ModelRequest
from .overflow import classify

DEFAULT_BASE_URL = "https://api.anthropic.com"
CONTEXT_WINDOW_EXCEEDED = "model_context_window_exceeded"


EPHEMERAL: dict[str, str] = {"type": "ephemeral"}
"""The `cache_control` of a prompt-cache breakpoint (Anthropic's default five-minute cache)."""
MAX_BREAKPOINTS = 4
"""Anthropic accepts at most this many `cache_control` breakpoints per request."""


class AnthropicProvider(HTTPProvider):
    """A model behind Anthropic's Messages API.

    `base_url` defaults to `ANTHROPIC_BASE_URL`, then `https://api.anthropic.com`; `api_key` to
    `ANTHROPIC_API_KEY` (sent as `x-api-key`; for `https://api.anthropic.com` itself no key is
    a `ConfigError` at construction), `anthropic_version` as `anthropic-version`.
    `max_output_tokens` is the default `max_tokens` (a request's own limit wins).
    `cache_breakpoints` (default True) marks the prompt for Anthropic's prompt cache:
    `cache_control: {"type": "ephemeral"}` on the system prompt (else on the last tool), on the
    newest summary message and on the last message (the rolling tail): at most 3 of the 4
    breakpoints Anthropic allows; False sends no `cache_control`. `settings` (`HTTPSettings`)
    and its fields as keywords (`timeout`, `max_retries`, `deadline`, `headers`, `limits`),
    `stream`, `client` and `name` as for `OpenAIProvider`.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_output_tokens: int = 4096,
        stream: bool = False,
        client: httpx.AsyncClient | None = None,
        name: str | None = None,
        anthropic_version: str = "2023-06-01",
        cache_breakpoints: bool = True,
        settings: HTTPSettings | None = None,
        **http: Unpack[HTTPKeywords],
    ) -> None:
        super().__init__(
            model=model,
            stream=stream,
            client=client,
            name=name,
            kind="anthropic",
            settings=settings,
            http=http,
            owner="AnthropicProvider",
        )
        self.base_url: str = setting(base_url, "ANTHROPIC_BASE_URL", DEFAULT_BASE_URL) or DEFAULT_BASE_URL
        self.api_key = setting(api_key, "ANTHROPIC_API_KEY")
        self.max_output_tokens: int = integer(max_output_tokens, "max_output_tokens")
        self.anthropic_version = text(anthropic_version, "anthropic_version")
        self.cache_breakpoints: bool = flag(cache_breakpoints, "cache_breakpoints")
        self.url = endpoint(self.base_url, "/v1/messages")
        require_key(
            "AnthropicProvider",
            api_key=self.api_key,
            env="ANTHROPIC_API_KEY",
            base_url=self.base_url,
            vendor_url=DEFAULT_BASE_URL,
            headers=self.headers,
            auth_headers=("x-api-key", "authorization"),
            client=client,
        )

    def __repr__(self) -> str:
        return f"AnthropicProvider(model={self.model!r}, base_url={redact_url(self.base_url)!r}, stream={self.stream})"

    async def complete(self, request: ModelRequest) -> Message:
        body = await self.request_body(request)
        parse = self._read_stream if self.stream else self._read_json
        return await self._post(self.url, self.request_headers(), body, parse, "max_tokens")

    # -- the request -----------------------------------------------------------------------------
    def request_headers(self) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if self.stream else "application/json",
            "anthropic-version": self.anthropic_version,
        }
        if self.api_key:
            headers["x-api-key"] = self.api_key
        headers.update(self.headers)
        return headers

    async def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body `complete` sends for `request`."""
        system: list[str] = []
        turns: list[tuple[str, list[dict[str, Any]]]] = []
        summary: dict[str, Any] | None = None  # the newest summary's last block
        for m in request.messages:
            if m.role == "system":
                if m.text:
                    system.append(m.text)
                continue
            role = "assistant" if m.role == "assistant" else "user"
            blocks = await _blocks(m)
            if not blocks:
                continue
            if m.is_summary:
                summary = blocks[-1]
            if turns and turns[-1][0] == role:
                turns[-1][1].extend(blocks)
            else:
                turns.append((role, blocks))
        limit = request.max_output_tokens if request.max_output_tokens is not None else self.max_output_tokens
        body: dict[str, Any] = {"model": self.model, "max_tokens": limit}
        mark = self.cache_breakpoints
        if system:
            joined = "\n\n".join(system)
            body["system"] = [{"type": "text", "text": joined, "cache_control": dict(EPHEMERAL)}] if mark else joined
        body["messages"] = [{"role": role, "content": _results_first(blocks)} for role, blocks in turns]
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": thaw(t.parameters)}
                for t in request.tools
            ]
            if mark and not system:  # the prefix is tools, then system: one breakpoint covers both
                body["tools"][-1]["cache_control"] = dict(EPHEMERAL)
        if mark and turns:
            # The newest summary (stable until the next compaction) and the rolling tail (the
            # next request reads everything up to it from the cache). A marked block is marked
            # where it sits after `_results_first`: the same dict object.
            if summary is not None:
                summary["cache_control"] = dict(EPHEMERAL)
            tail = body["messages"][-1]["content"][-1]
            tail["cache_control"] = dict(EPHEMERAL)
        if self.stream:
            body["stream"] = True
        return body

    # -- the reply -------------------------------------------------------------------------------
    async def _read_json(self, response: httpx.Response) -> Message:
        what = f"{self.name}: the response"
        data = json_object(await read_body(response, self.limits.max_reply_bytes, what), what)
        if data.get("type") == "error" or "content" not in data:
            if data.get("error") is not None:
                raise classify(response.status_code, response.headers, data)
            raise ProviderError(f"{self.name}: the response has no content: {str(data)[:200]}")
        reply = _Reply(limits=self.limits)
        content = items(data.get("content"), "content")
        self.limits.check_tool_calls(
            sum(isinstance(b, Mapping) and b.get("type") == "tool_use" for b in content), self.name
        )
        for block in content:
            if isinstance(block, Mapping):
                reply.block(block)
        reply.stop_reason = data.get("stop_reason")
        usage = data.get("usage")
        if isinstance(usage, Mapping):
            reply.usage.update(usage)
        return reply.message()

    async def _read_stream(self, response: httpx.Response) -> Message:
        stream = _Stream(response, self.limits, self.name)
        await read_sse(response, stream.feed, self.limits)
        if not stream.stopped:
            raise IncompleteStream(f"{self.name}: the stream ended before message_stop")
        return stream.reply.message()


# -- messages --------------------------------------------------------------------------------------


async def _blocks(m: Message) -> list[dict[str, Any]]:
    if m.role == "tool":
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id}
        content = m.content if isinstance(m.content, str) else await _content_blocks(m.content)
        if content:
            result["content"] = content
        if m.is_error:
            result["is_error"] = True
        return [result]
    blocks = [{"type": "text", "text": m.content}] if isinstance(m.content, str) else await _content_blocks(m.content)
    blocks = [b for b in blocks if b["type"] != "text" or b["text"]]
    if m.role == "assistant":
        blocks = [b for b in blocks if b["type"] == "text"]  # an assistant turn carries no images
        blocks.extend(
            {"type": "tool_use", "id": c.id, "name": c.name, "input": thaw(c.arguments)} for c in m.tool_calls
        )
    return blocks


async def _content_blocks(parts: tuple[TextPart | ImagePart, ...]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for p in parts:
        if isinstance(p, TextPart):
            if p.text:
                blocks.append({"type": "text", "text": p.text})
            continue
        image = await load_image(p)
        if image.url is not None:
            source: dict[str, Any] = {"type": "url", "url": image.url}
        else:
            source = {"type": "base64", "media_type": image.media_type, "data": image.data}
        blocks.append({"type": "image", "source": source})
    return blocks


def _results_first(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic wants a user turn's `tool_result` blocks before its other blocks."""
    return [b for b in blocks if b["type"] == "tool_result"] + [b for b in blocks if b["type"] != "tool_result"]


# -- the reply -------------------------------------------------------------------------------------


@attrs.define
class _Block:
    kind: str
    text: list[str] = attrs.field(factory=list)
    id: str | None = None
    name: str | None = None
    input: object = None
    json: list[str] = attrs.field(factory=list)


@attrs.define
class _Reply:
    blocks: list[_Block] = attrs.field(factory=list)
    usage: dict[str, Any] = attrs.field(factory=dict)
    stop_reason: object = None
    limits: ReplyLimits | None = None

    def block(self, data: Mapping[str, Any]) -> _Block:
        kind = data.get("type")
        block = _Block(kind if isinstance(kind, str) else "")
        if kind == "text" and isinstance(data.get("text"), str):
            block.text.append(data["text"])
        elif kind in ("tool_use", "server_tool_use"):
            block.id = data.get("id") if isinstance(data.get("id"), str) else None
            block.name = data.get("name") if isinstance(data.get("name"), str) else None
            block.input = data.get("input")
        self.blocks.append(block)
        return block

    def message(self) -> Message:
        invalid: dict[str, str] = {}
        refused: dict[str, str] = {}
        calls: list[ToolCall] = []
        for b in self.blocks:
            if b.kind != "tool_use":
                continue
            arguments: object = "".join(b.json) if b.json else b.input
            calls.append(tool_call(b.id, b.name, arguments, invalid, self.limits, refused))
        metadata = reply_metadata(self.stop_reason, invalid, refused)
        if self.stop_reason == CONTEXT_WINDOW_EXCEEDED:
            metadata[CONTEXT_EXCEEDED_KEY] = True
        text = "".join("".join(b.text) for b in self.blocks if b.kind == "text")
        return Message.assistant(text, tool_calls=calls, usage=self._usage(), metadata=metadata)

    def _usage(self) -> TokenUsage | None:
        if not self.usage:
            return None
        fresh = count(self.usage.get("input_tokens"))
        read = count(self.usage.get("cache_read_input_tokens"))
        created = count(self.usage.get("cache_creation_input_tokens"))
        output = count(self.usage.get("output_tokens"))
        prompt = fresh + read + created
        return TokenUsage(
            input_tokens=prompt,
            output_tokens=output,
            total_tokens=prompt + output,
            cache_read_tokens=read,
            cache_creation_tokens=created,
        )


class _Stream:
    """A Messages stream being accumulated, event by event."""

    def __init__(self, response: httpx.Response, limits: ReplyLimits, name: str) -> None:
        self.response = response
        self.limits, self.name = limits, name
        self.calls = 0
        self.reply = _Reply(limits=limits)
        self.open: dict[int, _Block] = {}
        self.stopped = False

    def feed(self, event: SSEEvent) -> bool:
        """Take one event; True at `message_stop`."""
        if not event.data.strip():
            return False
        data = json_object(event.data, "a stream event")
        kind = data.get("type", event.event)
        if kind == "error" or event.event == "error":
            raise classify(200, self.response.headers, data)
        if kind == "message_start":
            message = data.get("message")
            usage = message.get("usage") if isinstance(message, Mapping) else None
            if isinstance(usage, Mapping):
                self.reply.usage.update(usage)
        elif kind == "content_block_start":
            block = data.get("content_block")
            index = data.get("index")
            if isinstance(block, Mapping) and isinstance(index, int):
                if block.get("type") == "tool_use":
                    self.calls += 1
                    self.limits.check_tool_calls(self.calls, self.name)
                self.open[index] = self.reply.block(block)
        elif kind == "content_block_delta":
            self._delta(data)
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, Mapping) and delta.get("stop_reason") is not None:
                self.reply.stop_reason = delta["stop_reason"]
            usage = data.get("usage")
            if isinstance(usage, Mapping):
                # Cumulative figures: each one replaces the one before (never added).
                self.reply.usage.update({k: v for k, v in usage.items() if v is not None})
        elif kind == "message_stop":
            self.stopped = True
            return True
        return False

    def _delta(self, data: Mapping[str, Any]) -> None:
        index = data.get("index")
        delta = data.get("delta")
        block = self.open.get(index) if isinstance(index, int) else None
        if block is None or not isinstance(delta, Mapping):
            return
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            block.text.append(delta["text"])
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            block.json.append(delta["partial_json"])
