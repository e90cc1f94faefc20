"""An agent against an HTTP endpoint: a 'prompt is too long' answer forces a compaction; a 529 storm is survived."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio
from fakes import (
    anthropic_reply,
    openai_reply,
)

import cmdc
from cmdc.errors import (
    Overloaded,
)
from cmdc.providers import AnthropicProvider, OpenAIProvider


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
