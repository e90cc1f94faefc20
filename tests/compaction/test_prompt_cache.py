"""Prompt caching (issue 30): cache figures parsed from each provider's recorded reply shapes,
Anthropic's cache breakpoints, the summarizer's usage in the compaction report and spans, and
compaction on a warm cache (the summarizer asked on the agent's own prefix) with its fallback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from cmdc import Compacted, Compactor, Message, TokenUsage
from cmdc.compaction.warm import AgentContext, set_agent_context
from cmdc.providers import AnthropicProvider, ModelRequest, OpenAIProvider
from cmdc.providers.base import STOP_REASON_KEY
from cmdc.testing import drain
from tests._support.fakes import SEARCH, SSE, STRUCTURED, Endpoint, make_state, sse

# -- usage: recorded reply shapes -------------------------------------------------------------------

OPENAI_CACHED = {  # OpenAI Chat Completions with a prompt-cache hit (prompt caching guide)
    "id": "chatcmpl-9x",
    "object": "chat.completion",
    "created": 1730000000,
    "model": "gpt-4o-2024-08-06",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {
        "prompt_tokens": 2006,
        "completion_tokens": 300,
        "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    },
}
LLAMA_SERVER = {  # llama-server (llama.cpp b1-0c1e570), a second request on the same prefix
    "choices": [{"finish_reason": "length", "index": 0, "message": {"role": "assistant", "content": "..."}}],
    "created": 1796414995,
    "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "system_fingerprint": "b1-0c1e570",
    "object": "chat.completion",
    "usage": {
        "completion_tokens": 8,
        "prompt_tokens": 80,
        "total_tokens": 88,
        "prompt_tokens_details": {"cached_tokens": 79},
    },
    "id": "chatcmpl-EvhXERVtMd4ievlBOVJQnqtegcQa7lMy",
    "timings": {"cache_n": 79, "prompt_n": 1, "prompt_ms": 91.078, "predicted_n": 8, "predicted_ms": 529.123},
}
ANTHROPIC_WRITE = {
    "input_tokens": 50,
    "cache_creation_input_tokens": 2051,
    "cache_read_input_tokens": 0,
    "output_tokens": 300,
}
ANTHROPIC_READ = {
    "input_tokens": 50,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 2051,
    "output_tokens": 300,
}
LLAMA_ANTHROPIC = {"cache_read_input_tokens": 44, "input_tokens": 1, "output_tokens": 8}  # llama-server's /v1/messages


def _openai(endpoint: Endpoint, **kw: Any) -> OpenAIProvider:
    return OpenAIProvider("m", base_url="http://localhost:8000/v1", client=endpoint.client(), **kw)


def _anthropic(endpoint: Endpoint, **kw: Any) -> AnthropicProvider:
    return AnthropicProvider(
        "claude-test", base_url="https://anthropic.test", api_key="k", client=endpoint.client(), **kw
    )


def _anthropic_body(usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": usage,
    }


async def test_openai_usage_reads_cached_tokens() -> None:
    reply = await _openai(Endpoint((200, OPENAI_CACHED))).complete(ModelRequest([Message.user("x")]))
    assert reply.usage == TokenUsage(input_tokens=2006, output_tokens=300, total_tokens=2306, cache_read_tokens=1920)


async def test_llama_server_usage_json_and_stream() -> None:
    reply = await _openai(Endpoint((200, LLAMA_SERVER))).complete(ModelRequest([Message.user("x")]))
    assert reply.usage is not None and (reply.usage.input_tokens, reply.usage.cache_read_tokens) == (80, 79)
    last = {
        "choices": [],
        "object": "chat.completion.chunk",
        "usage": {
            "completion_tokens": 8,
            "prompt_tokens": 80,
            "total_tokens": 88,
            "prompt_tokens_details": {"cached_tokens": 79},
        },
        "timings": {"cache_n": 79, "prompt_n": 1},
    }
    first = {
        "choices": [{"finish_reason": "length", "index": 0, "delta": {"content": "hi"}}],
        "object": "chat.completion.chunk",
    }
    stream = Endpoint((200, sse(first, last, "[DONE]"), SSE))
    reply = await _openai(stream, stream=True).complete(ModelRequest([Message.user("x")]))
    assert reply.usage is not None and reply.usage.cache_read_tokens == 79 and reply.text == "hi"


async def test_llama_server_timings_alone_give_the_cached_tokens() -> None:
    """An older llama-server reports no `prompt_tokens_details`: `timings.cache_n` says it."""
    body = {**LLAMA_SERVER, "usage": {"completion_tokens": 8, "prompt_tokens": 80, "total_tokens": 88}}
    reply = await _openai(Endpoint((200, body))).complete(ModelRequest([Message.user("x")]))
    assert reply.usage is not None and reply.usage.cache_read_tokens == 79
    hostile = {**body, "timings": {"cache_n": 10**9}}  # never more than the prompt
    reply = await _openai(Endpoint((200, hostile))).complete(ModelRequest([Message.user("x")]))
    assert reply.usage is not None and reply.usage.cache_read_tokens == 80


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (ANTHROPIC_WRITE, TokenUsage(input_tokens=2101, output_tokens=300, cache_creation_tokens=2051)),
        (ANTHROPIC_READ, TokenUsage(input_tokens=2101, output_tokens=300, cache_read_tokens=2051)),
        (LLAMA_ANTHROPIC, TokenUsage(input_tokens=45, output_tokens=8, cache_read_tokens=44)),
    ],
)
async def test_anthropic_usage_reads_cache_reads_and_writes(usage: dict[str, int], expected: TokenUsage) -> None:
    reply = await _anthropic(Endpoint((200, _anthropic_body(usage)))).complete(ModelRequest([Message.user("x")]))
    assert reply.usage == expected


# -- Anthropic breakpoints -----------------------------------------------------------------------


def _marks(body: dict[str, Any]) -> list[str]:
    """Where the body's `cache_control` breakpoints are, in order."""
    out = []
    system = body.get("system")
    if isinstance(system, list):
        out += [f"system:{i}" for i, b in enumerate(system) if "cache_control" in b]
    out += [f"tool:{t['name']}" for t in body.get("tools", []) if "cache_control" in t]
    for i, m in enumerate(body["messages"]):
        out += [f"message:{i}:{j}" for j, b in enumerate(m["content"]) if "cache_control" in b]
    for mark in (b for b in [*body.get("tools", []), *(system if isinstance(system, list) else [])]):
        assert mark.get("cache_control", {"type": "ephemeral"}) == {"type": "ephemeral"}
    return out


