"""The fake providers: `ScriptedProvider` (replays a script) and `SimulatedModel` (a plausible model)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

from cmdc import (
    Compacted,
    Compactor,
    ConfigError,
    ContextOverflow,
    Message,
    ProviderError,
    State,
    TokenUsage,
    estimate_message_tokens,
    estimate_tokens_from_messages,
)
from cmdc.compaction.ledger import without_ledger
from cmdc.providers import ModelRequest, Provider, ScriptedProvider, SimulatedModel, ToolSchema
from cmdc.providers.simulated import tool_schema_tokens
from cmdc.testing import conversation
from cmdc.tokens import estimate_text_tokens
from cmdc.tools import validate_arguments


def request(*texts: str, **kwargs: Any) -> ModelRequest:
    return ModelRequest(messages=[Message.system("be brief"), *(Message.user(t) for t in texts)], **kwargs)


# -- ScriptedProvider -----------------------------------------------------------------------------


async def test_scripted_replays_messages_and_text_with_usage() -> None:
    reported = Message.assistant("as is", usage=TokenUsage(input_tokens=7, output_tokens=3))
    bare = Message.assistant("no usage")
    p = ScriptedProvider([reported, bare, "plain text"])
    assert isinstance(p, Provider)
    r1, r2, r3 = request("one"), request("two", "three"), request("four")

    assert await p.complete(r1) is reported
    second = await p.complete(r2)
    assert second.id == bare.id and second.text == "no usage"
    assert second.usage == TokenUsage(
        input_tokens=estimate_tokens_from_messages(r2.messages), output_tokens=estimate_message_tokens(bare)
    )
    third = await p.complete(r3)
    assert third.role == "assistant" and third.text == "plain text"
    assert third.usage is not None
    assert third.usage.input_tokens == estimate_tokens_from_messages(r3.messages)
    assert third.usage.output_tokens == estimate_message_tokens(third)
    assert p.requests == [r1, r2, r3]


async def test_scripted_raises_exception_instances_and_classes() -> None:
    overflow = ContextOverflow("too long", prompt_tokens=10, limit=5)
    p = ScriptedProvider([overflow, ProviderError, "after"])
    with pytest.raises(ContextOverflow) as info:
        await p.complete(request("a"))
    assert info.value is overflow
    with pytest.raises(ProviderError):
        await p.complete(request("b"))
    assert (await p.complete(request("c"))).text == "after"
    assert len(p.requests) == 3  # recorded before acting, failures included


async def test_scripted_callables_sync_and_async() -> None:
    def sync(req: ModelRequest) -> str:
        return f"seen {len(req.messages)}"

    async def later(req: ModelRequest) -> Message:
        await trio.lowlevel.checkpoint()
        return Message.assistant(req.messages[-1].text.upper())

    p = ScriptedProvider([sync, later])
    first = await p.complete(request("x", "y"))
    assert first.text == "seen 3" and first.usage is not None
    second = await p.complete(request("hello"))
    assert second.text == "HELLO" and second.usage is not None


async def test_scripted_exhausted() -> None:
    p = ScriptedProvider(["a", "b"], name="mine")
    await p.complete(request("1"))
    await p.complete(request("2"))
    with pytest.raises(ProviderError, match=r"^scripted provider mine: script exhausted after 2 replies$"):
        await p.complete(request("3"))
    with pytest.raises(ProviderError, match="exhausted after 0 replies"):
        await ScriptedProvider([], cycle=True).complete(request("x"))


async def test_scripted_cycle() -> None:
    p = ScriptedProvider(["a", "b"], cycle=True)
    texts = [(await p.complete(request(str(i)))).text for i in range(5)]
    assert texts == ["a", "b", "a", "b", "a"]


async def test_scripted_rejects_non_assistant_replies() -> None:
    script: list[Any] = [Message.user("not mine"), lambda req: 42, object()]
    p = ScriptedProvider(script)
    with pytest.raises(ProviderError, match=r"reply 1 is a 'user' message"):
        await p.complete(request("a"))
    with pytest.raises(ProviderError, match=r"reply 2 is a int \(42\)"):
        await p.complete(request("b"))
    with pytest.raises(ProviderError, match=r"reply 3 is a object"):
        await p.complete(request("c"))


def test_scripted_tool_call_helper() -> None:
    a = ScriptedProvider.tool_call("search", {"q": "trio"})
    b = ScriptedProvider.tool_call("read", {"path": "x"}, text="reading")
    c = ScriptedProvider.tool_call("read", {}, id="mine")
    assert a.role == "assistant" and a.text == "" and b.text == "reading"
    (call_a,), (call_b,), (call_c,) = a.tool_calls, b.tool_calls, c.tool_calls
    assert (call_a.name, dict(call_a.arguments)) == ("search", {"q": "trio"})
    assert re.fullmatch(r"call_\d+", call_a.id) and re.fullmatch(r"call_\d+", call_b.id)
    assert call_a.id != call_b.id
    assert call_c.id == "mine"


async def test_scripted_delay(autojump_clock: trio.abc.Clock) -> None:
    p = ScriptedProvider(["late", "next"], delay=5.0)
    start = trio.current_time()
    assert (await p.complete(request("a"))).text == "late"
    assert trio.current_time() - start == pytest.approx(5.0)
    with trio.move_on_after(1.0) as scope:
        await p.complete(request("b"))
    assert scope.cancelled_caught
    assert (await p.complete(request("c"))).text == "next"  # a cancelled request used no reply


@pytest.mark.parametrize("kwargs", [{"delay": -1}, {"delay": float("nan")}, {"name": ""}])
def test_scripted_config_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ScriptedProvider([], **kwargs)


# -- SimulatedModel -------------------------------------------------------------------------------

TOOLS = (
    ToolSchema(
        "read_file",
        "Read a file.",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
    ),
    ToolSchema(
        "search",
        "Search the code.",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "mode": {"enum": ["fast", "deep"]},
                "max": {"type": "number"},
                "exact": {"type": "boolean"},
                "paths": {"type": "array", "items": {"type": "string"}},
                "options": {"type": "object"},
            },
            "required": ["query", "mode", "max", "exact", "paths", "options"],
        },
    ),
)


async def test_simulated_overflow_reports_both_figures() -> None:
    model = SimulatedModel(context_window=50)
    req = request("word " * 200)
    with pytest.raises(ContextOverflow, match=r"prompt is too long: \d+ tokens > 50 maximum") as info:
        await model.complete(req)
    assert info.value.prompt_tokens == estimate_tokens_from_messages(req.messages)
    assert info.value.limit == 50
    assert (model.calls, model.overflows) == (1, 1)


async def test_simulated_overflow_counts_max_output_tokens() -> None:
    req = request("hello")
    prompt = estimate_tokens_from_messages(req.messages)
    model = SimulatedModel(context_window=prompt + 10)
    await model.complete(req)  # fits
    big = ModelRequest(req.messages, max_output_tokens=11)
    with pytest.raises(ContextOverflow) as info:
        await model.complete(big)
    assert (info.value.prompt_tokens, info.value.limit) == (prompt, prompt + 10)
    assert f"{prompt} + 11 > {prompt + 10}" in str(info.value)
    assert (model.calls, model.overflows) == (2, 1)


async def test_simulated_tools_count_in_the_prompt() -> None:
    req = request("hello", tools=TOOLS)
    model = SimulatedModel(tool_probability=0.0)
    reply = await model.complete(req)
    expected = estimate_tokens_from_messages(req.messages) + sum(tool_schema_tokens(t) for t in TOOLS)
    assert reply.usage == TokenUsage(input_tokens=expected, output_tokens=estimate_message_tokens(reply))
    with pytest.raises(ContextOverflow) as info:
        await SimulatedModel(context_window=expected - 1).complete(req)
    assert info.value.prompt_tokens == expected


async def run_turns(model: SimulatedModel, prompts: list[str], tools: tuple[ToolSchema, ...]) -> list[Message]:
    """Drive `model` like an agent's turn loop; return every reply."""
    messages: list[Message] = [Message.system("You are a test.")]
    replies: list[Message] = []
    for text in prompts:
        messages.append(Message.user(text))
        for _ in range(10):
            reply = await model.complete(ModelRequest(messages, tools=tools))
            replies.append(reply)
            messages.append(reply)
            if not reply.tool_calls:
                break
            messages.extend(Message.tool_result(c.id, f"result of {c.name}") for c in reply.tool_calls)
    return replies


