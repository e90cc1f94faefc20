"""What survives compaction: preserved user messages, pins, finalizers, reduction, the check
after compacting, clipping the tail on overflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes import Recorder, make_state, res

from benchmarks.retention import CONSTRAINTS, run_session, table
from cmdc import (
    Compacted,
    CompactionError,
    Compactor,
    Event,
    Message,
    OffloadStore,
    ToolCall,
    open_runtime,
    tool,
)
from cmdc.compaction.finalize import (
    USER_MESSAGES_KEY,
    FinalizeContext,
    default_finalize,
    default_summary,
    finalizer,
    preserve_skills,
)
from cmdc.errors import CompactionIncomplete
from cmdc.message import PINNED_KEY
from cmdc.providers import ScriptedProvider, SimulatedModel
from cmdc.synthetic import conversation

SECTIONS = "## All user messages\n- (filled by cmdc)\n## Current work\nediting"
"""A summary with the sections cmdc fills in."""


async def test_retention_probes(tmp_path: Path) -> None:
    checks = await run_session(str(tmp_path))
    assert len(checks) >= 5, table(checks)
    assert all(c.ok for c in checks), table(checks)
    assert any(c.pending for c in checks)  # a compaction happened with a call waiting for its result
    assert checks[-1].users[1] >= 1 + len(CONSTRAINTS)


async def test_user_messages_are_carried_forward_newest_first_within_budget(tmp_path: Path) -> None:
    compactor = Compactor(Recorder(SECTIONS), user_message_budget=160, pin_task=False)
    msgs = [Message.user(f"user message number {i} " + "x" * 200) for i in range(6)] + [Message.assistant("a")]
    first = await compactor.force_compact(make_state(tmp_path, msgs, compact_keep=("messages", 1)))
    assert isinstance(first, Compacted)
    summary = first.state.messages[0]
    kept = summary.metadata[USER_MESSAGES_KEY]
    assert kept[-1].startswith("user message number 5")  # newest first within the budget
    assert len(kept) == 3 and kept[0].startswith("user message number 3")
    assert "bytes clipped" in kept[0]  # the one that did not fit: head and tail
    assert all(f"user message number {i}" not in summary.text for i in range(3))
    # at the second compaction, the earlier ones come from the previous summary, not lost
    more = first.state.append(Message.user("a later question"), Message.assistant("b"))
    second = await Compactor(Recorder(SECTIONS), user_message_budget=1_000, pin_task=False).force_compact(
        more.evolve(config={**more.config, "compact_keep": ("messages", 1)})
    )
    assert isinstance(second, Compacted)
    carried = second.state.messages[0].metadata[USER_MESSAGES_KEY]
    assert carried[-1] == "a later question" and carried[: len(kept)] == tuple(kept)


async def test_user_message_filter_and_scratchpad(tmp_path: Path) -> None:
    answer = "<analysis>thinking out loud</analysis>\n## All user messages\n- paraphrased\n## Next step\nship"
    compactor = Compactor(Recorder(answer), user_message_filter=lambda m: "secret" not in m.text, pin_task=False)
    msgs = [
        Message.user("keep this"),
        Message.assistant("a long answer " * 60),  # what the summary compresses
        Message.user("a secret token"),
        Message.user("last"),
        Message.assistant("a"),
    ]
    result = await compactor.force_compact(make_state(tmp_path, msgs, compact_keep=("messages", 1)))
    assert isinstance(result, Compacted)
    text = result.state.messages[0].text
    assert "thinking out loud" not in text and "paraphrased" not in text
    assert "- keep this" in text and "- last" in text and "secret" not in text and "## Next step" in text


async def test_the_task_stays_verbatim_and_pins_have_a_budget(tmp_path: Path) -> None:
    task = Message.user("THE TASK: build the thing")
    pins = [Message.user(f"pinned fact {i} " + "p" * 400, metadata={PINNED_KEY: True}) for i in range(3)]
    msgs = [task, *[m for p in pins for m in (p, Message.assistant("ok"))], Message.user("now"), Message.assistant("x")]
    events: list[Event] = []
    compactor = Compactor(Recorder(SECTIONS), pin_budget=150, on_event=events.append)
    result = await compactor.force_compact(make_state(tmp_path, msgs, compact_keep=("messages", 1)))
    assert isinstance(result, Compacted)
    ids = {m.id for m in result.state.messages}
    assert task.id in ids  # the task survives verbatim
    assert pins[0].id not in ids and pins[1].id not in ids and pins[2].id in ids  # oldest pins go first
    over = [e for e in events if e.kind == "pins_over_budget"]
    assert over and over[0].data["unpinned"] == (pins[0].id, pins[1].id)
    offloaded = {m.id for m in await OffloadStore(tmp_path).read("a1")}
    assert {pins[0].id, pins[1].id} <= offloaded  # summarized, never silently dropped


async def test_finalizers(tmp_path: Path) -> None:
    @tool
    async def skill(name: str) -> str:
        """Load a skill."""
        return f"SKILL {name}"

    skill_calls = [
        m
        for i in range(7)
        for m in (
            Message.assistant("", tool_calls=(ToolCall(id=f"s{i}", name="skill", arguments={"name": f"k{i}"}),)),
            Message.tool_result(f"s{i}", f"skill body {i} " + "b" * (30_000 if i == 6 else 100)),
        )
    ]
    msgs = [Message.user("task"), *skill_calls, Message.user("go on"), Message.assistant("x")]
    custom = finalizer(default_summary, preserve_skills(max_skills=5, max_tokens=5_000, max_total=25_000))
    result = await Compactor(Recorder(SECTIONS), finalize=custom, pin_task=False).force_compact(
        make_state(tmp_path, msgs, compact_keep=("messages", 1))
    )
    assert isinstance(result, Compacted)
    summary, *skills, last = result.state.messages
    assert summary.is_summary and last.text == "x"
    assert [s.metadata["cmdc.skill_call"] for s in skills] == ["s2", "s3", "s4", "s5", "s6"]  # 5, newest first
    assert all(len(s.text) < 5_000 * 4 + 200 for s in skills)  # each clipped to its budget

    seen: list[FinalizeContext] = []

    async def wrap(ctx: FinalizeContext) -> list[Message]:
        seen.append(ctx)
        return [*default_finalize(ctx), Message.user("and a reminder")]  # the default, reused

    result = await Compactor(Recorder(SECTIONS), finalize=wrap, pin_task=False).force_compact(
        make_state(tmp_path / "b", msgs, compact_keep=("messages", 1))
    )
    assert isinstance(result, Compacted)
    assert result.state.messages[0].is_summary and result.state.messages[1].text == "and a reminder"
    assert seen[0].compaction == 1 and seen[0].offload_path.endswith("a1.jsonl")

    def broken(ctx: FinalizeContext) -> list[Message]:
        raise ValueError("bad finalizer")

    state = make_state(tmp_path / "c", msgs, compact_keep=("messages", 1))
    with pytest.raises(CompactionError, match="bad finalizer"):
        await Compactor(Recorder(SECTIONS), finalize=broken).force_compact(state)


async def test_large_tool_results_are_clipped_for_the_summarizer_only(tmp_path: Path) -> None:
    big = "z" * 40_000
    msgs = [
        Message.user("u"),
        Message.assistant("", tool_calls=(ToolCall(id="w", name="write_file", arguments={"body": big}),)),
        res("w", big),
        Message.user("next"),
        Message.assistant("done"),
    ]
    summarizer = Recorder(SECTIONS)
    result = await Compactor(summarizer, reduce_tokens=500).force_compact(
        make_state(tmp_path, msgs, compact_keep=("messages", 1))
    )
    assert isinstance(result, Compacted)
    seen = {m.id: m for m in summarizer.calls[0][0]}
    assert "more bytes clipped" in seen[msgs[2].id].text and len(seen[msgs[2].id].text) < 3_000
    assert "more bytes clipped" in seen[msgs[1].id].tool_calls[0].arguments["body"]
    journal = {m.id: m for m in await OffloadStore(tmp_path).read("a1")}
    assert journal[msgs[2].id].text == big and journal[msgs[1].id].tool_calls[0].arguments["body"] == big


async def test_the_check_after_compacting_ends(tmp_path: Path) -> None:
    msgs = [m for i in range(120) for m in (Message.user(f"q{i} " + "y" * 400), Message.assistant("a"))]
    config = {"compact_trigger": ("tokens", 2_000), "compact_keep": ("messages", 160)}
    summarizer = Recorder(SECTIONS)
    with pytest.raises(CompactionIncomplete) as info:
        await Compactor(summarizer, pin_task=False).maybe_compact(make_state(tmp_path, msgs, **config))
    assert len(summarizer.calls) == 3  # the first pass and at most two more
    assert info.value.report.passes == 3 and info.value.state.compactions == 3
    assert "still over" in str(info.value)
    # a keep rule that is only a little too generous: the second pass is enough
    ok = await Compactor(Recorder(SECTIONS), pin_task=False).maybe_compact(
        make_state(tmp_path / "b", msgs, compact_trigger=("tokens", 8_000), compact_keep=("messages", 160))
    )
    assert isinstance(ok, Compacted) and ok.report.passes == 2
    # the first pass evicts 80, the second 81: the first summary and 80 more
    assert ok.report.messages_before == 240 and ok.report.evicted == 80 + 81
    assert ok.report.messages_after == 1 + 80 and ok.state.compactions == 2


async def test_every_summarizer_input_after_the_first_holds_the_previous_summary(tmp_path: Path) -> None:
    summarizer = Recorder(SECTIONS)
    compactor = Compactor(summarizer)
    state = make_state(tmp_path, conversation(30), compact_keep=("messages", 4))
    for round_no in range(4):
        result = await compactor.force_compact(state)
        assert isinstance(result, Compacted)
        state = result.state.append(*conversation(20, seed=round_no + 1, system=False))
    for messages, _ in summarizer.calls[1:]:
        assert messages[0].is_summary


async def test_an_agent_clips_a_huge_tail_and_retries_once(tmp_path: Path) -> None:
    @tool
    async def dump() -> str:
        """Return a huge log."""
        return "log line\n" * 20_000

    async def plan(request: Any) -> Message:
        last = request.messages[-1]
        if last.role == "user":
            return Message.assistant("", tool_calls=(ToolCall(id="d1", name="dump"),))
        return Message.assistant(f"the log was {len(last.text)} characters")

    model = SimulatedModel(context_window=8_000)

    class Sized(ScriptedProvider):
        async def complete(self, request: Any) -> Message:  # a window like a real model's
            if model.prompt_tokens(request) > 8_000:
                return await model.complete(request)  # raises ContextOverflow with the figures
            return await super().complete(request)

    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            "clip",
            Sized([plan], cycle=True),
            tools=[dump],
            config={"compact_offload_dir": str(tmp_path), "tool_result_limit": None},
        )
        reply = await agent.prompt("dump the log")
        assert reply.text.startswith("the log was") and int(reply.text.split()[-2]) < 20_000
        state = await agent.state()
        result = next(m for m in state.messages if m.role == "tool")
        assert "clipped to fit the context" in result.text and result.metadata["cmdc.clipped_from"]
        full = {m.id: m for m in await OffloadStore(tmp_path).read("clip")}
        assert full[result.metadata["cmdc.clipped_from"]].text == "log line\n" * 20_000
