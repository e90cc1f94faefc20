"""The HTTP providers' replies: tool calls, usage, invalid arguments, errors inside a 200 body."""

from __future__ import annotations

import pytest
from fakes import (
    Endpoint,
    anthropic_reply,
    openai_reply,
)

from cmdc import ContextOverflow, Message, TokenUsage, ToolCall
from cmdc.providers import AnthropicProvider, ModelRequest, OpenAIProvider
from cmdc.providers.base import CONTEXT_EXCEEDED_KEY, INVALID_ARGUMENTS_KEY, STOP_REASON_KEY


async def test_openai_reply_with_tool_calls_usage_and_invalid_arguments() -> None:
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "search", "arguments": '{"q": "trio"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.t'}},
        {"id": "call_c", "type": "function", "function": {"name": "search", "arguments": ""}},
    ]
    endpoint = Endpoint((200, openai_reply(None, tool_calls=calls)))  # type: ignore[arg-type]
    provider = OpenAIProvider("gpt-test", api_key="k", client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert reply.role == "assistant" and reply.text == ""
    assert [(c.id, c.name, dict(c.arguments)) for c in reply.tool_calls] == [
        ("call_a", "search", {"q": "trio"}),
        ("call_b", "read", {}),  # unparseable: delivered empty, so the tool's validation answers the model
        ("call_c", "search", {}),
    ]
    assert reply.metadata[INVALID_ARGUMENTS_KEY] == {"call_b": '{"path": "a.t'}
    assert reply.metadata[STOP_REASON_KEY] == "tool_calls"
    assert reply.usage == TokenUsage(
        input_tokens=120, output_tokens=30, total_tokens=150, cache_read_tokens=64, cache_creation_tokens=0
    )


async def test_anthropic_reply_usage_counts_cached_tokens() -> None:
    endpoint = Endpoint(
        (
            200,
            anthropic_reply(
                {"type": "text", "text": "Checking "},
                {"type": "text", "text": "now."},
                {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "trio"}},
                stop_reason="tool_use",
            ),
        )
    )
    provider = AnthropicProvider("claude-test", api_key="k", client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert reply.text == "Checking now."
    assert reply.tool_calls == (ToolCall(id="toolu_1", name="search", arguments={"q": "trio"}),)
    assert reply.usage == TokenUsage(
        input_tokens=420, output_tokens=50, total_tokens=470, cache_read_tokens=300, cache_creation_tokens=20
    )
    assert reply.metadata[STOP_REASON_KEY] == "tool_use"
    assert CONTEXT_EXCEEDED_KEY not in reply.metadata


async def test_anthropic_context_window_exceeded_marks_the_reply() -> None:
    endpoint = Endpoint(
        (200, anthropic_reply({"type": "text", "text": "partial"}, stop_reason="model_context_window_exceeded"))
    )
    provider = AnthropicProvider("claude-test", api_key="k", client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert reply.text == "partial"
    assert reply.metadata[CONTEXT_EXCEEDED_KEY] is True
    assert reply.metadata[STOP_REASON_KEY] == "model_context_window_exceeded"


async def test_error_inside_a_200_body_is_classified() -> None:
    body = {"error": {"code": 400, "message": "prompt is too long: 300000 tokens > 200000 maximum"}}
    endpoint = Endpoint((200, body))
    provider = OpenAIProvider("m", client=endpoint.client())
    with pytest.raises(ContextOverflow) as info:
        await provider.complete(ModelRequest([Message.user("go")]))
    assert (info.value.prompt_tokens, info.value.limit) == (300000, 200000)
    assert len(endpoint.requests) == 1
