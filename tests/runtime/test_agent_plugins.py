"""The plugin pipeline as an agent runs it: every hook, priority order, return values, Skip,
Abort, isolation of plugins that raise; the mailbox under pressure; restart policies in time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from cmdc import (
    Abort,
    AgentStopped,
    Compacted,
    CompactionAborted,
    Message,
    Plugin,
    PluginAborted,
    RequestSkipped,
    Skip,
    Skipped,
    State,
    ToolCall,
    open_runtime,
    tool,
)
from cmdc.agent import LifecycleContext, RequestContext, ResponseContext, ToolContext
from cmdc.providers import ModelRequest, ScriptedProvider
from cmdc.testing import drain

PAD = " and some more words to make the message worth summarizing" * 8


@tool
async def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


def cfg(tmp_path: Path) -> dict[str, Any]:
    return {"compact_offload_dir": str(tmp_path)}


def script() -> ScriptedProvider:
    return ScriptedProvider([ScriptedProvider.tool_call("shout", {"text": "hi"}), "final"], cycle=True)


class Recorder(Plugin):
    def __init__(self, name: str, priority: int, log: list[str]) -> None:
        self._name, self.priority, self.log = name, priority, log

    @property
    def name(self) -> str:
        return self._name

    async def on_start(self, ctx: LifecycleContext) -> None:
        self.log.append(f"{self._name}:on_start")

    async def before_request(self, ctx: RequestContext) -> None:
        self.log.append(f"{self._name}:before_request:{ctx.step}")

    async def after_response(self, ctx: ResponseContext) -> None:
        self.log.append(f"{self._name}:after_response")

    async def before_tool(self, ctx: ToolContext) -> None:
        self.log.append(f"{self._name}:before_tool:{ctx.call.name}")

    async def after_tool(self, ctx: ToolContext) -> None:
        assert ctx.result is not None
        self.log.append(f"{self._name}:after_tool:{ctx.result.text}")

    async def on_stop(self, ctx: LifecycleContext) -> None:
        self.log.append(f"{self._name}:on_stop")


async def test_every_hook_in_priority_order(tmp_path: Path) -> None:
    log: list[str] = []
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            "p",
            script(),
            tools=[shout],
            config=cfg(tmp_path),
            plugins=[Recorder("late", 200, log), Recorder("early", 10, log)],
        )
        assert log == ["early:on_start", "late:on_start"]  # spawn waited for on_start
        assert (await agent.prompt("go")).text == "final"
        await agent.stop()
    assert log[2:] == [
        "early:before_request:1", "late:before_request:1",
        "early:after_response", "late:after_response",
        "early:before_tool:shout", "late:before_tool:shout",
        "early:after_tool:HI", "late:after_tool:HI",
        "early:before_request:2", "late:before_request:2",
        "early:after_response", "late:after_response",
        "early:on_stop", "late:on_stop",
    ]  # fmt: skip


async def test_hooks_can_replace_their_subject(tmp_path: Path) -> None:
    class Rewrite(Plugin):
        async def on_start(self, ctx: LifecycleContext) -> State:
            return ctx.state.append(Message.system("injected at start"))

        async def before_request(self, ctx: RequestContext) -> State | None:
            if ctx.step == 1:
                return ctx.state.append(Message.user("a note added before the request"))
            return None

        async def before_tool(self, ctx: ToolContext) -> ToolCall:
            return ToolCall(id=ctx.call.id, name=ctx.call.name, arguments={"text": "rewritten"})

        async def after_tool(self, ctx: ToolContext) -> Message:
            assert ctx.result is not None
            return Message.tool_result(ctx.call.id, ctx.result.text + "!")

        async def after_response(self, ctx: ResponseContext) -> Message | None:
            if not ctx.reply.tool_calls:
                return Message.assistant(ctx.reply.text + " (checked)", usage=ctx.reply.usage)
            return None

    provider = script()
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("r", provider, tools=[shout], plugins=[Rewrite()], config=cfg(tmp_path))
        assert (await agent.prompt("go")).text == "final (checked)"
        texts = [m.text for m in (await agent.state()).messages]
    assert texts[0] == "injected at start"
    assert "a note added before the request" in texts
    assert "REWRITTEN!" in texts
    assert provider.requests[0].messages[-1].text == "a note added before the request"


async def test_skip_and_abort(tmp_path: Path) -> None:
    class SkipTools(Plugin):
        async def before_tool(self, ctx: ToolContext) -> Skip:
            return Skip("tools are off today")

    class SkipRequests(Plugin):
        async def before_request(self, ctx: RequestContext) -> Skip:
            return Skip("quiet hours")

    class AbortReplies(Plugin):
        async def after_response(self, ctx: ResponseContext) -> Abort:
            return Abort("reply rejected")

    class NeverRuns(Plugin):
        priority = 500
        called = False

        async def before_tool(self, ctx: ToolContext) -> None:
            NeverRuns.called = True

    async with open_runtime(log_events=False) as rt:
        a = await rt.spawn("a", script(), tools=[shout], plugins=[SkipTools(), NeverRuns()], config=cfg(tmp_path))
        assert (await a.prompt("go")).text == "final"
        result = next(m for m in (await a.state()).messages if m.role == "tool")
        assert result.is_error and "tools are off today" in result.text and "SkipTools" in result.text
        assert not NeverRuns.called  # Skip stops the pipeline

        b = await rt.spawn("b", script(), tools=[shout], plugins=[SkipRequests()], config=cfg(tmp_path))
        with pytest.raises(RequestSkipped, match="quiet hours"):
            await b.prompt("go")
        assert (await b.state()).messages == ()

        c = await rt.spawn("c", script(), tools=[shout], plugins=[AbortReplies()], config=cfg(tmp_path))
        with pytest.raises(PluginAborted, match="reply rejected"):
            await c.prompt("go")
        assert c.running and (await c.state()).messages == ()


async def test_raising_and_misbehaving_plugins_are_isolated(tmp_path: Path, autojump_clock: Any) -> None:
    seen: list[str] = []

    class Chaos(Plugin):
        hook_timeout = 2.0

        async def on_start(self, ctx: LifecycleContext) -> None:
            raise RuntimeError("start bug")

        async def before_request(self, ctx: RequestContext) -> str:
            return "not a state"

        async def after_response(self, ctx: ResponseContext) -> None:
            await trio.sleep_forever()  # hangs: bounded by hook_timeout

        async def before_tool(self, ctx: ToolContext) -> None:
            raise ValueError("tool hook bug")

        async def on_error(self, ctx: LifecycleContext) -> None:
            seen.append(repr(ctx.error))

    async with open_runtime(log_events=False) as rt:
        with rt.subscribe() as events:
            agent = await rt.spawn("x", script(), tools=[shout], plugins=[Chaos()], config=cfg(tmp_path))
            assert (await agent.prompt("go")).text == "final"
            errors = [(e.data["hook"], e.data["error"]) for e in drain(events) if e.kind == "plugin_error"]
    hooks = [h for h, _ in errors]
    assert hooks.count("on_start") == 1 and hooks.count("before_request") == 2
    assert hooks.count("after_response") == 2 and hooks.count("before_tool") == 1
    assert any("TooSlowError" in e for h, e in errors if h == "after_response")
    assert seen == []  # no turn failed, so on_error never ran


async def test_on_error_sees_a_failed_turn_and_add_plugin_at_run_time(tmp_path: Path) -> None:
    errors: list[BaseException | None] = []

    class Watch(Plugin):
        async def on_error(self, ctx: LifecycleContext) -> None:
            errors.append(ctx.error)

    class Late(Plugin):
        async def before_request(self, ctx: RequestContext) -> Abort:
            return Abort("added later")

    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            "e", ScriptedProvider([ValueError("bad model")]), config=cfg(tmp_path), plugins=[Watch()]
        )
        with pytest.raises(ValueError):
            await agent.prompt("go")
        assert len(errors) >= 1 and isinstance(errors[0], ValueError)
        agent.add_plugin(Late())
        with pytest.raises(PluginAborted, match="added later"):
            await agent.prompt("go")


async def test_a_full_mailbox_makes_senders_wait(tmp_path: Path, autojump_clock: Any) -> None:
    gate = trio.Event()

    async def slow(request: ModelRequest) -> Message:
        await gate.wait()
        return Message.assistant("ok")

    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("m", ScriptedProvider([slow], cycle=True), config=cfg(tmp_path), mailbox_size=2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.prompt, "busy")
            await trio.sleep(1)
            await agent.send("one")
            await agent.send("two")  # the mailbox is now full
            sent = trio.Event()

            async def third() -> None:
                await agent.send("three")
                sent.set()

            nursery.start_soon(third)
            await trio.sleep(5)
            assert not sent.is_set()  # pushed back, not dropped
            gate.set()
            await sent.wait()
        assert (await agent.prompt("last")).text == "ok"
        texts = [m.text for m in (await agent.state()).messages]
        assert texts == ["busy", "ok", "one", "two", "three", "last", "ok"]


async def test_permanent_agents_back_off_and_come_back(tmp_path: Path, autojump_clock: Any) -> None:
    provider = ScriptedProvider([RuntimeError("a"), RuntimeError("b"), RuntimeError("c"), "fine"])
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            "perm", provider, config=cfg(tmp_path), restart="permanent", max_restarts=1, restart_window=30.0
        )
        start = trio.current_time()
        for _ in range(3):
            with pytest.raises(RuntimeError):
                await agent.prompt("hi")
        assert (await agent.prompt("hi")).text == "fine"
        assert agent.running and agent.restarts == 3
        assert trio.current_time() - start >= 30.0  # past the limit it waited out the window


async def test_a_failing_auto_compaction_does_not_fail_the_turn(tmp_path: Path, autojump_clock: Any) -> None:
    calls = 0

    async def down(messages: Any, instruction: str) -> str:
        nonlocal calls
        calls += 1
        raise ConnectionError("summarizer down")

    config = {**cfg(tmp_path), "compact_trigger": ("messages", 3), "compact_keep": ("messages", 1)}
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            "c",
            ScriptedProvider(["one" + PAD, "two", "three"]),  # large enough that a summary is smaller
            summarizer=down,
            config=config,
            compaction_cooldown=60.0,
        )
        assert (await agent.prompt("a")).text == "one" + PAD
        assert (await agent.prompt("b")).text == "two"  # 3 messages: compaction tried, failed
        failed_calls = calls
        assert failed_calls == 4  # 1 attempt + 3 retries
        assert (await agent.prompt("c")).text == "three"  # within the cool-down: not retried
        assert calls == failed_calls
        state = await agent.state()
        assert state.compactions == 0 and [m.text for m in state.messages] == [
            "a",
            "one" + PAD,
            "b",
            "two",
            "c",
            "three",
        ]


async def test_queued_callers_get_an_answer_when_the_agent_stops(tmp_path: Path, autojump_clock: Any) -> None:
    gate = trio.Event()

    async def slow(request: ModelRequest) -> Message:
        await gate.wait()
        return Message.assistant("ok")

    outcomes: list[str] = []
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("q", ScriptedProvider([slow], cycle=True), config=cfg(tmp_path))

        async def ask(text: str) -> None:
            try:
                outcomes.append((await agent.prompt(text)).text)
            except AgentStopped:
                outcomes.append("stopped")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "running")
            await trio.sleep(1)
            nursery.start_soon(agent.stop)  # queued behind the running turn
            await trio.sleep(1)
            nursery.start_soon(ask, "queued after stop")
            await trio.sleep(1)
            gate.set()
    assert sorted(outcomes) == ["ok", "stopped"]


async def test_abort_from_tool_hooks_reaches_the_caller(tmp_path: Path) -> None:
    class NoTools(Plugin):
        async def before_tool(self, ctx: ToolContext) -> Abort:
            return Abort("no tools allowed")

    class NoResults(Plugin):
        async def after_tool(self, ctx: ToolContext) -> Abort:
            return Abort("result refused")

    async with open_runtime(log_events=False) as rt:
        for name, plugin, why in (("bt", NoTools(), "no tools allowed"), ("at", NoResults(), "result refused")):
            agent = await rt.spawn(name, script(), tools=[shout], plugins=[plugin], config=cfg(tmp_path))
            with pytest.raises(PluginAborted, match=why):
                await agent.prompt("go")
            assert agent.running and agent.restarts == 0
            assert (await agent.state()).messages == ()


async def test_abort_from_before_compact_ends_the_turn(tmp_path: Path) -> None:
    class Forbid(Plugin):
        async def before_compact(self, ctx: Any) -> Abort:
            return Abort("compaction forbidden")

    config = {**cfg(tmp_path), "compact_trigger": ("messages", 2), "compact_keep": ("messages", 1)}
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("f", ScriptedProvider(["one", "two"]), plugins=[Forbid()], config=config)
        assert (await agent.prompt("a")).text == "one"
        with pytest.raises(CompactionAborted, match="compaction forbidden"):
            await agent.prompt("b")
        assert agent.running


async def test_on_error_runs_once_per_crash_and_renamed_calls_run_the_new_tool(tmp_path: Path) -> None:
    errors: list[BaseException | None] = []

    @tool
    async def whisper(text: str) -> str:
        """Lower-case a text."""
        return text.lower()

    class Watch(Plugin):
        async def on_error(self, ctx: LifecycleContext) -> None:
            errors.append(ctx.error)

        async def before_tool(self, ctx: ToolContext) -> ToolCall:
            return ToolCall(id=ctx.call.id, name="whisper", arguments={"text": "QUIET"})

    async with open_runtime(log_events=False) as rt:
        crashy = await rt.spawn("c", ScriptedProvider([RuntimeError("bug")]), config=cfg(tmp_path), plugins=[Watch()])
        with pytest.raises(RuntimeError):
            await crashy.prompt("go")
        assert len(errors) == 1

        renamer = await rt.spawn("r", script(), tools=[shout, whisper], plugins=[Watch()], config=cfg(tmp_path))
        await renamer.prompt("go")
        result = next(m for m in (await renamer.state()).messages if m.role == "tool")
        assert result.text == "quiet"


async def test_manual_compaction_with_an_instruction(tmp_path: Path) -> None:
    instructions: list[str] = []

    async def summarizer(messages: Any, instruction: str) -> str:
        instructions.append(instruction)
        return "## Current work\nthe API changes"

    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            "m",
            ScriptedProvider(["a", "b", "c"]),
            summarizer=summarizer,
            config={**cfg(tmp_path), "compact_keep": ("messages", 1)},
        )
        skipped = await agent.compact()  # nothing to evict yet
        assert isinstance(skipped, Skipped) and skipped.reason == "nothing can be evicted"
        for text in ("one", "two", "three"):
            await agent.prompt(text + PAD)
        outcome = await agent.compact("focus on the API changes")
        assert isinstance(outcome, Compacted) and outcome.state == await agent.state()
        report = outcome.report
        assert report.reason == "manual" and report.evicted >= 3
        assert instructions[-1].endswith("focus on the API changes")
        state = await agent.state()
        assert state.compactions == 1 and any(m.is_summary for m in state.messages)


async def test_a_reply_saying_the_window_is_exhausted_compacts_before_the_next_step(tmp_path: Path) -> None:
    exhausted = Message.assistant(
        "",
        tool_calls=(ToolCall(id="t1", name="shout", arguments={"text": "x"}),),
        metadata={"cmdc.context_exceeded": True},
    )
    provider = ScriptedProvider(["first" + PAD, exhausted, "done"])
    config = {**cfg(tmp_path), "compact_keep": ("messages", 2)}
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("w", provider, tools=[shout], config=config, summarizer=_summary)
        await agent.prompt("one" + PAD)
        assert (await agent.prompt("two")).text == "done"
        state = await agent.state()
        assert state.compactions == 1  # forced by the flag, although no trigger was reached


async def _summary(messages: Any, instruction: str) -> str:
    return "## Current work\nsummarized"
