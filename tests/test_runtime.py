"""The actor runtime: agents, turns, overflow, plugins, tools, supervision, checkpoints."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
from fakes import Adder, add, drain

from cmdc import (
    AfterCompact,
    AgentStopped,
    BeforeCompact,
    ConfigError,
    ContextOverflow,
    MailboxFull,
    Message,
    OffloadStore,
    Plugin,
    ProviderError,
    Skip,
    State,
    TokenUsage,
    ToolCall,
    open_runtime,
    tool,
)
from cmdc.agent import current_chain
from cmdc.errors import StepLimitReached, TurnAborted
from cmdc.providers import ModelRequest, ScriptedProvider, SimulatedModel


def config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"compact_offload_dir": str(tmp_path / "offload"), **extra}


class TaskCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.alive: set[trio.lowlevel.Task] = set()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.alive.add(task)

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.alive.discard(task)


async def test_a_thousand_agents(tmp_path: Path) -> None:
    counter = TaskCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        before = set(counter.alive)
        async with open_runtime(log_events=False) as rt:

            async def work(i: int) -> None:
                agent = await rt.spawn(
                    f"agent-{i}",
                    Adder(),
                    tools=[add],
                    config=config(tmp_path, compact_trigger=("messages", 8), compact_keep=("messages", 3)),
                )
                for turn in range(3):
                    reply = await agent.prompt(f"what is {i} + {turn}?")
                    assert reply.text == f"answer: {i + turn}"
                state = await agent.state()
                assert state.compactions >= 1
                assert state.messages[1].is_summary  # after the pinned task

            async with trio.open_nursery() as nursery:
                for i in range(1000):
                    nursery.start_soon(work, i)
            assert len(rt.agents) == 1000
        leftover = counter.alive - before
        assert leftover == set()
    finally:
        trio.lowlevel.remove_instrument(counter)
    journals = list((tmp_path / "offload").glob("*.jsonl"))
    assert len(journals) == 1000


async def test_simulated_session_of_200_turns_never_fails(tmp_path: Path) -> None:
    model = SimulatedModel(context_window=4_000, seed=3, tool_probability=0.6, reply_chars=600)
    forced_per_step: list[int] = []
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            "long",
            model,
            tools=[add],
            # a trigger above the window: only overflow-driven, forced compactions happen
            config=config(tmp_path, compact_trigger=("tokens", 100_000), compact_keep=("messages", 4)),
            max_forced_compactions=2,
        )
        with rt.subscribe("long", buffer=100_000) as events:
            for turn in range(200):
                reply = await agent.prompt(f"turn {turn}: tell me about {turn} apples " + "x" * 300)
                assert reply.role == "assistant" and not reply.tool_calls
            seen = drain(events)
        overflows = [e for e in seen if e.kind == "overflow"]
        forced = [e for e in seen if e.kind == "compaction_end" and e.data["report"].reason == "forced"]
        assert overflows and len(forced) == len(overflows)
        for e in overflows:
            forced_per_step.append(e.data["forced"])
        assert max(forced_per_step) < 2
        assert model.overflows >= len(overflows)  # the rest: summarization requests, chunked smaller
        assert (await agent.state()).compactions == len(forced)
        # a user message larger than the window: the figures reach the caller, state intact
        before = await agent.state()
        with pytest.raises(ContextOverflow) as info:
            await agent.prompt("y" * 20_000)
        assert info.value.prompt_tokens is not None and info.value.prompt_tokens > 4_000
        assert info.value.limit == 4_000
        assert await agent.state() is before
        assert (await agent.prompt("a small question")).role == "assistant"


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

    cfg = config(tmp_path, compact_trigger=("messages", 6), compact_keep=("messages", 2))
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

    cfg = config(tmp_path, compact_trigger=("messages", 6), compact_keep=("messages", 2))
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


async def test_isolation_and_restart(tmp_path: Path) -> None:
    @tool
    async def explode() -> str:
        """Always fails."""
        raise ValueError("boom")

    class BadModel:
        def __init__(self, error: BaseException) -> None:
            self.error = error

        async def complete(self, request: ModelRequest) -> Message:
            raise self.error

    crashing = ScriptedProvider([RuntimeError("provider bug"), Message.assistant("back")])
    async with open_runtime(log_events=False) as rt:
        healthy = await rt.spawn("healthy", Adder(), tools=[add], config=config(tmp_path))
        tooly = await rt.spawn(
            "tooly",
            ScriptedProvider([ScriptedProvider.tool_call("explode", {}), "handled"]),
            tools=[explode],
            config=config(tmp_path),
        )
        failing = await rt.spawn("failing", BadModel(ProviderError("503")), config=config(tmp_path))
        crashy = await rt.spawn("crashy", crashing, config=config(tmp_path), restart="permanent")
        await crashy.send("remember me")

        assert (await tooly.prompt("go")).text == "handled"
        tool_state = await tooly.state()
        result = next(m for m in tool_state.messages if m.role == "tool")
        assert result.is_error and "ValueError: boom" in result.text

        with pytest.raises(ProviderError):
            await failing.prompt("hi")
        assert failing.running  # a cmdc error fails the turn, not the agent

        before = await crashy.state()
        with pytest.raises(RuntimeError, match="provider bug") as crash:
            await crashy.prompt("hi")
        # the queued send went with the failed turn, and the caller is told (it never poisons a later turn)
        assert any("1 message(s) queued with send() were dropped" in n for n in crash.value.__notes__)
        assert crashy.running and crashy.restarts == 1
        assert await crashy.state() is before
        assert (await crashy.prompt("again")).text == "back"
        texts = [m.text for m in (await crashy.state()).messages]
        assert texts == ["again", "back"]

        assert (await healthy.prompt("5 + 6")).text == "answer: 11"


async def test_temporary_agents_end_and_transient_give_up(tmp_path: Path, autojump_clock: Any) -> None:
    async with open_runtime(log_events=False) as rt:
        temp = await rt.spawn(
            "temp", ScriptedProvider([RuntimeError("x")]), config=config(tmp_path), restart="temporary"
        )
        with pytest.raises(RuntimeError):
            await temp.prompt("hi")
        await trio.sleep(0.1)
        assert not temp.running and rt.whereis("temp") is None
        with pytest.raises(AgentStopped):
            await temp.prompt("again")

        trans = await rt.spawn(
            "trans", ScriptedProvider([RuntimeError("x")], cycle=True), config=config(tmp_path), max_restarts=2
        )
        for _ in range(3):
            with pytest.raises(RuntimeError):
                await trans.prompt("hi")
        await trio.sleep(0.1)
        assert not trans.running


async def test_resume_from_checkpoint(tmp_path: Path) -> None:
    cfg = config(tmp_path, compact_trigger=("messages", 6), compact_keep=("messages", 2))
    async with open_runtime(checkpoint_dir=tmp_path / "ckpt", log_events=False) as rt:
        agent = await rt.spawn("keeper", Adder(), tools=[add], config=cfg)
        for turn in range(3):
            await agent.prompt(f"{turn} + 10")
        saved = await agent.state()
    assert saved.compactions >= 1
    async with open_runtime(checkpoint_dir=tmp_path / "ckpt", log_events=False) as rt:
        again = await rt.spawn("keeper", Adder(), tools=[add], resume=True)
        state = await again.state()
        assert state == saved and state.config == saved.config
        summary = state.messages[1]  # after the pinned task
        offloaded = await OffloadStore(tmp_path / "offload").read("keeper")
        first, last = summary.metadata["cmdc.first_seq"], summary.metadata["cmdc.last_seq"]
        assert len(offloaded) >= last - first + 1
        assert (await again.prompt("1 + 2")).text == "answer: 3"


async def test_delegation(tmp_path: Path) -> None:
    async def parent_model(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.role == "user":
            call = ToolCall(id="d1", name="delegate", arguments={"task": "what is 20 + 22?"})
            return Message.assistant("", tool_calls=(call,))
        return Message.assistant(f"my helper says: {last.text} (error={last.is_error})")

    class Family(Adder):
        """The parent plans; its temporary children (same provider) do arithmetic."""

        child_fails = False

        async def complete(self, request: ModelRequest) -> Message:
            if current_chain.get()[-1] == "parent":
                return await parent_model(request)
            if self.child_fails:
                raise ProviderError("child model down")
            return await super().complete(request)

    model = Family()
    async with open_runtime(log_events=False) as rt:
        parent = await rt.spawn("parent", model, tools=[add], config=config(tmp_path), delegation=True)
        reply = await parent.prompt("please delegate")
        assert reply.text == "my helper says: answer: 42 (error=False)"
        assert rt.agents == ["parent"]  # the temporary child is gone
        # a child that fails gives the parent an error result, not a crash
        model.child_fails = True
        reply = await parent.prompt("please delegate")
        assert "error=True" in reply.text and "child model down" in reply.text
        assert parent.running and rt.agents == ["parent"]


async def test_temporary_children_names_never_repeat_across_runtimes(tmp_path: Path) -> None:
    """The child counter restarts in every runtime (a later process, another cluster node): a
    random token per runtime in the name keeps a new child off an earlier child's journal."""
    seen: list[str] = []

    async def model(request: ModelRequest) -> Message:
        me = current_chain.get()[-1]
        last = request.messages[-1]
        if me != "parent":
            seen.append(me)
            return Message.assistant("done")
        if last.role == "user":
            return Message.assistant("", tool_calls=(ToolCall(id="d", name="delegate", arguments={"task": "t"}),))
        return Message.assistant(last.text)

    for _ in range(2):  # the same parent, resumed from the same store, in two runtimes
        async with open_runtime(store=str(tmp_path / "store"), log_events=False) as rt:
            parent = await rt.spawn("parent", ScriptedProvider([model], cycle=True), delegation=True, resume=True)
            for _ in range(2):
                assert (await parent.prompt("go")).text == "done"
    assert len(seen) == 4 and len(set(seen)) == 4, seen
    assert all(re.fullmatch(r"parent\.child[12]-[0-9a-f]{12}", n) for n in seen), seen
    assert seen[0].split("-")[1] == seen[1].split("-")[1] != seen[2].split("-")[1]  # one token per runtime


