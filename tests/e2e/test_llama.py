"""End to end against a real model server: llama.cpp's `llama-server` with SmolLM2-135M-Instruct
in a 2,048-token window (see `tests/e2e/llama_server.py`; skipped with the command to get it when
it is not cached). Both APIs, streaming and not; the server's own overflow body through the
providers; agents of 20+ turns compacting with the real model as summarizer. Every call is
bounded by `trio.fail_after`.

Tool calls are not exercised: SmolLM2's chat template has no tools (the server ignores them),
and with a tool-capable template (Hermes, Qwen 2.5) the 135M model still answers in prose and
this llama.cpp does not force a call with `tool_choice: required`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from benchmarks import e2e_llama
from benchmarks.e2e_llama import Api
from cmdc import ContextOverflow, Message
from cmdc.providers import ModelRequest
from cmdc.providers._http import STOP_REASON_KEY
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


@pytest.mark.parametrize(
    ("api", "stream", "mode"),
    [("openai", False, "auto"), ("anthropic", True, "overflow")],
    ids=["openai-automatic", "anthropic-stream-overflow-only"],
)
async def test_an_agent_of_twenty_turns_compacts_and_loses_nothing(
    long_run: LlamaServer, tmp_path: Path, api: Api, stream: bool, mode: e2e_llama.Mode
) -> None:
    result = await e2e_llama.run_agent(long_run.url, api=api, stream=stream, mode=mode, turns=20, offload_dir=tmp_path)
    print("\n" + e2e_llama.table([result]))
    assert result.turns == 20
    assert all(text.strip() for text in result.replies)
    if mode == "auto":
        assert result.auto >= 1
    else:
        assert result.auto == 0
        assert result.forced >= 1 and result.overflows >= 1
    assert result.journal_ok, (result.lost, result.unknown)
    assert result.journal >= result.evicted > 0
