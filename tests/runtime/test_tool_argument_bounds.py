"""One tool call with 800k argument keys (~14 MiB, under the reply limit) stalled the trio
thread for seconds (token estimate and schema validation on it) and kept a 44 MiB
`ToolArgumentsError` text in the state. The arguments are bounded per call (values and depth),
large ones are validated in a worker thread, and error texts are clipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio

import cmdc
import cmdc.tokens
import cmdc.tools
from cmdc import Message, ToolCall, open_runtime, tool
from cmdc.providers import AnthropicProvider, ModelRequest, OpenAIProvider, ReplyLimits, ScriptedProvider
from cmdc.providers.base import REFUSED_ARGUMENTS_KEY
from cmdc.tools import ToolArgumentsError

call = ScriptedProvider.tool_call
MANY = 50_000  # past the default bound of 10,000 values, small enough to build quickly


def wide(n: int) -> dict[str, int]:
    return {f"k{i}": i for i in range(n)}


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels):
        value = {"x": value}
    return value


ran: list[dict[str, Any]] = []


def open_tool() -> cmdc.tools.Tool:
    async def run(**kwargs: Any) -> str:
        ran.append(kwargs)
        return f"ran with {len(kwargs)} arguments"

    return cmdc.tools.tool_from_schema("open", "Takes any arguments.", {"type": "object"}, run)


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


# -- through a turn, any provider: the agent's bound -------------------------------------------------


@pytest.mark.parametrize("arguments", [wide(MANY), deep(40)], ids=["50k-keys", "40-levels"])
async def test_a_call_past_the_argument_bounds_is_refused_readably(arguments: dict[str, Any]) -> None:
    provider = ScriptedProvider([call("open", arguments), "done"])
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", provider, tools=[open_tool()])
        neighbour = await rt.spawn("n1", ScriptedProvider(["pong"]))
        assert (await agent.prompt("go")).text == "done"
        assert (await neighbour.prompt("ping")).text == "pong"
        [result] = [m for m in (await agent.state()).messages if m.role == "tool"]
    assert ran == []  # never validated nor run
    assert result.is_error and result.content.startswith("tool 'open' not run: its arguments were refused: ")
    why = "more than 10,000 values in all" if len(arguments) > 1 else "nested deeper than 32 levels"
    assert why in result.content and "max_tool_argument_values=10,000, max_tool_argument_depth=32" in result.content
    assert len(result.content) < 300


async def test_the_bounds_are_configurable_and_checked() -> None:
    provider = ScriptedProvider([call("open", wide(20)), call("open", wide(5)), "done"])
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", provider, tools=[open_tool()], max_tool_argument_values=10)
        await agent.prompt("go")
        first, second = [m for m in (await agent.state()).messages if m.role == "tool"]
        assert first.is_error and "more than 10 values" in first.content
        assert second.content == "ran with 5 arguments"
        with pytest.raises(cmdc.ConfigError, match="max_tool_argument_depth"):
            await rt.spawn("a2", provider, max_tool_argument_depth=0)


# -- validation: off the trio thread when large, its error text bounded ----------------------------------


async def test_large_arguments_are_validated_in_a_worker_thread_and_the_error_is_clipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @tool
    async def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    threads: list[Any] = []
    real = trio.to_thread.run_sync

    async def recording(fn: Any, *args: Any, **kwargs: Any) -> Any:
        threads.append(fn)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(cmdc.tools.trio.to_thread, "run_sync", recording)
    with pytest.raises(ToolArgumentsError) as info:
        await add.run({"a": 1, "b": 2, **wide(9_000)})  # under the bound, every key unknown
    assert threads == [add.validate]
    text = str(info.value)
    assert len(text) < 10_000  # 9,000 problems: 44 MiB of text at 800k keys before
    assert text.count("\n- ") == 21 and text.endswith("more listed problems not shown")
    assert len(info.value.errors) == cmdc.tools.MAX_ERRORS + 1
    assert info.value.errors[-1] == f"... and {9_000 - cmdc.tools.MAX_ERRORS:,} more problems"
    # small arguments stay on the trio thread
    threads.clear()
    assert await add.run({"a": 1, "b": 2}) == "3"
    assert threads == []


def test_one_long_problem_is_clipped() -> None:
    error = ToolArgumentsError(["x" * 100_000])
    assert len(str(error)) < 400 and str(error).endswith("... (clipped)")


# -- the HTTP providers: refused while reading the reply, nothing of them kept ------------------------


def replying(body: dict[str, Any]) -> httpx.AsyncClient:
    raw = orjson.dumps(body)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=raw, headers={"content-type": "application/json"})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def openai_reply(arguments: str) -> dict[str, Any]:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "open", "arguments": arguments}},
        {"id": "c2", "type": "function", "function": {"name": "open", "arguments": '{"a": 1}'}},
    ]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}


def anthropic_reply(arguments: dict[str, Any]) -> dict[str, Any]:
    content = [
        {"type": "tool_use", "id": "c1", "name": "open", "input": arguments},
        {"type": "tool_use", "id": "c2", "name": "open", "input": {"a": 1}},
    ]
    return {"type": "message", "role": "assistant", "content": content, "stop_reason": "tool_use"}


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_provider_refuses_a_call_past_the_bounds_and_keeps_nothing_of_it(kind: str) -> None:
    arguments = wide(MANY)
    if kind == "openai":
        provider: Any = OpenAIProvider(
            "m", api_key="k", max_retries=0, client=replying(openai_reply(orjson.dumps(arguments).decode()))
        )
    else:
        provider = AnthropicProvider("c", api_key="k", max_retries=0, client=replying(anthropic_reply(arguments)))
    reply = await provider.complete(ModelRequest([Message.user("hi")]))
    first, second = reply.tool_calls
    assert dict(first.arguments) == {} and dict(second.arguments) == {"a": 1}
    [(cid, why)] = reply.metadata[REFUSED_ARGUMENTS_KEY].items()
    assert cid == "c1" and "more than 10,000 values in all" in why and "max_argument_values=10,000" in why
    assert len(orjson.dumps(reply.to_dict())) < 2_000  # the 50k keys are not kept anywhere

    # through an agent: the refused call is answered with why, the other one runs
    async with open_runtime(log_events=False) as rt:
        scripted = ScriptedProvider([reply, "done"])
        agent = await rt.spawn("a1", scripted, tools=[open_tool()])
        await agent.prompt("go")
        results = [m for m in (await agent.state()).messages if m.role == "tool"]
    assert results[0].is_error and results[0].content.startswith("tool 'open' not run: the arguments of this call")
    assert results[1].content == "ran with 1 arguments" and ran == [{"a": 1}]


def test_reply_limits_take_the_argument_bounds() -> None:
    limits = ReplyLimits(max_argument_values=5, max_argument_depth=2)
    assert (limits.max_argument_values, limits.max_argument_depth) == (5, 2)
    with pytest.raises(cmdc.ConfigError, match="max_argument_values"):
        ReplyLimits(max_argument_values=0)


def test_a_tool_call_with_many_arguments_is_estimated_without_a_thawed_copy() -> None:
    message = Message.assistant("", tool_calls=[ToolCall("c1", "open", wide(1000))])
    assert cmdc.tokens.estimate_message_tokens(message) == cmdc.tokens.MESSAGE_OVERHEAD + (
        cmdc.tokens.TOOL_CALL_OVERHEAD + 1 + (len(orjson.dumps(wide(1000))) + 3) // 4
    )


def test_keys_are_counted_unparsed_only_when_surely_too_many() -> None:
    """An OpenAI arguments text with more `":` than the bound outside strings is refused before it
    is parsed; quotes and colons inside a string value do not count."""
    from cmdc.providers._http import tool_call

    quoted = orjson.dumps({"text": '":' * 20_000}).decode()  # 20,000 escaped `\":` in one value
    invalid: dict[str, str] = {}
    refused: dict[str, str] = {}
    kept = tool_call("c1", "open", quoted, invalid, ReplyLimits(), refused)
    assert kept.arguments["text"] == '":' * 20_000 and refused == {} and invalid == {}
    keys = orjson.dumps(wide(10_001)).decode()
    assert dict(tool_call("c2", "open", keys, invalid, ReplyLimits(), refused).arguments) == {}
    assert "more than 10,000 values in all" in refused["c2"]


def test_the_argument_benchmark_prints_its_figures() -> None:
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.argument_stall", "--keys", "20000"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("keys 20,000: reply ")
    assert "not run: the arguments of this call were refused: more than 10,000 values in all" in done.stdout
