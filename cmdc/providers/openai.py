"""`OpenAIProvider`: the Chat Completions API, against OpenAI or any OpenAI-compatible server.

Works with OpenAI, Azure OpenAI, vLLM, llama.cpp's server, Ollama's `/v1`, OpenRouter, Groq and
the like through `base_url` (+ `headers`). Needs the `http` extra (`pip install 'cmdc-agents[http]'`).

The request body, field by field:

- `model`; `messages`: system -> `{"role": "system", "content": text}`; user ->
  `{"role": "user", "content": text}` or a list of `{"type": "text", "text"}` and
  `{"type": "image_url", "image_url": {"url": ...}}` parts (an image path or `file://` URL is
  read and sent as a base64 data URL); assistant -> `{"role": "assistant", "content": text or
  null, "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": JSON
  text}}]}`; tool result -> `{"role": "tool", "tool_call_id", "content": text}` (an error result
  is sent as its text, unchanged; images in a tool result are sent as `[image: ...]` markers,
  since tool messages carry text only);
- `tools`: `[{"type": "function", "function": {"name", "description", "parameters"}}]` (only
  when there are tools);
- `max_completion_tokens`: the request's `max_output_tokens`, else the provider's (omitted when
  neither is set). It is the field OpenAI's current models require and vLLM, Groq, OpenRouter
  and Azure accept; for a server that only knows `max_tokens`, put `"max_tokens"` in
  `extra_body` (then the limit is sent as `max_tokens` alone: `extra_body={"max_tokens": None}`
  just switches the field);
- `stream: true` and `stream_options: {"include_usage": true}` when streaming;
- `extra_body` last (it overrides any field above; a None value removes the field).

The reply: `Message.assistant(text, tool_calls=..., usage=TokenUsage(input_tokens=
prompt_tokens, output_tokens=completion_tokens, total_tokens=total_tokens,
cache_read_tokens=prompt_tokens_details.cached_tokens))` (usage None when the server reports
none), metadata `cmdc.stop_reason` = `finish_reason`. Tool-call arguments that are not a JSON
object are delivered as `{}` with the raw text in metadata `cmdc.invalid_tool_arguments`
({call id: text}): the tool's validation then tells the model what is wrong, and the agent keeps
working. A stream that ends without `[DONE]` or a finish reason raises `IncompleteStream`
(retried); an error object inside a 200 body or stream is classified like an HTTP error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

import attrs
import httpx
import orjson

from .._check import is_int, optional_integer
from .._frozen import thaw
from ..errors import ConfigError, IncompleteStream, ProviderError
from ..message import ImagePart, Message, TextPart, TokenUsage, ToolCall
from ._http import (
    HTTPProvider,
    SSEEvent,
    count,
    endpoint,
    items,
    json_object,
    load_image,
    new_call_id,
    read_body,
    read_sse,
    redact_url,
    reply_metadata,
    require_key,
    setting,
    tool_call,
)
from ._settings import HTTPKeywords, HTTPSettings, ReplyLimits
from .base import ModelRequest
from .overflow import classify, error_details

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIProvider(HTTPProvider):
    """A model behind the Chat Completions API.

    `base_url` defaults to `OPENAI_BASE_URL`, then `https://api.openai.com/v1`; `api_key` to
    `OPENAI_API_KEY` (sent as `Authorization: Bearer ...`; with no key no header is sent, as
    local servers expect, but for `https://api.openai.com/v1` itself no key is a `ConfigError`
    at construction). `settings` (`HTTPSettings`, shared with `AnthropicProvider`): the
    per-request `timeout`, `max_retries`, the call's `deadline`, `headers` added to every request
    (Azure: `{"api-key": ...}`) and `limits` (`ReplyLimits`) on what the endpoint may send back;
    each of its fields is also a keyword (`timeout=10.0`), which replaces that field of
    `settings`. `stream` uses SSE. `max_output_tokens` is the default output limit (a request's
    own limit wins). `client`: an `httpx.AsyncClient` to use (yours to close); without one the
    provider makes its own: close it with `aclose()` or `async with provider:`.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        stream: bool = False,
        max_output_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        client: httpx.AsyncClient | None = None,
        name: str | None = None,
        settings: HTTPSettings | None = None,
        **http: Unpack[HTTPKeywords],
    ) -> None:
        super().__init__(
            model=model,
            stream=stream,
            client=client,
            name=name,
            kind="openai",
            settings=settings,
            http=http,
            owner="OpenAIProvider",
        )
        self.base_url: str = setting(base_url, "OPENAI_BASE_URL", DEFAULT_BASE_URL) or DEFAULT_BASE_URL
        self.api_key = setting(api_key, "OPENAI_API_KEY")
        self.max_output_tokens: int | None = optional_integer(max_output_tokens, "max_output_tokens")
        if extra_body is not None and not isinstance(extra_body, Mapping):
            raise ConfigError(f"extra_body must be a mapping, got {type(extra_body).__name__}")
        self.extra_body: dict[str, Any] = dict(extra_body or {})
        self.url = endpoint(self.base_url, "/chat/completions")
        require_key(
            "OpenAIProvider",
            api_key=self.api_key,
            env="OPENAI_API_KEY",
            base_url=self.base_url,
            vendor_url=DEFAULT_BASE_URL,
            headers=self.headers,
            auth_headers=("authorization", "api-key"),
            client=client,
        )

    def __repr__(self) -> str:
        return f"OpenAIProvider(model={self.model!r}, base_url={redact_url(self.base_url)!r}, stream={self.stream})"

    async def complete(self, request: ModelRequest) -> Message:
        body = await self.request_body(request)
        limit_key = "max_tokens" if "max_tokens" in body else "max_completion_tokens"
        parse = self._read_stream if self.stream else self._read_json
        return await self._post(self.url, self.request_headers(), body, parse, limit_key)

    # -- the request -----------------------------------------------------------------------------
    def request_headers(self) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if self.stream else "application/json",
        }
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        headers.update(self.headers)
        return headers

    async def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body `complete` sends for `request`."""
        body: dict[str, Any] = {"model": self.model, "messages": [await _message(m) for m in request.messages]}
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": thaw(t.parameters)},
                }
                for t in request.tools
            ]
        limit = request.max_output_tokens if request.max_output_tokens is not None else self.max_output_tokens
        if limit is not None:
            body["max_tokens" if "max_tokens" in self.extra_body else "max_completion_tokens"] = limit
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        for key, value in self.extra_body.items():
            if key == "max_tokens" and value is None and limit is not None:
                continue
            if value is None:
                body.pop(key, None)
            else:
                body[key] = thaw(value)
        return body

    # -- the reply -------------------------------------------------------------------------------
    async def _read_json(self, response: httpx.Response) -> Message:
        what = f"{self.name}: the response"
        data = json_object(await read_body(response, self.limits.max_reply_bytes, what), what)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            if error_details(data) is not None:
                raise classify(response.status_code, response.headers, data)
            raise ProviderError(f"{self.name}: the response has no choices: {str(data)[:200]}")
        choice = choices[0] if isinstance(choices[0], Mapping) else {}
        message = choice.get("message")
        message = message if isinstance(message, Mapping) else {}
        invalid: dict[str, str] = {}
        refused: dict[str, str] = {}
        calls: list[ToolCall] = []
        raw_calls = items(message.get("tool_calls"), "tool_calls")
        self.limits.check_tool_calls(len(raw_calls), self.name)
        for raw in raw_calls:
            if not isinstance(raw, Mapping):
                continue
            fn = raw.get("function")
            fn = fn if isinstance(fn, Mapping) else {}
            arguments = fn.get("arguments")
            calls.append(tool_call(_str(raw.get("id")), fn.get("name"), arguments, invalid, self.limits, refused))
        return Message.assistant(
            _text(message.get("content")),
            tool_calls=_unique(calls),
            usage=_usage(data.get("usage"), data.get("timings")),
            metadata=reply_metadata(choice.get("finish_reason"), invalid, refused),
        )

    async def _read_stream(self, response: httpx.Response) -> Message:
        stream = _Stream(response, self.limits, self.name)
        await read_sse(response, stream.feed, self.limits)
        return stream.finish(self.name)


# -- messages --------------------------------------------------------------------------------------


async def _message(m: Message) -> dict[str, Any]:
    if m.role == "system":
        return {"role": "system", "content": m.text}
    if m.role == "user":
        return {"role": "user", "content": await _user_content(m)}
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.text}
    out: dict[str, Any] = {"role": "assistant", "content": m.text or (None if m.tool_calls else "")}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": orjson.dumps(thaw(c.arguments)).decode()},
            }
            for c in m.tool_calls
        ]
    return out


async def _user_content(m: Message) -> str | list[dict[str, Any]]:
    if isinstance(m.content, str):
        return m.content
    parts: list[dict[str, Any]] = []
    for p in m.content:
        if isinstance(p, TextPart):
            parts.append({"type": "text", "text": p.text})
        elif isinstance(p, ImagePart):
            image = await load_image(p)
            parts.append({"type": "image_url", "image_url": {"url": image.data_url()}})
    return parts


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _text(content: object) -> str:
    """A reply's text: a string, or the text of a list of content parts (some servers)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def _usage(value: object, timings: object = None) -> TokenUsage | None:
    """Usage from a reply's `usage` object; the cached prompt tokens from
    `prompt_tokens_details.cached_tokens` (OpenAI, vLLM, llama-server), else from llama-server's
    `timings.cache_n` (its older builds report no details)."""
    if not isinstance(value, Mapping):
        return None
    prompt = count(value.get("prompt_tokens"))
    completion = count(value.get("completion_tokens"))
    details = value.get("prompt_tokens_details")
    if isinstance(details, Mapping) and "cached_tokens" in details:
        cached = count(details.get("cached_tokens"))
    else:
        cached = count(timings.get("cache_n")) if isinstance(timings, Mapping) else 0
    cached = min(cached, prompt)
    return TokenUsage(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=count(value.get("total_tokens")) or prompt + completion,
        cache_read_tokens=cached,
    )


