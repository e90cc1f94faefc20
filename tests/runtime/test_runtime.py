"""The actor runtime's turns: compaction plugins and a cancel in the middle of one, tool errors
as results, the mailbox, abort and stop, the step limit and bad spawns, events with their
figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
from fakes import Adder, add, agent_config

from cmdc import (
    AfterCompact,
    AgentStopped,
    BeforeCompact,
    ConfigError,
    MailboxFull,
    Message,
    OffloadStore,
    Plugin,
    Skip,
    State,
    TokenUsage,
    ToolCall,
    open_runtime,
    tool,
)
from cmdc.errors import StepLimitReached, TurnAborted
from cmdc.providers import ModelRequest, ScriptedProvider
from cmdc.testing import drain


async def test_before_compact_skip_and_after_compact_and_raising_plugins(tmp_path: Path) -> None:
    class Veto(Plugin):
        async def before_compact(self, ctx: BeforeCompact) -> Skip:
            return Skip("keep everything")

    class Reinject(Plugin):
        async def after_compact(self, ctx: AfterCompact) -> State:
            summary, *rest = ctx.state.messages  # re-inject the skills right after the summary
            return ctx.state.evolve(messages=(summary, Message.user("skills: remember the rules"), *rest))

    class Broken(Plugin):
        async def before_request(self, ctx: Any) -> None:
            raise RuntimeError("plugin bug")

    cfg = agent_config(tmp_path, compact_trigger=("messages", 6), compact_keep=("messages", 2))
    async with open_runtime(log_events=False) as rt:
        vetoed = await rt.spawn("vetoed", Adder(), tools=[add], plugins=[Veto()], config=cfg)
        with rt.subscribe("vetoed") as events:
            for turn in range(3):
                await vetoed.prompt(f"{turn} + 1")
            kinds = drain(events)
        assert (await vetoed.state()).compactions == 0
        skipped = [e for e in kinds if e.kind == "compaction_skipped"]
        assert skipped and skipped[0].data["skipped_by"] == "Veto"

        reinjected = await rt.spawn("reinjected", Adder(), tools=[add], plugins=[Reinject()], config=cfg)
        for turn in range(3):
            await reinjected.prompt(f"{turn} + 1")
        state = await reinjected.state()
        assert state.compactions >= 1
        assert any(m.text == "skills: remember the rules" for m in state.messages)

        broken = await rt.spawn("broken", Adder(), tools=[add], plugins=[Broken()], config=cfg)
        with rt.subscribe("broken") as events:
            assert (await broken.prompt("2 + 2")).text == "answer: 4"
            first = await events.receive()
            while first.kind != "plugin_error":
                first = await events.receive()
            assert first.data["plugin"] == "Broken" and "plugin bug" in first.data["error"]


async def test_cancelling_a_prompt_during_compaction(tmp_path: Path) -> None:
    entered = trio.Event()

    class SlowSummaries(Adder):
        slow = True

        async def complete(self, request: ModelRequest) -> Message:
            if self.slow and request.metadata.get("cmdc.purpose") == "summarize":
                entered.set()
                await trio.sleep(10)
            return await super().complete(request)

    cfg = agent_config(tmp_path, compact_trigger=("messages", 6), compact_keep=("messages", 2))
    async with open_runtime(log_events=False) as rt:
        model = SlowSummaries()
        agent = await rt.spawn("slow", model, tools=[add], config=cfg)
        await agent.prompt("1 + 1")
        before = await agent.state()
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(agent.prompt, "2 + 2")
                await entered.wait()
                nursery.cancel_scope.cancel()  # the caller gives up in the middle of the compaction
        assert not scope.cancelled_caught
        cancelled = await agent.state()  # the last commit: the turn's first step, not compacted
        assert cancelled.compactions == 0 and not any(m.is_summary for m in cancelled.messages)
        assert cancelled.messages[: len(before.messages)] == before.messages
        assert cancelled.messages[-1].role == "tool"  # a whole step: the call with its result
        journal = await OffloadStore(tmp_path / "offload").verify("slow")  # written ahead, never committed
        assert journal.uncommitted > 0 and journal.records == 0 and journal.clean
        model.slow = False  # the agent's provider is its summarizer
        reply = await agent.prompt("3 + 4")  # the next prompt is served normally
        assert reply.text == "answer: 7"
        after = await agent.state()
        assert after.compactions >= 1 and after.messages[1].is_summary  # after the pinned task


async def test_tools_errors_are_results_the_model_can_read(tmp_path: Path, autojump_clock: Any) -> None:
    @tool(timeout=1.0)
    async def sleepy() -> str:
        """Sleeps too long."""
        await trio.sleep(100)
        return "late"

    script = ScriptedProvider(
        [
            Message.assistant(
                "",
                tool_calls=(
                    ToolCall(id="u", name="nope", arguments={}),
                    ToolCall(id="v", name="add", arguments={"a": "one", "b": 2}),
                    ToolCall(id="s", name="sleepy", arguments={}),
                    ToolCall(id="ok", name="add", arguments={"a": 1, "b": 2}),
                ),
            ),
            "done",
        ]
    )
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("t", script, tools=[add, sleepy], config=agent_config(tmp_path))
        assert (await agent.prompt("go")).text == "done"
        results = {m.tool_call_id: m for m in (await agent.state()).messages if m.role == "tool"}
        assert results["u"].is_error and "unknown tool 'nope'" in results["u"].text and "add" in results["u"].text
        assert results["v"].is_error and "arguments.a" in results["v"].text
        assert results["s"].is_error and "timed out" in results["s"].text
        assert not results["ok"].is_error and results["ok"].text == "3"
        # the results come in the order of the calls
        assert [m.tool_call_id for m in (await agent.state()).messages if m.role == "tool"] == ["u", "v", "s", "ok"]


async def test_mailbox_abort_stop_and_runtime_exit(tmp_path: Path, autojump_clock: Any) -> None:
    gate, gate2 = trio.Event(), trio.Event()
    never: list[bool] = []  # set: the model waits for gate2, which never opens

    async def waiting(request: ModelRequest) -> Message:
        await gate.wait()
        if never:
            await gate2.wait()
            return Message.assistant("never")
        return Message.assistant("ok")

    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            "m", ScriptedProvider([waiting], cycle=True), config=agent_config(tmp_path), mailbox_size=1
        )

        async def first() -> None:
            with pytest.raises(TurnAborted):
                await agent.prompt("first")  # occupies the agent until aborted

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.sleep(1)
            agent.send_nowait("queued")  # fills the mailbox
            with pytest.raises(MailboxFull):
                agent.send_nowait("one too many")
            agent.abort()
            await trio.sleep(1)
            gate.set()
            nursery.cancel_scope.cancel()
        assert [m.text for m in (await agent.state()).messages] == []
        reply = await agent.prompt("second")
        assert reply.text == "ok"
        assert [m.text for m in (await agent.state()).messages] == ["queued", "second", "ok"]

        never.append(True)

        async def abort_soon() -> None:
            await trio.sleep(1)
            agent.abort()

        committed = await agent.state()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(abort_soon)
            with pytest.raises(TurnAborted):
                await agent.prompt("to abort")
        assert await agent.state() is committed

        await agent.stop()
        assert not agent.running and rt.whereis("m") is None
        with pytest.raises(AgentStopped):
            await agent.prompt("after stop")

    # leaving the runtime while a caller waits: the caller gets AgentStopped
    hang = trio.Event()

    async def forever(request: ModelRequest) -> Message:
        await hang.wait()
        raise AssertionError("unreachable")

    outcome: list[BaseException] = []
    async with trio.open_nursery() as outer, open_runtime(log_events=False) as rt:
        agent = await rt.spawn("w", ScriptedProvider([forever]), config=agent_config(tmp_path))

        async def caller() -> None:
            try:
                await agent.prompt("hello")
            except AgentStopped as exc:
                outcome.append(exc)

        outer.start_soon(caller)
        await trio.sleep(1)
    assert len(outcome) == 1


async def test_step_limit_and_bad_spawns(tmp_path: Path) -> None:
    async with open_runtime(log_events=False) as rt:
        loop = await rt.spawn(
            "loop",
            ScriptedProvider([ScriptedProvider.tool_call("add", {"a": 1, "b": 1})], cycle=True),
            tools=[add],
            config=agent_config(tmp_path),
            max_steps=3,
        )
        with pytest.raises(StepLimitReached) as info:
            await loop.prompt("go")
        assert isinstance(info.value.reply, Message) and info.value.reply.tool_calls
        assert len([m for m in (await loop.state()).messages if m.role == "tool"]) == 3

        for name in ["../x", "a/b", "", ".", "x" * 200]:
            with pytest.raises(ConfigError):
                await rt.spawn(name, Adder())
        with pytest.raises(ConfigError, match="already running"):
            await rt.spawn("loop", Adder())
        with pytest.raises(ConfigError, match="max_steps"):
            await rt.spawn("x1", Adder(), max_steps=0)
        with pytest.raises(ConfigError, match="restart"):
            await rt.spawn("x2", Adder(), restart="sometimes")
        with pytest.raises(ConfigError, match="bogus"):
            await rt.spawn("x3", Adder(), bogus=1)
        with pytest.raises(ConfigError, match="compact_trigger"):
            await rt.spawn("x4", Adder(), config={"compact_trigger": ("tokens", 0)})
        with pytest.raises(ConfigError, match="resume"):
            await rt.spawn("x5", Adder(), resume=True)
        assert sorted(rt.agents) == ["loop"]


async def test_events_carry_figures(tmp_path: Path) -> None:
    async with open_runtime(log_events=False) as rt:
        with rt.subscribe() as everything:
            agent = await rt.spawn("ev", Adder(), tools=[add], config=agent_config(tmp_path))
            await agent.prompt("1 + 2")
            kinds: list[str] = []
            while not kinds or kinds[-1] != "turn_end":
                event = await everything.receive()
                kinds.append(event.kind)
                if event.kind == "response":
                    assert isinstance(event.data["usage"], TokenUsage)
                if event.kind == "tool_end":
                    assert event.data["duration"] >= 0 and event.data["tool"] == "add"
        assert kinds == [
            "turn_start",
            "request",
            "response",
            "tool_start",
            "tool_end",
            "request",
            "response",
            "turn_end",
        ]
