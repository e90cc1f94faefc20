"""The HTTP providers (OpenAI-compatible, Anthropic) against `httpx.MockTransport` and a loopback
server: request bodies field by field, replies, streaming, retries, cancellation, and an agent
that compacts when its endpoint says the prompt is too long. No network."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio
from fakes import sse

import cmdc
from cmdc import ConfigError, ContextOverflow, ImagePart, Message, ProviderError, TextPart, TokenUsage, ToolCall
from cmdc.errors import (
    AuthError,
    BadRequest,
    ConnectionFailed,
    IncompleteStream,
    OutputBudgetOverflow,
    Overloaded,
    QuotaExceeded,
    RateLimited,
)
from cmdc.providers import AnthropicProvider, ModelRequest, OpenAIProvider, ToolSchema
from cmdc.providers.base import CONTEXT_EXCEEDED_KEY, INVALID_ARGUMENTS_KEY, OUTPUT_REDUCED_KEY, STOP_REASON_KEY

# -- a scripted endpoint ---------------------------------------------------------------------------

Answer = tuple[int, Any] | tuple[int, Any, dict[str, str]] | BaseException | Callable[[httpx.Request], httpx.Response]


def _response(answer: Answer, request: httpx.Request) -> httpx.Response:
    if isinstance(answer, BaseException):
        raise answer
    if callable(answer):
        return answer(request)
    status, body, *rest = answer
    headers = rest[0] if rest else {}
    if isinstance(body, (dict, list)):
        return httpx.Response(status, json=body, headers=headers)
    content = body.encode() if isinstance(body, str) else body
    return httpx.Response(status, content=content, headers=headers)


class Endpoint:
    """A MockTransport handler answering requests in order (the last answer repeats) and
    recording every request with the trio time it arrived."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.times.append(trio.current_time())
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return _response(answer, request)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))

    def bodies(self) -> list[dict[str, Any]]:
        return [orjson.loads(r.content) for r in self.requests]


SSE = {"content-type": "text/event-stream"}


def openai_reply(text: str = "done", **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    message.update(extra)
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-test",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in extra else "stop"}
        ],
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 64},
        },
    }


def anthropic_reply(*content: dict[str, Any], stop_reason: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(content) or [{"type": "text", "text": "done"}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 100,
            "cache_creation_input_tokens": 20,
            "cache_read_input_tokens": 300,
            "output_tokens": 50,
        },
    }


SEARCH = ToolSchema(
    "search", "Search the web.", {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
)
READ = ToolSchema("read", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}})


def conversation() -> ModelRequest:
    """A system prompt, a user turn, parallel tool calls (with text), a good and an error result."""
    return ModelRequest(
        [
            Message.system("You are terse."),
            Message.user("Find trio and read a.txt"),
            Message.assistant(
                "Looking.",
                tool_calls=(
                    ToolCall(id="call_1", name="search", arguments={"q": "trio"}),
                    ToolCall(id="call_2", name="read", arguments={"path": "a.txt"}),
                ),
            ),
            Message.tool_result("call_1", "trio is an async library"),
            Message.tool_result("call_2", "FileNotFoundError: a.txt", is_error=True),
            Message.user("Thanks. And now?"),
        ],
        tools=[SEARCH, READ],
        max_output_tokens=512,
    )


# -- request bodies --------------------------------------------------------------------------------


async def test_openai_request_body_field_by_field() -> None:
    endpoint = Endpoint((200, openai_reply()))
    provider = OpenAIProvider("gpt-test", base_url="https://llm.test/v1", api_key="sk-test", client=endpoint.client())
    await provider.complete(conversation())

    (request,) = endpoint.requests
    assert request.method == "POST"
    assert str(request.url) == "https://llm.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["content-type"] == "application/json"
    body = orjson.loads(request.content)
    assert set(body) == {"model", "messages", "tools", "max_completion_tokens"}
    assert body["model"] == "gpt-test"
    assert body["max_completion_tokens"] == 512
    system, user, assistant, result_1, result_2, user_2 = body["messages"]
    assert system == {"role": "system", "content": "You are terse."}
    assert user == {"role": "user", "content": "Find trio and read a.txt"}
    assert assistant == {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q":"trio"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "read", "arguments": '{"path":"a.txt"}'}},
        ],
    }
    assert result_1 == {"role": "tool", "tool_call_id": "call_1", "content": "trio is an async library"}
    # an error result still carries its text, unchanged
    assert result_2 == {"role": "tool", "tool_call_id": "call_2", "content": "FileNotFoundError: a.txt"}
    assert user_2 == {"role": "user", "content": "Thanks. And now?"}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the web.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "read",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        },
    ]


