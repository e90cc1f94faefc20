"""The HTTP providers' request bodies, field by field (OpenAI and Anthropic)."""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
from fakes import (
    READ,
    SEARCH,
    SSE,
    Endpoint,
    anthropic_reply,
    openai_chunks,
    openai_reply,
    sse,
)

from cmdc import ImagePart, Message, TextPart, ToolCall
from cmdc.providers import AnthropicProvider, ModelRequest, OpenAIProvider


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
    provider = AnthropicProvider(  # cache breakpoints: tests/compaction/test_prompt_cache.py
        "claude-test",
        base_url="https://anthropic.test",
        api_key="sk-ant",
        client=endpoint.client(),
        cache_breakpoints=False,
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
    provider = AnthropicProvider(
        "claude-test", api_key="k", client=endpoint.client(), stream=False, cache_breakpoints=False
    )
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