async def test_delegation_by_name_and_depth(tmp_path: Path) -> None:
    async def chain_model(request: ModelRequest) -> Message:
        last = request.messages[-1]
        me = current_chain.get()[-1]
        if last.role == "user":
            target = {"a": "b", "b": "a"}[me]
            call = ToolCall(id=f"x-{me}", name="delegate", arguments={"task": "hi", "agent": target})
            return Message.assistant("", tool_calls=(call,))
        return Message.assistant(f"{me} got: {last.text}")

    async with open_runtime(log_events=False) as rt:
        a = await rt.spawn(
            "a", ScriptedProvider([chain_model], cycle=True), config=config(tmp_path), delegation=["b"], accepts=["b"]
        )
        await rt.spawn(
            "b", ScriptedProvider([chain_model], cycle=True), config=config(tmp_path), delegation=["a"], accepts=["a"]
        )
        reply = await a.prompt("start")
        # a -> b -> a would wait on itself: b gets an error result and answers with it
        assert reply.text.startswith("a got: b got: ") and "already waiting" in reply.text


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
        agent = await rt.spawn("t", script, tools=[add, sleepy], config=config(tmp_path))
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
        agent = await rt.spawn("m", ScriptedProvider([waiting], cycle=True), config=config(tmp_path), mailbox_size=1)

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
        agent = await rt.spawn("w", ScriptedProvider([forever]), config=config(tmp_path))

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
            config=config(tmp_path),
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
            agent = await rt.spawn("ev", Adder(), tools=[add], config=config(tmp_path))
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