async def test_openai_body_limits_streaming_extra_body_and_images(tmp_path: Path) -> None:
    png = tmp_path / "dot.png"
    png.write_bytes(b"\x89PNG fake")
    endpoint = Endpoint((200, openai_reply()))
    provider = OpenAIProvider(
        "gpt-test",
        base_url="https://llm.test/v1",
        max_output_tokens=1000,
        extra_body={"temperature": 0.2, "seed": 7},
        client=endpoint.client(),
    )
    request = ModelRequest(
        [
            Message.user(
                (
                    TextPart("what is this?"),
                    ImagePart("https://img.test/cat.jpg"),
                    ImagePart(str(png)),
                    ImagePart("data:image/gif;base64,R0lG"),
                )
            ),
            Message.assistant("", tool_calls=(ToolCall(id="c", name="search", arguments={}),)),
            Message.tool_result("c", ""),
        ]
    )
    await provider.complete(request)
    body = endpoint.bodies()[0]
    assert "authorization" not in endpoint.requests[0].headers  # no key: no header (local servers)
    assert body["max_completion_tokens"] == 1000  # the provider's default when the request has none
    assert body["temperature"] == 0.2 and body["seed"] == 7
    assert "tools" not in body and "stream" not in body
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "https://img.test/cat.jpg"}},
        {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()},
        },
        {"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lG"}},
    ]
    assert body["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "search", "arguments": "{}"}}],
    }

    # max_tokens instead, for servers that only know it; streaming options
    endpoint = Endpoint((200, sse(*openai_chunks("hi"), "[DONE]"), SSE))
    provider = OpenAIProvider(
        "m", base_url="http://localhost:8000/v1", stream=True, extra_body={"max_tokens": None}, client=endpoint.client()
    )
    await provider.complete(ModelRequest([Message.user("x")], max_output_tokens=77))
    body = endpoint.bodies()[0]
    assert body["max_tokens"] == 77 and "max_completion_tokens" not in body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert endpoint.requests[0].headers["accept"] == "text/event-stream"


async def test_anthropic_request_body_field_by_field() -> None:
    endpoint = Endpoint((200, anthropic_reply()))
    provider = AnthropicProvider(
        "claude-test", base_url="https://anthropic.test", api_key="sk-ant", client=endpoint.client()
    )
    request = conversation()
    request = ModelRequest(
        [Message.system("Second rule."), *request.messages[:1], *request.messages[1:]],
        tools=request.tools,
        max_output_tokens=512,
    )
    await provider.complete(request)

    (sent,) = endpoint.requests
    assert str(sent.url) == "https://anthropic.test/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    body = orjson.loads(sent.content)
    assert set(body) == {"model", "max_tokens", "system", "messages", "tools"}
    assert body["model"] == "claude-test"
    assert body["max_tokens"] == 512
    assert body["system"] == "Second rule.\n\nYou are terse."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Find trio and read a.txt"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "call_1", "name": "search", "input": {"q": "trio"}},
                {"type": "tool_use", "id": "call_2", "name": "read", "input": {"path": "a.txt"}},
            ],
        },
        {
            # parallel results and the next user text, merged into one user message, results first
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "trio is an async library"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": "FileNotFoundError: a.txt",
                    "is_error": True,
                },
                {"type": "text", "text": "Thanks. And now?"},
            ],
        },
    ]
    assert body["tools"] == [
        {
            "name": "search",
            "description": "Search the web.",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
        {
            "name": "read",
            "description": "Read a file.",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    ]


async def test_anthropic_body_merges_roles_images_and_defaults(tmp_path: Path) -> None:
    jpg = tmp_path / "photo.jpg"
    jpg.write_bytes(b"\xff\xd8 fake jpeg")
    endpoint = Endpoint((200, anthropic_reply()))
    provider = AnthropicProvider("claude-test", api_key="k", client=endpoint.client(), stream=False)
    await provider.complete(
        ModelRequest(
            [
                Message.user("one"),
                Message.user((TextPart("two"), ImagePart("https://img.test/a.png"), ImagePart(str(jpg)))),
                Message.user((ImagePart("data:image/webp;base64,UklG"),)),
                Message.assistant(""),  # empty: left out
                Message.user(""),
            ]
        )
    )
    body = endpoint.bodies()[0]
    assert str(endpoint.requests[0].url) == "https://api.anthropic.com/v1/messages"
    assert body["max_tokens"] == 4096 and "system" not in body and "tools" not in body
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "one"},
                {"type": "text", "text": "two"},
                {"type": "image", "source": {"type": "url", "url": "https://img.test/a.png"}},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/jpeg",
                        "data": base64.b64encode(jpg.read_bytes()).decode(),
                    },
                },
                {"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": "UklG"}},
            ],
        }
    ]