def _summary(n: int) -> Message:
    return Message.user(f"[Conversation summary #{n}] earlier work", metadata={"cmdc.kind": "summary"})


async def test_breakpoints_after_system_summary_and_tail() -> None:
    endpoint = Endpoint((200, _anthropic_body(ANTHROPIC_READ)))
    messages = [
        Message.system("You are terse."),
        Message.user("the task"),
        _summary(1),
        Message.assistant("older answer"),
        _summary(2),  # the newest summary
        Message.assistant("newest answer"),
        Message.user("next question"),
    ]
    await _anthropic(endpoint).complete(ModelRequest(messages, tools=(SEARCH,)))
    body = endpoint.bodies()[0]
    assert body["system"] == [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    # the user turns: [task, summary 1] [older] [summary 2] [newest] [next question]
    assert _marks(body) == ["system:0", "message:2:0", "message:4:0"]
    assert body["messages"][2]["content"][0]["text"].startswith("[Conversation summary #2]")
    assert len(_marks(body)) <= 4


async def test_breakpoint_on_the_last_tool_without_system_and_opt_out() -> None:
    endpoint = Endpoint((200, _anthropic_body(ANTHROPIC_READ)))
    request = ModelRequest([Message.user("hello")], tools=(SEARCH,))
    await _anthropic(endpoint).complete(request)
    body = endpoint.bodies()[0]
    assert _marks(body) == ["tool:search", "message:0:0"]
    off = Endpoint((200, _anthropic_body(ANTHROPIC_READ)))
    await _anthropic(off, cache_breakpoints=False).complete(
        ModelRequest([Message.system("s"), _summary(1), Message.user("hello")], tools=(SEARCH,))
    )
    assert b"cache_control" not in off.requests[0].content
    assert off.bodies()[0]["system"] == "s"


async def test_breakpoint_on_a_tool_result_tail_and_at_most_four() -> None:
    from cmdc import ToolCall

    call = ToolCall(id="c1", name="search", arguments={"q": "x"})
    endpoint = Endpoint((200, _anthropic_body(ANTHROPIC_READ)))
    messages = [
        Message.system("s"),
        _summary(1),
        Message.assistant("", tool_calls=(call,)),
        Message.tool_result("c1", "found"),
    ]
    await _anthropic(endpoint).complete(ModelRequest(messages, tools=(SEARCH,)))
    body = endpoint.bodies()[0]
    tail = body["messages"][-1]["content"][-1]
    assert tail["type"] == "tool_result" and tail["cache_control"] == {"type": "ephemeral"}
    assert len(_marks(body)) == 3


def test_cache_breakpoints_is_checked() -> None:
    from cmdc.errors import ConfigError

    with pytest.raises(ConfigError, match="cache_breakpoints"):
        AnthropicProvider("m", base_url="http://localhost:1", cache_breakpoints="yes")  # type: ignore[arg-type]


# -- the summarizer's usage and compaction on a warm cache -----------------------------------------


class CachingModel:
    """A model that records its requests and reports the prompt's cached prefix: the messages
    it saw in its previous request that this one starts with (1 token per message here)."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> Message:
        previous = self.requests[-1].messages if self.requests else ()
        self.requests.append(request)
        same = 0
        for a, b in zip(previous, request.messages, strict=False):
            if a != b:
                break
            same += 1
        usage = TokenUsage(input_tokens=len(request.messages), output_tokens=5, cache_read_tokens=same)
        return Message.assistant(STRUCTURED, usage=usage, metadata={STOP_REASON_KEY: "stop"})


def _long_state(tmp_path: Path, window: int) -> Any:
    messages = [Message.system("You are terse."), Message.user("the task: fix the parser")]
    for i in range(12):
        messages += [Message.user(f"question {i} " + "q" * 200), Message.assistant(f"answer {i} " + "a" * 200)]
    return make_state(tmp_path, messages, context_window=window, compact_keep=("messages", 2))


async def test_warm_summary_request_is_the_agent_context_plus_the_instruction(tmp_path: Path) -> None:
    model = CachingModel()
    state = _long_state(tmp_path, 100_000)
    set_agent_context(AgentContext(model, (SEARCH,)))
    agent_request = ModelRequest(state.messages, (SEARCH,))
    await model.complete(agent_request)  # the agent's last request: the cache holds it
    result = await Compactor(model).force_compact(state)
    assert isinstance(result, Compacted)
    warm = model.requests[1]
    assert warm.messages[:-1] == state.messages and warm.tools == (SEARCH,)
    last = warm.messages[-1]
    assert last.role == "user" and "summary" in last.text and "message(s) stay in the context verbatim" in last.text
    assert warm.metadata["cmdc.purpose"] == "summarize"
    # the same bytes as the agent's request, as a prefix (what the provider's cache matches)
    sent = orjson.dumps((await OpenAIProvider("m", base_url="http://x/v1").request_body(agent_request))["messages"])
    again = orjson.dumps((await OpenAIProvider("m", base_url="http://x/v1").request_body(warm))["messages"])
    assert again.startswith(sent[:-1])
    report = result.report
    assert report.warm_cache and report.attempts == 1
    assert report.summarizer_input_tokens == len(warm.messages)
    assert report.summarizer_cache_read_tokens == len(state.messages)
    assert report.summarizer_output_tokens == 5


async def test_warm_summary_falls_back_when_it_would_not_fit(tmp_path: Path) -> None:
    model = CachingModel()
    state = _long_state(tmp_path, 1_500)
    assert state.token_usage > 1_500 - 200  # the context plus the instruction and an answer do not fit
    set_agent_context(AgentContext(model, (SEARCH,)))
    events: list[Any] = []
    result = await Compactor(model, on_event=events.append).force_compact(state)
    assert isinstance(result, Compacted) and not result.report.warm_cache
    assert model.requests
    for cold in model.requests:  # today's shape (in chunks: the window is small)
        assert cold.messages[0].role == "system" and len(cold.messages) == 2 and cold.tools == ()
    assert result.report.summarizer_input_tokens == 2 * len(model.requests)
    assert not [e for e in events if e.kind == "summarizer_attempt" and e.data["role"] == "warm"]  # not tried


async def test_an_unusable_warm_answer_is_retried_warm(tmp_path: Path) -> None:
    class Refuses(CachingModel):
        async def complete(self, request: ModelRequest) -> Message:
            reply = await super().complete(request)
            return reply.evolve(content="") if len(self.requests) == 1 else reply

    model = Refuses()
    state = _long_state(tmp_path, 100_000)
    set_agent_context(AgentContext(model, ()))
    result = await Compactor(model, retry_backoff=0).force_compact(state)
    assert isinstance(result, Compacted) and result.report.warm_cache
    assert len(model.requests) == 2 and all(r.messages[:-1] == state.messages for r in model.requests)
    assert result.report.summarizer_input_tokens == 2 * len(model.requests[0].messages)  # both counted
    assert result.report.summarizer_cache_read_tokens == len(model.requests[0].messages)  # the second, whole
    assert result.report.attempts == 2


async def test_warm_attempts_are_the_primarys_then_its_fallbacks(tmp_path: Path) -> None:
    from cmdc.compaction import ExtractiveSummarizer

    class Empty(CachingModel):
        async def complete(self, request: ModelRequest) -> Message:
            return (await super().complete(request)).evolve(content="")

    model = Empty()
    state = _long_state(tmp_path, 100_000)
    set_agent_context(AgentContext(model, ()))
    events: list[Any] = []
    compactor = Compactor(model, retries=1, retry_backoff=0, fallbacks=[ExtractiveSummarizer()], on_event=events.append)
    result = await compactor.force_compact(state)
    assert isinstance(result, Compacted) and result.report.summarizer == "extractive"
    assert not result.report.warm_cache
    assert len(model.requests) == 2  # retries=1: two attempts, both warm; no cold request
    assert all(r.messages[:-1] == state.messages for r in model.requests)
    roles = [e.data["role"] for e in events if e.kind == "summarizer_attempt"]
    assert roles == ["warm", "warm", "failover"]


async def test_a_warm_request_that_overflows_falls_back_to_the_cold_one(tmp_path: Path) -> None:
    from cmdc import ContextOverflow

    class Small(CachingModel):
        async def complete(self, request: ModelRequest) -> Message:
            if request.metadata.get("cmdc.warm_cache"):
                self.requests.append(request)
                raise ContextOverflow("prompt is too long", prompt_tokens=9_000, limit=8_000)
            return await super().complete(request)

    model = Small()
    state = _long_state(tmp_path, 100_000)
    set_agent_context(AgentContext(model, ()))
    result = await Compactor(model, retry_backoff=0).force_compact(state)
    assert isinstance(result, Compacted) and not result.report.warm_cache
    warm, cold = model.requests[0], model.requests[1]
    assert warm.messages[:-1] == state.messages
    assert cold.messages[0].role == "system" and len(cold.messages) == 2
    assert result.report.attempts == 2


async def test_warm_cache_is_opt_in_for_another_summarizer_and_opt_out(tmp_path: Path) -> None:
    agent_model, other = CachingModel(), CachingModel()
    state = _long_state(tmp_path, 100_000)
    set_agent_context(AgentContext(agent_model, ()))
    result = await Compactor(other).force_compact(state)  # not the agent's provider: cold
    assert isinstance(result, Compacted) and not result.report.warm_cache
    assert other.requests[0].messages[0].role == "system" and len(other.requests[0].messages) == 2
    result = await Compactor(other, warm_cache=True).force_compact(state)  # opted in
    assert isinstance(result, Compacted) and result.report.warm_cache
    assert other.requests[1].messages[:-1] == state.messages
    result = await Compactor(agent_model, warm_cache=False).force_compact(state)  # opted out
    assert isinstance(result, Compacted) and not result.report.warm_cache
    assert len(agent_model.requests[0].messages) == 2


async def test_cold_summarizer_usage_is_counted_too(tmp_path: Path) -> None:
    model = CachingModel()
    state = _long_state(tmp_path, 100_000)
    result = await Compactor(model, summarizer_input_tokens=600).force_compact(state)  # no agent: cold, chunks
    assert isinstance(result, Compacted)
    assert len(model.requests) > 1
    assert result.report.summarizer_input_tokens == sum(len(r.messages) for r in model.requests)
    assert result.report.summarizer_output_tokens == 5 * len(model.requests)
    assert result.report.to_dict()["summarizer_input_tokens"] == result.report.summarizer_input_tokens


async def test_cache_figures_reach_events_and_spans(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import cmdc.otel

    exporter = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    model = CachingModel()
    config = {
        "compact_offload_dir": str(tmp_path),
        "compact_keep": ("messages", 2),
        "compact_trigger": ("messages", 8),
        "context_window": 100_000,
    }
    async with cmdc.open_runtime(log_events=False, tracing=cmdc.otel.Tracing(tracer_provider=tracer)) as rt:
        agent = await rt.spawn("a", model, instructions="You are terse.", config=config)
        with rt.subscribe("a", buffer=10_000) as sub:
            for i in range(6):
                await agent.prompt(f"question {i}")
            events = drain(sub)
    responses = [e.data["usage"] for e in events if e.kind == "response"]
    assert responses[0].cache_read_tokens == 0 and responses[1].cache_read_tokens > 0
    reports = [e.data["report"] for e in events if e.kind == "compaction_end"]
    assert reports and all(r.warm_cache for r in reports)
    # the last request is the prefix; its reply, the new question and the instruction are new
    assert [r.summarizer_input_tokens - r.summarizer_cache_read_tokens for r in reports] == [3] * len(reports)
    spans = exporter.get_finished_spans()
    chats = [dict(s.attributes or {}) for s in spans if s.name.startswith("chat ")]
    assert [c.get("gen_ai.usage.cache_read.input_tokens", 0) for c in chats] == [u.cache_read_tokens for u in responses]
    compacts = [dict(s.attributes or {}) for s in spans if s.name == "compact a"]
    assert [c["gen_ai.usage.cache_read.input_tokens"] for c in compacts] == [
        r.summarizer_cache_read_tokens for r in reports
    ]
    assert all(c["cmdc.compaction.warm_cache"] is True for c in compacts)
    turns = [dict(s.attributes or {}) for s in spans if s.name == "invoke_agent a"]
    assert sum(t["gen_ai.usage.cache_read.input_tokens"] for t in turns) == sum(u.cache_read_tokens for u in responses)


async def test_the_demo_table_shows_the_prompt_cache() -> None:
    import io

    from cmdc.cli._demo import DemoOptions, run_demo

    out = io.StringIO()
    options = DemoOptions(agents=1, turns=30, latency=0.0, summarizer="model", display="plain")
    code, stats = await run_demo(options, out=out, progress=io.StringIO())
    assert code == 0
    (s,) = stats
    assert s.reports and all(r.warm_cache for r in s.reports)
    assert 0 < s.cached_tokens < s.prompt_tokens
    text = out.getvalue()
    line = [ln for ln in text.splitlines() if ln.startswith("agent-1 ")][-1]  # the cache table's row
    read = f"{100 * s.cached_tokens / s.prompt_tokens:.0f}%"
    assert f"{s.prompt_tokens:,}" in line and read in line and f"{len(s.reports)}/{len(s.reports)}" in line
    assert max(len(ln) for ln in text.splitlines()) <= 80
