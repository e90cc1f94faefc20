"""The issue's agent-level cases: each ends with the agent still serving turns. Also the bound
on messages queued with send(), and what a failed turn does with them."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import cmdc
from cmdc import ContextOverflow, ImagePart, MailboxFull, Message, ProviderError, State, TextPart, open_runtime
from cmdc.checkpoint import CheckpointStore
from cmdc.message import KIND_KEY, SUMMARY_KIND
from cmdc.providers import ModelRequest, ScriptedProvider, SimulatedModel
from cmdc.tokens import estimate_tokens_from_messages

PNG = base64.b64encode(bytes(range(256)) * 1_200).decode()  # ~400 KB of base64


def cfg(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"compact_offload_dir": str(tmp_path / "journal"), **extra}


def summaries(state: State) -> list[Message]:
    return [m for m in state.messages if m.is_summary]


async def test_an_image_on_a_32k_window_compacts_and_keeps_serving(tmp_path: Path) -> None:
    model = SimulatedModel(context_window=32_000, tool_probability=0.0)
    config = cfg(tmp_path, compact_trigger=("tokens", 8_000))
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("img", model, config=config)
        for turn in range(40):
            parts = (TextPart(f"turn {turn}: what is in this screenshot? " + "context " * 100),)
            if turn % 5 == 0:
                parts += (ImagePart(f"data:image/png;base64,{PNG}", "image/png"),)
            await agent.prompt(list((Message.user(parts),)))
        state = await agent.state()
        assert state.compactions >= 2
        assert all(PNG[:64] not in m.text for m in summaries(state))
        assert (await agent.prompt("still there?")).role == "assistant"


async def test_queued_sends_on_an_8k_window_never_doom_the_agent(tmp_path: Path) -> None:
    model = SimulatedModel(context_window=8_000, tool_probability=0.0)
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("q", model, config=cfg(tmp_path))  # default trigger: far above the window
        for round_ in range(6):
            for i in range(12):
                await agent.send(f"note {round_}.{i}: " + "observation " * 60)  # ~200 tokens each
            reply = await agent.prompt(f"round {round_}: summarize the notes")
            assert reply.role == "assistant"
        state = await agent.state()
        assert state.compactions >= 1
        for s in summaries(state):
            assert estimate_tokens_from_messages([s]) <= 8_000 // 4


async def test_a_10_mb_summarizer_answer_is_bounded_and_the_agent_keeps_serving(tmp_path: Path) -> None:
    async def flood(messages: Sequence[Message], instruction: str) -> str:
        return "## Current work\n" + "blah " * 2_000_000

    model = SimulatedModel(context_window=16_000, tool_probability=0.0)
    config = cfg(tmp_path, compact_trigger=("tokens", 6_000))
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("f", model, config=config, summarizer=flood)
        for turn in range(20):
            await agent.prompt(f"turn {turn}: " + "words " * 150)
        state = await agent.state()
        assert state.compactions >= 1 and state.token_usage < 16_000
        for s in summaries(state):
            assert estimate_tokens_from_messages([s]) <= 1_500  # a quarter of the trigger


async def test_an_overflow_is_retried_with_a_strictly_smaller_request(tmp_path: Path) -> None:
    sizes: list[int] = []

    class Tight:
        """Overflows past 6,000 tokens, saying so; otherwise answers briefly."""

        async def complete(self, request: ModelRequest) -> Message:
            size = estimate_tokens_from_messages(request.messages)
            if request.metadata.get("cmdc.purpose") == "summarize":
                return Message.assistant("## Current work\nthe notes so far")
            sizes.append(size)
            if size > 6_000:
                raise ContextOverflow(prompt_tokens=size, limit=6_000)
            return Message.assistant("ok", usage=cmdc.TokenUsage(input_tokens=size, output_tokens=1))

    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("o", Tight(), config=cfg(tmp_path))
        overflowed = 0
        for turn in range(30):
            await agent.prompt(f"turn {turn}: " + "long notes " * 150)
        for before, after in itertools.pairwise(sizes):
            if before > 6_000:  # the retry after an overflow
                overflowed += 1
                assert after < before and after <= 6_000 * 3 // 4
        assert overflowed >= 1
        assert (await agent.prompt("and now?")).text == "ok"


async def test_a_summary_that_alone_overflows_is_shrunk_and_the_agent_serves(tmp_path: Path) -> None:
    huge = Message.user(
        "[Conversation summary #1] earlier\n\n" + "an old summary line\n" * 8_000, metadata={KIND_KEY: SUMMARY_KIND}
    )
    state = State(agent_id="s", messages=(huge, Message.user("next"), Message.assistant("ok")), compactions=1)
    await CheckpointStore(tmp_path / "ckpt").save(state)
    model = SimulatedModel(context_window=8_000, tool_probability=0.0)
    async with open_runtime(log_events=False, checkpoint_dir=tmp_path / "ckpt") as rt:
        agent = await rt.spawn("s", model, config=cfg(tmp_path), resume="require")
        reply = await agent.prompt("carry on")
        assert reply.role == "assistant"
        state = await agent.state()
        assert state.compactions >= 2 and state.token_usage < 8_000
        assert (await agent.prompt("again")).role == "assistant"


# -- the queue -----------------------------------------------------------------------------------


async def test_sends_are_bounded_inspectable_and_clearable(tmp_path: Path) -> None:
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("b", ScriptedProvider(["done"]), config=cfg(tmp_path), max_queued=3)
        agent.send_nowait("one")
        await agent.send(["two", "three"] and [Message.user("two"), Message.user("three")])
        with pytest.raises(MailboxFull, match="max_queued=3"):
            agent.send_nowait("four")
        with pytest.raises(MailboxFull):
            await agent.send("four")
        await trio.testing.wait_all_tasks_blocked()
        assert [m.text for m in agent.queued()] == ["one", "two", "three"]
        assert [m.text for m in agent.clear_queued()] == ["one", "two", "three"]
        assert agent.queued() == ()
        agent.send_nowait("after clearing")  # room again
        await agent.prompt("go")
        texts = [m.text for m in (await agent.state()).messages]
        assert texts == ["after clearing", "go", "done"]
        assert agent.queued() == ()


async def test_a_failed_turn_drops_its_queued_messages_and_says_so(tmp_path: Path) -> None:
    events: list[cmdc.Event] = []
    provider = ScriptedProvider([ProviderError("model down"), "fine"])
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("d", provider, config=cfg(tmp_path))
        with rt.subscribe("d") as sub:
            await agent.send("queued note")
            with pytest.raises(ProviderError) as info:
                await agent.prompt("first")
            assert any("1 message(s) queued with send() were dropped" in n for n in info.value.__notes__)
            assert agent.queued() == ()
            assert (await agent.prompt("second")).text == "fine"
            texts = [m.text for m in (await agent.state()).messages]
            assert "queued note" not in texts and texts[-2:] == ["second", "fine"]
            with trio.move_on_after(1):
                async for event in sub:
                    events.append(event)
                    if event.kind == "queued_dropped":
                        break
    dropped = [e for e in events if e.kind == "queued_dropped"]
    assert dropped and dropped[0].data["count"] == 1