async def test_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://vllm.test:8000/v1/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://proxy.test/anthropic")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    o_end, a_end = Endpoint((200, openai_reply())), Endpoint((200, anthropic_reply()))
    openai = OpenAIProvider("m", client=o_end.client())
    anthropic = AnthropicProvider("c", client=a_end.client())
    await openai.complete(ModelRequest([Message.user("hi")]))
    await anthropic.complete(ModelRequest([Message.user("hi")]))
    assert str(o_end.requests[0].url) == "http://vllm.test:8000/v1/chat/completions"
    assert o_end.requests[0].headers["authorization"] == "Bearer sk-env"
    assert str(a_end.requests[0].url) == "https://proxy.test/anthropic/v1/messages"
    assert a_end.requests[0].headers["x-api-key"] == "sk-ant-env"
    assert "sk-env" not in repr(openai) and "sk-ant-env" not in repr(anthropic)
    assert openai.name == "openai:m" and anthropic.name == "anthropic:c"

    # arguments win over the environment; Azure-style: the query string is kept, a header carries the key
    azure_end = Endpoint((200, openai_reply()))
    azure = OpenAIProvider(
        "gpt-4o",
        base_url="https://res.openai.azure.com/openai/deployments/gpt4o?api-version=2024-10-21",
        api_key="",
        headers={"api-key": "azure-key"},
        client=azure_end.client(),
    )
    await azure.complete(ModelRequest([Message.user("hi")]))
    sent = azure_end.requests[0]
    assert (
        str(sent.url) == "https://res.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21"
    )
    assert sent.headers["api-key"] == "azure-key" and "authorization" not in sent.headers


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(cmdc.ConfigError, match="model"):
        OpenAIProvider("")
    with pytest.raises(cmdc.ConfigError, match="max_retries"):
        OpenAIProvider("m", max_retries=-1)
    with pytest.raises(cmdc.ConfigError, match="timeout"):
        AnthropicProvider("m", timeout=0)
    with pytest.raises(cmdc.ConfigError, match="base_url"):
        OpenAIProvider("m", base_url="ftp://x")
    with pytest.raises(cmdc.ConfigError, match="max_output_tokens"):
        AnthropicProvider("m", max_output_tokens=0)


# -- replies ---------------------------------------------------------------------------------------


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


# -- streaming -------------------------------------------------------------------------------------


def openai_chunks(text: str) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "c1",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    return [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": ch}) for ch in (text[:2], text[2:])),
        chunk({}, "stop"),
        {"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 9,
         "completion_tokens": 2, "total_tokens": 11}},
    ]  # fmt: skip


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


def anthropic_events(*, stop: bool = True) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "claude-test",
                "stop_reason": None,
                "usage": {
                    "input_tokens": 100,
                    "cache_creation_input_tokens": 20,
                    "cache_read_input_tokens": 300,
                    "output_tokens": 1,
                },
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "check."}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}},
        },
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"q": "tr'}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": 'io"}'}},
        {"type": "content_block_stop", "index": 1},
        # cumulative usage: each message_delta replaces the figure before it
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"output_tokens": 40}},
        {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 55}},
    ]  # fmt: skip
    if stop:
        events.append({"type": "message_stop"})
    return events


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


# -- retries ---------------------------------------------------------------------------------------


def openai_error(status: int, message: str, code: str | None = None, type_: str = "invalid_request_error") -> Any:
    return (status, {"error": {"message": message, "type": type_, "param": None, "code": code}})


async def test_429_with_retry_after_then_200_waits_the_advertised_time(autojump_clock: trio.abc.Clock) -> None:
    endpoint = Endpoint(
        (429, {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}, {"retry-after": "7"}),
        (200, openai_reply("after the wait")),
    )
    provider = OpenAIProvider("m", client=endpoint.client())
    start = trio.current_time()
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert reply.text == "after the wait"
    assert len(endpoint.requests) == 2
    assert endpoint.times[1] - endpoint.times[0] >= 7.0
    assert trio.current_time() - start >= 7.0