def fingerprint(replies: list[Message]) -> list[tuple[str, list[tuple[str, str, dict[str, Any]]]]]:
    return [(r.text, [(c.id, c.name, c.to_dict()["arguments"]) for c in r.tool_calls]) for r in replies]


async def test_simulated_is_deterministic() -> None:
    prompts = [f"please look at module {i} and fix it" for i in range(6)]
    a = await run_turns(SimulatedModel(seed=7), prompts, TOOLS)
    b = await run_turns(SimulatedModel(seed=7), prompts, TOOLS)
    assert fingerprint(a) == fingerprint(b)
    assert any(r.tool_calls for r in a) and any(not r.tool_calls for r in a)
    c = await run_turns(SimulatedModel(seed=8), prompts, TOOLS)
    assert fingerprint(a) != fingerprint(c)


async def test_simulated_calls_tools_with_schema_arguments() -> None:
    model = SimulatedModel(tool_probability=1.0, seed=3)
    for _ in range(10):
        reply = await model.complete(request("go", tools=TOOLS))
        assert 1 <= len(reply.tool_calls) <= 2
        for call in reply.tool_calls:
            args = call.to_dict()["arguments"]
            schema = next(t.parameters for t in TOOLS if t.name == call.name)
            assert validate_arguments(schema, args) == args  # valid for the tool's schema
            if call.name == "read_file":
                assert isinstance(args["path"], str) and args["path"]


async def test_simulated_call_ids_count_up() -> None:
    model = SimulatedModel(tool_probability=1.0)
    ids = [c.id for _ in range(4) for c in (await model.complete(request("go", tools=TOOLS))).tool_calls]
    assert ids == [f"sim_{n}" for n in range(1, len(ids) + 1)]


