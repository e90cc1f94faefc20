"""The HTTP providers' streams (SSE): accumulation, a stream cut short, error events."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from fakes import (
    READ,
    SEARCH,
    SSE,
    Endpoint,
    anthropic_events,
    openai_chunks,
    sse,
)

from cmdc import ContextOverflow, Message, ProviderError, TokenUsage, ToolCall
from cmdc.errors import (
    AuthError,
    IncompleteStream,
)
from cmdc.providers import AnthropicProvider, ModelRequest, OpenAIProvider
from cmdc.providers.base import STOP_REASON_KEY


def openai_tool_stream() -> list[Any]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def frag(index: int, arguments: str, **first: Any) -> dict[str, Any]:
        fn: dict[str, Any] = {"arguments": arguments}
        if "name" in first:
            fn["name"] = first["name"]
        out: dict[str, Any] = {"index": index, "function": fn}
        if "id" in first:
            out.update(id=first["id"], type="function")
        return chunk({"tool_calls": [out]})

    return [
        chunk({"role": "assistant", "content": "Hel"}),
        chunk({"content": "lo"}),
        frag(0, "", id="call_a", name="search"),
        frag(0, '{"q":'),
        frag(1, '{"path"', id="call_b", name="read"),
        frag(0, ' "trio"}'),
        frag(1, ': "a.txt"}'),
        chunk({}, "tool_calls"),
        {
            "id": "c1",
            "choices": [],
            "usage": {
                "prompt_tokens": 50,
                "completion_tokens": 20,
                "total_tokens": 70,
                "prompt_tokens_details": {"cached_tokens": 32},
            },
        },
        "[DONE]",
    ]


async def test_openai_stream_accumulates_text_tool_calls_and_usage() -> None:
    events = openai_tool_stream()
    body = b": keep-alive comment\n\n" + sse(*events)
    endpoint = Endpoint((200, body, SSE))
    provider = OpenAIProvider("m", stream=True, client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")], tools=[SEARCH, READ]))
    assert reply.text == "Hello"
    assert reply.tool_calls == (
        ToolCall(id="call_a", name="search", arguments={"q": "trio"}),
        ToolCall(id="call_b", name="read", arguments={"path": "a.txt"}),
    )
    assert reply.usage == TokenUsage(input_tokens=50, output_tokens=20, total_tokens=70, cache_read_tokens=32)
    assert reply.metadata[STOP_REASON_KEY] == "tool_calls"


async def test_openai_stream_cut_before_its_end_is_an_error_not_a_reply(autojump_clock: trio.abc.Clock) -> None:
    cut = sse(*openai_tool_stream()[:6])  # no finish reason, no usage, no [DONE]
    endpoint = Endpoint((200, cut, SSE))
    provider = OpenAIProvider("m", stream=True, max_retries=2, client=endpoint.client())
    with pytest.raises(IncompleteStream):
        await provider.complete(ModelRequest([Message.user("go")]))
    assert isinstance(IncompleteStream("x"), ProviderError)
    assert len(endpoint.requests) == 3  # retried like a cut connection, then raised

    # a finish reason without [DONE] is a complete reply
    ended = sse(*openai_chunks("hello")[:-1])
    endpoint = Endpoint((200, ended, SSE))
    provider = OpenAIProvider("m", stream=True, client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert reply.text == "hello" and reply.usage is None


async def test_openai_stream_error_event_is_classified() -> None:
    overflow = {
        "error": {
            "code": 400,
            "message": "This endpoint's maximum context length is 200000 tokens. However, you requested about "
            "236255 tokens (228064 of text input, 8191 in the output).",
        }
    }
    endpoint = Endpoint((200, sse(openai_chunks("hi")[0], overflow), SSE))
    provider = OpenAIProvider("m", stream=True, client=endpoint.client())
    with pytest.raises(ContextOverflow) as info:
        await provider.complete(ModelRequest([Message.user("go")]))
    assert (info.value.prompt_tokens, info.value.limit) == (228064, 200000)
    assert len(endpoint.requests) == 1  # an overflow is never retried

    rate = {"error": {"code": 401, "message": "User not found."}}
    endpoint = Endpoint((200, sse(rate), SSE))
    with pytest.raises(AuthError):
        await OpenAIProvider("m", stream=True, client=endpoint.client()).complete(ModelRequest([Message.user("go")]))


async def test_anthropic_stream_accumulates_and_replaces_usage() -> None:
    endpoint = Endpoint((200, sse(*anthropic_events(), event_names=True), SSE))
    provider = AnthropicProvider("claude-test", api_key="k", stream=True, client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")], tools=[SEARCH]))
    assert endpoint.bodies()[0]["stream"] is True
    assert reply.text == "Let me check."
    assert reply.tool_calls == (ToolCall(id="toolu_1", name="search", arguments={"q": "trio"}),)
    assert reply.usage == TokenUsage(
        input_tokens=420, output_tokens=55, total_tokens=475, cache_read_tokens=300, cache_creation_tokens=20
    )
    assert reply.metadata[STOP_REASON_KEY] == "tool_use"


async def test_anthropic_stream_without_message_stop_is_an_error() -> None:
    endpoint = Endpoint((200, sse(*anthropic_events(stop=False), event_names=True), SSE))
    provider = AnthropicProvider("claude-test", api_key="k", stream=True, max_retries=0, client=endpoint.client())
    with pytest.raises(IncompleteStream, match="message_stop"):
        await provider.complete(ModelRequest([Message.user("go")]))
    assert len(endpoint.requests) == 1


async def test_anthropic_stream_error_events_are_classified(autojump_clock: trio.abc.Clock) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    endpoint = Endpoint(
        (200, sse(*anthropic_events()[:3], overloaded, event_names=True), SSE),
        (200, sse(*anthropic_events(), event_names=True), SSE),
    )
    provider = AnthropicProvider("claude-test", api_key="k", stream=True, client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert reply.text == "Let me check." and len(endpoint.requests) == 2  # overloaded: retried

    too_long = {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: "
                "210000 tokens > 200000 maximum"}}  # fmt: skip
    endpoint = Endpoint((200, sse(too_long, event_names=True), SSE))
    provider = AnthropicProvider("claude-test", api_key="k", stream=True, client=endpoint.client())
    with pytest.raises(ContextOverflow) as info:
        await provider.complete(ModelRequest([Message.user("go")]))
    assert (info.value.prompt_tokens, info.value.limit) == (210000, 200000)
    assert len(endpoint.requests) == 1