async def test_retry_after_ms_and_backoff_for_anthropic(autojump_clock: trio.abc.Clock) -> None:
    endpoint = Endpoint(
        (429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}, {"retry-after-ms": "2500"}),
        (500, {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}),
        (200, anthropic_reply()),
    )
    provider = AnthropicProvider("claude-test", api_key="k", client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert reply.text == "done" and len(endpoint.requests) == 3
    assert endpoint.times[1] - endpoint.times[0] >= 2.5
    assert endpoint.times[2] > endpoint.times[1]  # backoff before the 5xx retry


async def test_retry_after_beyond_the_cap_is_not_waited(autojump_clock: trio.abc.Clock) -> None:
    endpoint = Endpoint(
        (429, {"error": {"message": "slow down", "code": "rate_limit_exceeded"}}, {"retry-after": "3600"})
    )
    provider = OpenAIProvider("m", client=endpoint.client())
    with pytest.raises(RateLimited) as info:
        await provider.complete(ModelRequest([Message.user("go")]))
    assert info.value.retry_after == 3600.0 and len(endpoint.requests) == 1


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (openai_error(401, "Incorrect API key provided", code="invalid_api_key"), AuthError),
        (openai_error(403, "Project does not have access", type_="permission_error"), AuthError),
        (openai_error(429, "You exceeded your current quota", code="insufficient_quota"), QuotaExceeded),
        (openai_error(400, "Invalid schema for function 'search'", code="invalid_function_parameters"), BadRequest),
        (openai_error(400, "prompt is too long: 210000 tokens > 200000 maximum"), ContextOverflow),
    ],
    ids=["401", "403", "quota", "bad request", "overflow"],
)
async def test_errors_that_are_never_retried(
    answer: Any, error: type[Exception], autojump_clock: trio.abc.Clock
) -> None:
    endpoint = Endpoint(answer, (200, openai_reply()))
    provider = OpenAIProvider("m", client=endpoint.client())
    start = trio.current_time()
    with pytest.raises(error):
        await provider.complete(ModelRequest([Message.user("go")]))
    assert len(endpoint.requests) == 1  # failed at once
    assert trio.current_time() == start


async def test_a_529_storm_ends_in_overloaded_after_the_retry_budget(autojump_clock: trio.abc.Clock) -> None:
    storm = (529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    endpoint = Endpoint(storm)
    provider = AnthropicProvider("claude-test", api_key="k", max_retries=3, client=endpoint.client())
    with pytest.raises(Overloaded) as info:
        await provider.complete(ModelRequest([Message.user("go")]))
    assert info.value.status == 529
    assert len(endpoint.requests) == 1 + 3  # the first attempt and max_retries retries
    gaps = [b - a for a, b in zip(endpoint.times, endpoint.times[1:], strict=False)]
    assert all(gap > 0 for gap in gaps)  # backoff between attempts

    none = AnthropicProvider("claude-test", api_key="k", max_retries=0, client=Endpoint(storm).client())
    with pytest.raises(Overloaded):
        await none.complete(ModelRequest([Message.user("go")]))


async def test_connection_errors_are_retried(autojump_clock: trio.abc.Clock) -> None:
    endpoint = Endpoint(httpx.ConnectError("connection refused"), (200, openai_reply("back")))
    provider = OpenAIProvider("m", client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert reply.text == "back" and len(endpoint.requests) == 2

    down = Endpoint(httpx.ReadTimeout("timed out"))
    provider = OpenAIProvider("m", max_retries=1, client=down.client())
    with pytest.raises(ConnectionFailed, match="ReadTimeout"):
        await provider.complete(ModelRequest([Message.user("go")]))
    assert len(down.requests) == 2


async def test_output_budget_overflow_is_retried_once_with_a_lower_limit(autojump_clock: trio.abc.Clock) -> None:
    budget = (
        400,
        {"type": "error", "error": {"type": "invalid_request_error", "message": "input length and `max_tokens` "
         "exceed context limit: 190000 + 20000 > 200000, decrease input length or `max_tokens` and try again"}},
    )  # fmt: skip
    endpoint = Endpoint(budget, (200, anthropic_reply()))
    provider = AnthropicProvider("claude-test", api_key="k", max_output_tokens=20000, client=endpoint.client())
    reply = await provider.complete(ModelRequest([Message.user("go")]))
    assert [b["max_tokens"] for b in endpoint.bodies()] == [20000, 10000]
    assert reply.metadata[OUTPUT_REDUCED_KEY] == 10000
    assert reply.metadata[CONTEXT_EXCEEDED_KEY] is True  # compact before the next step

    # twice over budget: the second error reaches the caller (an overflow: the agent compacts)
    endpoint = Endpoint(budget)
    provider = AnthropicProvider("claude-test", api_key="k", max_output_tokens=20000, client=endpoint.client())
    with pytest.raises(OutputBudgetOverflow):
        await provider.complete(ModelRequest([Message.user("go")]))
    assert len(endpoint.requests) == 2

    # too little room left for a useful answer: no retry, compaction is the remedy
    tight = openai_error(
        400,
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the "
        "messages, 1000 in the completion). Please reduce the length of the messages or completion.",
    )
    endpoint = Endpoint(tight)
    openai = OpenAIProvider("m", max_output_tokens=1000, client=endpoint.client())
    with pytest.raises(OutputBudgetOverflow) as info:
        await openai.complete(ModelRequest([Message.user("go")]))
    assert info.value.reduce_output_to == 96 and len(endpoint.requests) == 1


# -- cancellation ----------------------------------------------------------------------------------


class StallingStream(httpx.AsyncByteStream):
    """A response body that sends one chunk, then waits forever; records whether it was closed."""

    def __init__(self, first: bytes) -> None:
        self.first = first
        self.sent = trio.Event()
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.first
        self.sent.set()
        await trio.sleep_forever()

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_cancelling_a_stream_midway_closes_the_response(kind: str) -> None:
    if kind == "openai":
        body = StallingStream(sse(openai_chunks("hello")[0]))
    else:
        body = StallingStream(sse(*anthropic_events()[:3], event_names=True))
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(200, stream=body)))
    provider: OpenAIProvider | AnthropicProvider
    if kind == "openai":
        provider = OpenAIProvider("m", stream=True, client=client)
    else:
        provider = AnthropicProvider("c", api_key="k", stream=True, client=client)
    async with trio.open_nursery() as nursery:

        async def cancel_midway() -> None:
            await body.sent.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(cancel_midway)
        await provider.complete(ModelRequest([Message.user("go")]))
    assert body.sent.is_set() and body.closed