@pytest.mark.parametrize("rounds", [0, 1, 3])
async def test_simulated_bounds_consecutive_tool_rounds(rounds: int) -> None:
    model = SimulatedModel(tool_probability=1.0, max_tool_rounds=rounds)
    many = tuple(ToolSchema(f"tool{i}", "A tool.", {"type": "object", "properties": {}}) for i in range(6))
    replies = await run_turns(model, ["first task", "second task"], many)
    tool_replies = [r for r in replies if r.tool_calls]
    assert len(tool_replies) == 2 * rounds
    for turn in (replies[: rounds + 1], replies[rounds + 1 :]):  # no tool is called twice in a turn
        names = [c.name for r in turn for c in r.tool_calls]
        assert len(names) == len(set(names))
    assert len(replies) == 2 * (rounds + 1)
    assert not replies[-1].tool_calls


async def test_simulated_without_tools_answers_in_text() -> None:
    model = SimulatedModel(tool_probability=1.0, reply_chars=200)
    reply = await model.complete(request("first question", "Refactor the parser module today please"))
    assert not reply.tool_calls
    assert "Refactor the parser module today please" in reply.text
    assert 150 <= len(reply.text) <= 300


async def test_simulated_usage_is_the_prompt_estimate() -> None:
    model = SimulatedModel()
    req = request("a question", "and another one")
    reply = await model.complete(req)
    assert reply.usage is not None
    assert reply.usage.input_tokens == estimate_tokens_from_messages(req.messages)
    assert reply.usage.output_tokens == estimate_message_tokens(reply)
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens


async def test_simulated_summarizes_briefly() -> None:
    text = "\n".join(f"line {i}: " + "words " * 40 for i in range(300))
    req = ModelRequest(
        [Message.system("summarize this"), Message.user(text)],
        tools=TOOLS,
        metadata={"cmdc.purpose": "summarize"},
    )
    model = SimulatedModel(context_window=100_000, summary_chars=500, tool_probability=1.0)
    reply = await model.complete(req)
    assert not reply.tool_calls
    assert 0 < len(reply.text) <= 500
    assert "line 0:" in reply.text and "line 299:" in reply.text
    assert "summarize this" not in reply.text
    again = await SimulatedModel(context_window=100_000, summary_chars=500).complete(req)
    assert again.text == reply.text


async def test_simulated_latency(autojump_clock: trio.abc.Clock) -> None:
    model = SimulatedModel(latency=2.5)
    start = trio.current_time()
    await model.complete(request("hi"))
    assert trio.current_time() - start == pytest.approx(2.5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"context_window": 0},
        {"context_window": 1.5},
        {"context_window": True},
        {"seed": "x"},
        {"reply_chars": 0},
        {"tool_probability": -0.1},
        {"tool_probability": 1.5},
        {"max_tool_rounds": -1},
        {"summary_chars": 0},
        {"latency": -1},
        {"name": ""},
    ],
)
def test_simulated_config_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        SimulatedModel(**kwargs)


# -- with the Compactor ---------------------------------------------------------------------------


def big_state(tmp_path: Path) -> State:
    config = {"compact_offload_dir": str(tmp_path), "compact_keep": ("messages", 5)}
    return State(agent_id="a1", messages=conversation(200), config=config)


async def test_compactor_summarizes_with_the_simulated_model(tmp_path: Path) -> None:
    state = big_state(tmp_path)
    model = SimulatedModel(context_window=200_000, summary_chars=1_200)
    result = await Compactor(model, user_message_budget=100).force_compact(state)  # the model's text only
    assert isinstance(result, Compacted)
    report = result.report
    assert report.summarizer == "simulated" and report.attempts == 1
    assert report.evicted > 150
    # the model's text (the session ledger's sections, filled without the model, come beside it)
    summary = next(m for m in result.state.messages if m.is_summary)
    assert estimate_text_tokens(without_ledger(summary.text)) < 500
    assert report.tokens_after < report.tokens_before / 4  # /10 before the session ledger (~2.6k tokens here)
    assert result.state.messages[2].is_summary  # the system message, the pinned task, the summary
    assert model.calls == 1 and model.overflows == 0


async def test_compactor_falls_back_to_chunks_on_overflow(tmp_path: Path) -> None:
    state = big_state(tmp_path)
    model = SimulatedModel(context_window=3_000)
    assert estimate_tokens_from_messages(state.messages) > 5 * model.context_window
    compactor = Compactor(model, retries=8, retry_backoff=0, summarizer_input_tokens=None, user_message_budget=100)
    result = await compactor.force_compact(state)
    assert isinstance(result, Compacted)
    assert model.overflows >= 1
    assert result.report.attempts == model.overflows + 1
    assert model.calls > result.report.attempts  # the last attempt went in several chunks
    summary = next(m for m in result.state.messages if m.is_summary)
    assert estimate_text_tokens(without_ledger(summary.text)) < 500  # the ledger's sections aside
