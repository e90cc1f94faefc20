"""End to end against a real model server: llama.cpp's `llama-server` with SmolLM2-135M-Instruct
in a 2,048-token window (see `tests/e2e/llama_server.py`; skipped with the command to get it when
it is not cached). Both APIs, streaming and not; the server's own overflow body through the
providers; agents of 20+ turns compacting with the real model as summarizer. Every call is
bounded by `trio.fail_after`.

A tool round trip: the server runs SmolLM2 with a chat template that has tools
(`smollm2-tools.jinja`); the model never calls one on its own (it was not trained on tools), so
the test asks for a call with `tool_choice: "required"`, which llama.cpp enforces by grammar;
cmdc parses the call, runs the tool, sends the result back, and the model answers. Over the
OpenAI API only: llama.cpp's Anthropic endpoint maps `tool_choice` `any` but neither `none` nor
`disable_parallel_tool_use`, so it cannot be asked for exactly one call and then for prose.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import cmdc
from benchmarks import e2e_llama
from benchmarks.e2e_llama import Api, Mode
from cmdc import ContextOverflow, Message, tool
from cmdc.events import TOOL_END, Event
from cmdc.providers import ModelRequest
from cmdc.providers.base import STOP_REASON_KEY
from cmdc.testing import drain
from tests.e2e.llama_server import CONTEXT, LlamaServer

pytestmark = pytest.mark.e2e

APIS = [("openai", False), ("openai", True), ("anthropic", False), ("anthropic", True)]
IDS = ["openai", "openai-stream", "anthropic", "anthropic-stream"]
CALL_SECONDS = 120
STOPS = {"openai": ("stop", "length"), "anthropic": ("end_turn", "max_tokens")}
LENGTH = {"openai": "length", "anthropic": "max_tokens"}


@pytest.mark.parametrize(("api", "stream"), APIS, ids=IDS)
async def test_a_reply_with_usage_and_stop_reason(llama: LlamaServer, api: Api, stream: bool) -> None:
    request = ModelRequest(
        (Message.system("You answer in one short sentence."), Message.user("Name three colors.")),
        max_output_tokens=24,
    )
    async with e2e_llama.provider(llama.url, api, stream) as model:
        with trio.fail_after(CALL_SECONDS):
            reply = await model.complete(request)
    assert reply.role == "assistant"
    assert reply.text.strip()
    assert reply.metadata[STOP_REASON_KEY] in STOPS[api]
    usage = reply.usage
    assert usage is not None
    assert usage.input_tokens > 5
    assert 1 <= usage.output_tokens <= 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


@pytest.mark.parametrize(("api", "stream"), APIS, ids=IDS)
async def test_an_output_limit_is_reported_as_such(llama: LlamaServer, api: Api, stream: bool) -> None:
    request = ModelRequest((Message.user("Write a long essay about the history of the sea."),), max_output_tokens=5)
    async with e2e_llama.provider(llama.url, api, stream) as model:
        with trio.fail_after(CALL_SECONDS):
            reply = await model.complete(request)
    assert reply.metadata[STOP_REASON_KEY] == LENGTH[api]
    assert reply.usage is not None and reply.usage.output_tokens == 5


@pytest.mark.parametrize(("api", "stream"), APIS, ids=IDS)
async def test_overflow_carries_the_servers_figures(llama: LlamaServer, api: Api, stream: bool) -> None:
    text = "\n".join(f"line {i}: the nightly deploy of ledgerd failed with a timeout." for i in range(300))
    async with e2e_llama.provider(llama.url, api, stream) as model:
        with trio.fail_after(CALL_SECONDS), pytest.raises(ContextOverflow) as caught:
            await model.complete(ModelRequest((Message.user(text),)))
    assert caught.value.limit == CONTEXT
    assert caught.value.prompt_tokens is not None and caught.value.prompt_tokens > CONTEXT


RUN_IDS = [e2e_llama.run_name(*r) for r in e2e_llama.RUNS]


@pytest.mark.parametrize(("api", "stream", "mode"), e2e_llama.RUNS, ids=RUN_IDS)
async def test_an_agent_of_twenty_turns_compacts_and_loses_nothing(
    long_run: LlamaServer, run_table: list[e2e_llama.RunResult], tmp_path: Path, api: Api, stream: bool, mode: Mode
) -> None:
    result = await e2e_llama.run_agent(long_run.url, api=api, stream=stream, mode=mode, turns=20, offload_dir=tmp_path)
    run_table.append(result)
    assert result.turns == 20
    assert all(text.strip() for text in result.replies)
    if mode == "auto":
        assert result.auto >= 1
    else:  # only the server's limits compact: a "too long" error, or a reply cut off by the full window
        assert result.auto == 0
        assert result.forced >= 1 and result.overflows + result.continued >= 1
    # Every compaction has a summary: the model's, or the offline fallback's when it was refused.
    assert result.accepted + result.fallen_back >= result.auto + result.forced
    assert result.journal_ok, (result.lost, result.unknown)
    assert result.journal >= result.evicted > 0


@tool
async def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"{city}: 21 C, sunny, light wind from the west"


class ToolFirst:
    """SmolLM2-135M was not trained on tools: this provider asks the server to call one
    (`tool_choice: "required"`, one call: llama.cpp constrains the answer to a call by grammar)
    when the user spoke last, and to answer in prose (`tool_choice: "none"`) once a tool result
    is in. Everything else (the request, the parsing of the call, the tool's run) is cmdc's."""

    def __init__(self, url: str, stream: bool) -> None:
        # Greedy decoding: sampled, the grammar still lets the model ramble inside the argument
        # string until its output limit (seen once in ~10 runs, a call cut off on `length`).
        self.calling = e2e_llama.provider(
            url,
            "openai",
            stream,
            max_output_tokens=128,
            extra_body={"tool_choice": "required", "parallel_tool_calls": False, "temperature": 0},
        )
        self.answering = e2e_llama.provider(url, "openai", stream, extra_body={"tool_choice": "none", "temperature": 0})

    async def complete(self, request: ModelRequest) -> Message:
        model = self.calling if request.messages[-1].role == "user" else self.answering
        return await model.complete(request)  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        await self.calling.aclose()
        await self.answering.aclose()


@pytest.mark.parametrize("stream", [False, True], ids=["openai", "openai-stream"])
async def test_a_tool_round_trip(llama: LlamaServer, tmp_path: Path, stream: bool) -> None:
    model = ToolFirst(llama.url, stream)
    events: list[Event] = []
    try:
        async with cmdc.open_runtime(log_events=False) as rt:
            agent = await rt.spawn(
                "weather",
                model,
                instructions="You answer questions about the weather with the get_weather tool.",
                tools=[get_weather],
                config={"compact_offload_dir": str(tmp_path)},
            )
            with rt.subscribe("weather", buffer=1_000) as sub:
                with trio.fail_after(CALL_SECONDS * 2):
                    reply = await agent.prompt("What is the weather in Paris?")
                events += drain(sub)
            state = await agent.state()
    finally:
        await model.aclose()
    # user, assistant (the call), tool (its result), assistant (the answer)
    roles = [m.role for m in state.messages if m.role != "system"]
    assert roles == ["user", "assistant", "tool", "assistant"]
    call_message, result, answer = state.messages[-3:]
    [call] = call_message.tool_calls
    assert call.name == "get_weather" and isinstance(call.arguments.get("city"), str) and call.arguments["city"]
    assert call_message.metadata[STOP_REASON_KEY] == "tool_calls"
    assert result.tool_call_id == call.id and "21 C, sunny" in result.text and not result.metadata.get("is_error")
    assert reply.text == answer.text and reply.text.strip() and not reply.tool_calls
    print(f"\n{call.name}({call.arguments}) -> {result.text!r} -> {reply.text!r}")
    ran = [e for e in events if e.kind == TOOL_END]
    assert len(ran) == 1 and ran[0].data["tool"] == "get_weather" and not ran[0].data["error"]


async def test_prompt_cache_over_a_session_with_warm_compactions(long_run: LlamaServer, tmp_path: Path) -> None:
    """A 20-turn agent, the model its own summarizer (warm): per request, the prompt tokens the
    server evaluated and those it served from its cache (printed); between compactions each
    request evaluates only its new tokens (the previous prompt is all cached); the summarizer
    requests are made on the agent's cached prefix."""
    run = await e2e_llama.run_cache(long_run.url, turns=20, warm=True, offload_dir=tmp_path)
    print("\n" + e2e_llama.cache_table([run]))
    assert run.compactions >= 1
    steady = run.steady()
    assert steady and max(steady) <= 8  # the previous request's prompt, re-evaluated: a constant at most
    summaries = run.summaries()
    assert summaries and all(r.warm for r in summaries)
    assert all(r.cached >= r.prompt // 2 for r in summaries)
    assert run.share() >= 0.85  # the target (70% with cold summaries)