async def test_cancelling_a_stream_leaves_no_open_connection_in_the_pool() -> None:
    """A loopback HTTP server streams a reply and stalls; cancelling the request closes the
    connection (the server sees EOF) and the client's pool holds no connection."""
    sent, eof = trio.Event(), trio.Event()

    async def serve(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        chunk = sse(openai_chunks("hello")[0])
        await stream.send_all(head + b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sent.set()
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        eof.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, serve, 0)
            port = listeners[0].socket.getsockname()[1]
            async with httpx.AsyncClient(trust_env=False) as client:
                provider = OpenAIProvider("m", base_url=f"http://127.0.0.1:{port}/v1", stream=True, client=client)
                with trio.CancelScope() as scope:

                    async def cancel_midway() -> None:
                        await sent.wait()
                        await trio.sleep(0.05)
                        scope.cancel()

                    nursery.start_soon(cancel_midway)
                    await provider.complete(ModelRequest([Message.user("go")]))
                assert scope.cancelled_caught
                await eof.wait()
                pool = client._transport._pool  # type: ignore[attr-defined]
                assert pool.connections == []
            nursery.cancel_scope.cancel()


async def test_a_finished_stream_returns_its_connection_to_the_pool() -> None:
    """Two streamed replies over one keep-alive connection of a loopback server."""
    requests_per_connection: list[int] = []

    async def serve(stream: trio.SocketStream) -> None:
        buffer, served = b"", 0
        requests_per_connection.append(0)
        while True:
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            while len(buffer) < length:
                buffer += await stream.receive_some(65536)
            buffer = buffer[length:]
            served += 1
            requests_per_connection[-1] = served
            body = sse(*openai_chunks(f"reply {served}"), "[DONE]")
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            )

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, serve, 0)
            port = listeners[0].socket.getsockname()[1]
            async with httpx.AsyncClient(trust_env=False) as client:
                provider = OpenAIProvider("m", base_url=f"http://127.0.0.1:{port}/v1", stream=True, client=client)
                first = await provider.complete(ModelRequest([Message.user("one")]))
                second = await provider.complete(ModelRequest([Message.user("two")]))
            nursery.cancel_scope.cancel()
    assert (first.text, second.text) == ("reply 1", "reply 2")
    assert requests_per_connection == [2]


