"""A reply cut off by the full context window is not a final answer: the agent keeps the piece,
compacts, asks the model to continue (a `continued` event), and returns the whole answer. A
reply that stopped on its own output limit, below the window, is returned as it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cmdc
from cmdc import ConfigError, Message, TokenUsage
from cmdc.agent import CONTINUE_KIND, CONTINUED_FROM_KEY, AgentOptions
from cmdc.events import COMPACTION_END, CONTINUED, Event
from cmdc.message import KIND_KEY
from cmdc.providers import ScriptedProvider
from cmdc.providers.base import CONTEXT_EXCEEDED_KEY, STOP_REASON_KEY
from cmdc.testing import drain

WINDOW = 4_000


def cut(text: str, stop: str = "length", total: int = WINDOW, **extra: Any) -> Message:
    usage = TokenUsage(input_tokens=total - 50, output_tokens=50, total_tokens=total)
    return Message.assistant(text, usage=usage, metadata={STOP_REASON_KEY: stop, **extra})


def done(text: str) -> Message:
    usage = TokenUsage(input_tokens=300, output_tokens=20)
    return Message.assistant(text, usage=usage, metadata={STOP_REASON_KEY: "stop"})


def config(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {
        "compact_trigger": ("tokens", 100_000),
        "compact_keep": ("messages", 2),
        "context_window": WINDOW,
        "compact_offload_dir": str(tmp_path),
        **more,
    }


async def run(
    tmp_path: Path, script: list[Any], cfg: dict[str, Any] | None = None, **options: Any
) -> tuple[Message, cmdc.State, list[Event], ScriptedProvider]:
    model = ScriptedProvider(script)
    async with cmdc.open_runtime(log_events=False) as rt:
        with rt.subscribe("a1", buffer=1_000) as sub:
            agent = await rt.spawn(
                "a1", model, summarizer=cmdc.ExtractiveSummarizer(), config=cfg or config(tmp_path), **options
            )
            for i in range(3):  # some history for the compaction to evict, larger than a summary
                words = " ".join(f"detail{i}-{j}" for j in range(300))
                await agent.send([Message.user(f"earlier question {i}: {words}"), Message.assistant(f"answer {words}")])
            reply = await agent.prompt("explain the deployment")
            state = await agent.state()
            events = drain(sub)
    return reply, state, events, model


async def test_a_reply_cut_by_the_window_is_compacted_and_continued(tmp_path: Path) -> None:
    reply, state, events, model = await run(tmp_path, [cut("First half, "), done("second half.")])
    assert reply.text == "First half, second half."
    _, second = model.requests
    assert second.messages[-1].metadata[KIND_KEY] == CONTINUE_KIND
    assert second.messages[-2].text == "First half, "  # the piece is kept, right before the request
    assert any(m.is_summary for m in second.messages)  # compacted before continuing
    [continued] = [e for e in events if e.kind == CONTINUED]
    assert dict(continued.data) == {"stop_reason": "length", "tokens": WINDOW, "window": WINDOW, "continuation": 1}
    assert [e.data["report"].reason for e in events if e.kind == COMPACTION_END] == ["forced"]
    # The state holds each piece and the request to continue; the reply names the pieces.
    texts = [m.text for m in state.messages[-3:]]
    assert texts[0] == "First half, " and texts[2] == "second half."
    assert reply.metadata[CONTINUED_FROM_KEY] == (state.messages[-3].id,)


@pytest.mark.parametrize("stop", ["length", "max_tokens"])
async def test_a_reply_at_its_output_limit_below_the_window_is_final(tmp_path: Path, stop: str) -> None:
    reply, _, events, model = await run(tmp_path, [cut("Short on purpose", stop=stop, total=900)])
    assert reply.text == "Short on purpose"
    assert len(model.requests) == 1
    assert not [e for e in events if e.kind in (CONTINUED, COMPACTION_END)]


async def test_the_providers_own_mark_counts_without_figures(tmp_path: Path) -> None:
    piece = Message.assistant(
        "Cut ", metadata={STOP_REASON_KEY: "model_context_window_exceeded", CONTEXT_EXCEEDED_KEY: True}
    )
    reply, _, events, _ = await run(tmp_path, [piece, done("short.")])
    assert reply.text == "Cut short."
    assert [e.data["stop_reason"] for e in events if e.kind == CONTINUED] == ["model_context_window_exceeded"]


async def test_the_window_reported_by_an_overflow_is_used_when_none_is_configured(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    del cfg["context_window"]
    script: list[Any] = [
        cmdc.ContextOverflow("too long", prompt_tokens=5_000, limit=WINDOW),
        cut("Part one; ", total=WINDOW - 3),
        done("part two."),
    ]
    reply, _, events, _ = await run(tmp_path, script, cfg)
    assert reply.text == "Part one; part two."
    assert [e.data["window"] for e in events if e.kind == CONTINUED] == [WINDOW]


async def test_continuations_are_bounded(tmp_path: Path) -> None:
    reply, _, events, model = await run(tmp_path, [cut("a "), cut("b "), cut("c ")], max_continuations=2)
    assert reply.text == "a b c "  # the last piece is returned as it is, with what came before
    assert len(model.requests) == 3
    assert [e.data["continuation"] for e in events if e.kind == CONTINUED] == [1, 2]
    assert len(reply.metadata[CONTINUED_FROM_KEY]) == 2


async def test_no_continuation_when_switched_off(tmp_path: Path) -> None:
    reply, _, events, model = await run(tmp_path, [cut("half")], max_continuations=0)
    assert reply.text == "half" and len(model.requests) == 1
    assert not [e for e in events if e.kind == CONTINUED]


async def test_a_cut_reply_with_tool_calls_runs_its_tools_and_compacts_next(tmp_path: Path) -> None:
    @cmdc.tool
    async def look(path: str) -> str:
        """Look at a file."""
        return "contents"

    call = Message.assistant(
        "",
        tool_calls=(cmdc.ToolCall(id="c1", name="look", arguments={"path": "a"}),),
        usage=TokenUsage(input_tokens=WINDOW - 50, output_tokens=50),
        metadata={STOP_REASON_KEY: "length"},
    )
    reply, _, events, model = await run(tmp_path, [call, done("the file says contents")], tools=[look])
    assert reply.text == "the file says contents"
    assert not [e for e in events if e.kind == CONTINUED]
    assert model.requests[1].messages[-1].role == "tool"
    assert [e.data["report"].reason for e in events if e.kind == COMPACTION_END] == ["forced"]


def test_max_continuations_is_checked() -> None:
    with pytest.raises(ConfigError, match="max_continuations"):
        AgentOptions(max_continuations=-1)
    with pytest.raises(ConfigError, match="max_continuations"):
        AgentOptions(max_continuations=True)  # type: ignore[arg-type]