def _unique(calls: list[ToolCall]) -> list[ToolCall]:
    """Calls with distinct ids (a server that repeats an id gets fresh ones for the repeats)."""
    seen: set[str] = set()
    out: list[ToolCall] = []
    for c in calls:
        if c.id in seen:
            c = attrs.evolve(c, id=new_call_id())
        seen.add(c.id)
        out.append(c)
    return out


@attrs.define
class _CallParts:
    id: str | None = None
    name: str = ""
    arguments: list[str] = attrs.field(factory=list)


class _Stream:
    """A Chat Completions stream being accumulated: text deltas, tool-call fragments by index,
    the finish reason, and usage from the final chunk."""

    def __init__(self, response: httpx.Response, limits: ReplyLimits, name: str) -> None:
        self.response = response
        self.limits, self.name = limits, name
        self.text: list[str] = []
        self.calls: dict[int, _CallParts] = {}
        self.usage: TokenUsage | None = None
        self.finish_reason: str | None = None
        self.done = False

    def feed(self, event: SSEEvent) -> bool:
        """Take one event; True at `[DONE]`."""
        data = event.data.strip()
        if data == "[DONE]":
            self.done = True
            return True
        if event.event == "error":
            raise classify(200, self.response.headers, data)
        if not data:
            return False
        chunk = json_object(data, "a stream chunk")
        if chunk.get("error") is not None:  # OpenRouter and others: an error inside the 200 stream
            raise classify(200, self.response.headers, chunk)
        usage = _usage(chunk.get("usage"), chunk.get("timings"))
        if usage is not None:
            self.usage = usage
        for choice in items(chunk.get("choices"), "stream chunk's choices"):
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                self._delta(delta)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self.finish_reason = reason
        return False

    def _delta(self, delta: Mapping[str, Any]) -> None:
        content = delta.get("content")
        if isinstance(content, str):
            self.text.append(content)
        for fragment in items(delta.get("tool_calls"), "stream delta's tool_calls"):
            if not isinstance(fragment, Mapping):
                continue
            index = fragment.get("index")
            if not is_int(index):
                index = max(self.calls, default=-1) + 1  # no index: each fragment is a whole call
            if index not in self.calls:
                self.limits.check_tool_calls(len(self.calls) + 1, self.name)
            parts = self.calls.setdefault(index, _CallParts())
            call_id = _str(fragment.get("id"))
            if call_id and parts.id is None:
                parts.id = call_id
            fn = fragment.get("function")
            if not isinstance(fn, Mapping):
                continue
            name = fn.get("name")
            if isinstance(name, str) and name and not parts.name:
                parts.name = name
            arguments = fn.get("arguments")
            if isinstance(arguments, str):
                parts.arguments.append(arguments)
            elif isinstance(arguments, Mapping):
                parts.arguments.append(orjson.dumps(arguments).decode())

    def finish(self, name: str) -> Message:
        if not self.done and self.finish_reason is None:
            raise IncompleteStream(f"{name}: the stream ended before [DONE] or a finish reason")
        invalid: dict[str, str] = {}
        refused: dict[str, str] = {}
        calls = [
            tool_call(parts.id, parts.name, "".join(parts.arguments), invalid, self.limits, refused)
            for _, parts in sorted(self.calls.items())
        ]
        return Message.assistant(
            "".join(self.text),
            tool_calls=_unique(calls),
            usage=self.usage,
            metadata=reply_metadata(self.finish_reason, invalid, refused),
        )