async def test_owned_client_is_closed_by_aclose() -> None:
    provider = OpenAIProvider("m", api_key="k")
    client = provider._http()
    async with provider:
        pass
    assert client.is_closed
    assert provider._http() is not client  # made again on the next use
    await provider.aclose()


# -- an agent against an HTTP endpoint ------------------------------------------------------------


async def test_agent_force_compacts_when_the_endpoint_says_prompt_is_too_long(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    overflowed = False

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal overflowed
        body = orjson.loads(request.content)
        seen.append(body)
        last = body["messages"][-1]["content"]
        if last == "question 6" and not overflowed:
            overflowed = True
            return httpx.Response(
                400,
                json={
                    "error": {
                        "message": "prompt is too long: 210000 tokens > 200000 maximum",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                },
            )
        reply = openai_reply(f"answer to {last}: " + " ".join(f"detail {n} of {last}." for n in range(150)))
        reply["usage"] = {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}
        return httpx.Response(200, json=reply)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    provider = OpenAIProvider("gpt-test", base_url="https://llm.test/v1", api_key="k", client=client)
    async with cmdc.open_runtime() as rt:
        agent = await rt.spawn(
            "a1",
            provider,
            config={"compact_offload_dir": str(tmp_path), "compact_keep": ("messages", 2)},
            summarizer=cmdc.ExtractiveSummarizer(),
        )
        for i in range(1, 6):
            await agent.prompt(f"question {i}")
        reply = await agent.prompt("question 6")
        state = await agent.state()

    assert reply.text.startswith("answer to question 6")
    failed, retried = seen[-2], seen[-1]
    assert failed["messages"][-1]["content"] == retried["messages"][-1]["content"] == "question 6"
    assert len(retried["messages"]) < len(failed["messages"])
    assert len(orjson.dumps(retried)) < len(orjson.dumps(failed))
    assert state.compactions == 1
    assert any(m.is_summary for m in state.messages)


async def test_agent_survives_a_529_storm(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    storm = True

    def answer(request: httpx.Request) -> httpx.Response:
        if storm:
            return httpx.Response(529, json={"type": "error", "error": {"type": "overloaded_error", "message": "O"}})
        return httpx.Response(200, json=anthropic_reply())

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    provider = AnthropicProvider("claude-test", api_key="k", max_retries=2, client=client)
    async with cmdc.open_runtime() as rt:
        agent = await rt.spawn("a1", provider, config={"compact_offload_dir": str(tmp_path)})
        with pytest.raises(Overloaded):
            await agent.prompt("hello")
        storm = False
        reply = await agent.prompt("hello again")
        assert reply.text == "done"
        assert rt.whereis("a1") is not None


# -- the core stays light --------------------------------------------------------------------------


def test_cmdc_providers_imports_without_httpx() -> None:
    code = (
        "import sys\n"
        "sys.modules['httpx'] = None\n"
        "sys.modules['stamina'] = None\n"
        "import cmdc, cmdc.providers\n"
        "from cmdc.providers import ScriptedProvider, ModelRequest\n"
        "from cmdc.providers.overflow import classify\n"
        "assert classify(400, {}, b'prompt is too long').__class__.__name__ == 'ContextOverflow'\n"
        "try:\n"
        "    cmdc.providers.OpenAIProvider\n"
        "except ImportError as exc:\n"
        "    assert 'cmdc[http]' in str(exc)\n"
        "else:\n"
        "    raise SystemExit('imported without httpx')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_no_api_key_for_the_vendor_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIProvider("gpt-4.1")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicProvider("claude-sonnet-4-5")
    monkeypatch.setenv("OPENAI_API_KEY", "")  # empty counts as unset
    with pytest.raises(ConfigError, match="no API key"):
        OpenAIProvider("gpt-4.1", base_url="https://api.openai.com/v1/")
    # a key from anywhere, another server, or your own client: no error
    assert OpenAIProvider("gpt-4.1", api_key="sk-x").api_key == "sk-x"
    OpenAIProvider("gpt-4.1", headers={"Authorization": "Bearer sk-x"})
    OpenAIProvider("qwen", base_url="http://localhost:8000/v1")
    AnthropicProvider("claude", headers={"x-api-key": "k"})
    AnthropicProvider("claude", base_url="http://localhost:8080")
    OpenAIProvider("gpt-4.1", client=httpx.AsyncClient())
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    assert AnthropicProvider("claude").api_key == "k"
