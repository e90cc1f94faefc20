"""Virtual agents: idle or surplus agents are deactivated and come back on the next call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import cmdc
from cmdc import AgentStopped, ConfigError, Message, Plugin, ToolCall, open_runtime
from cmdc.errors import CheckpointError
from cmdc.providers import ModelRequest, ScriptedProvider
from cmdc.testing import drain


def echo(request: ModelRequest) -> str:
    users = [m.text for m in request.messages if m.role == "user"]
    return f"echo {len(users)}: {users[-1]}"


def echo_model(**kw: Any) -> ScriptedProvider:
    return ScriptedProvider([echo], cycle=True, **kw)


def cfg(tmp_path: Path) -> dict[str, Any]:
    return {"compact_offload_dir": str(tmp_path / "offload")}


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def test_an_idle_agent_is_deactivated_and_comes_back_with_its_history(
    tmp_path: Path, autojump_clock: Any
) -> None:
    async with open_runtime(checkpoint_dir=tmp_path / "ck", deactivate_after=10, log_events=False) as rt:
        ref = await rt.spawn("a1", echo_model(), config=cfg(tmp_path))
        assert (await ref.prompt("one")).text == "echo 1: one"
        await trio.sleep(5)
        assert rt.resident == ["a1"]
        await trio.sleep(6)
        assert rt.resident == [] and rt.agents == ["a1"]
        assert not ref.resident and ref.running and rt.whereis("a1") is ref
        assert rt.stats["deactivations"] == 1
        assert (tmp_path / "ck" / "a1.state.json").exists()
        # the next call activates it from its checkpoint: the history is all there
        assert (await ref.prompt("two")).text == "echo 2: two"
        assert rt.stats["activations"] == 1 and ref.resident
        state = await rt.get("a1").state()
        assert [m.text for m in state.messages] == ["one", "echo 1: one", "two", "echo 2: two"]


async def test_state_send_and_ping_activate_too(tmp_path: Path, autojump_clock: Any) -> None:
    async with open_runtime(checkpoint_dir=tmp_path / "ck", deactivate_after=1, log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), config=cfg(tmp_path))
        await ref.prompt("one")
        await trio.sleep(2)
        assert not ref.resident
        assert len((await ref.state()).messages) == 2 and ref.resident
        await trio.sleep(2)
        ref.send_nowait("queued while away")  # kept for the next turn, no activation needed
        assert not ref.resident
        await ref.send("and another")
        assert ref.resident
        await trio.sleep(2)
        assert not ref.resident
        await ref.ping()
        reply = await ref.prompt("now")
        assert reply.text == "echo 4: now"
        texts = [m.text for m in (await ref.state()).messages]
        assert texts[2:5] == ["queued while away", "and another", "now"]


async def test_max_resident_keeps_memory_bounded(tmp_path: Path) -> None:
    async with open_runtime(checkpoint_dir=tmp_path / "ck", max_resident=3, log_events=False) as rt:
        refs = [await rt.spawn(f"n{i}", echo_model(), config=cfg(tmp_path)) for i in range(20)]
        for i, ref in enumerate(refs):
            assert (await ref.prompt(f"hello {i}")).text == f"echo 1: hello {i}"
            await settle()
            assert len(rt.resident) <= 3
        for i, ref in enumerate(refs):  # each comes back with its own history
            assert (await ref.prompt(f"again {i}")).text == f"echo 2: again {i}"
            await settle()
            assert len(rt.resident) <= 3
        assert rt.stats["agents"] == 20 and rt.stats["activations"] >= 20


async def test_concurrent_calls_activate_once(tmp_path: Path, autojump_clock: Any) -> None:
    async with open_runtime(checkpoint_dir=tmp_path / "ck", deactivate_after=1, log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), config=cfg(tmp_path))
        await ref.prompt("zero")
        await trio.sleep(2)
        replies: list[str] = []

        async def ask(i: int) -> None:
            replies.append((await ref.prompt(f"q{i}")).text)

        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(ask, i)
        assert len(replies) == 5 and rt.stats["activations"] == 1
        assert len((await ref.state()).messages) == 12


async def test_busy_agents_are_never_deactivated(tmp_path: Path, autojump_clock: Any) -> None:
    async with open_runtime(checkpoint_dir=tmp_path / "ck", deactivate_after=1, log_events=False) as rt:
        ref = await rt.spawn("slow", echo_model(delay=30), config=cfg(tmp_path))
        assert (await ref.prompt("take your time")).text.startswith("echo 1")
        assert rt.stats["deactivations"] == 0
        assert not await rt.deactivate("nobody")
        assert await rt.deactivate("slow")  # idle now: an explicit deactivation works at once
        assert not ref.resident


async def test_subscriptions_and_plugins_survive_deactivation(tmp_path: Path, autojump_clock: Any) -> None:
    seen: list[str] = []

    class Counter(Plugin):
        async def before_request(self, ctx: Any) -> None:
            seen.append(ctx.state.agent_id)

    async with open_runtime(checkpoint_dir=tmp_path / "ck", deactivate_after=1, log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), config=cfg(tmp_path))
        with rt.subscribe("a") as sub:
            await ref.prompt("one")
            await trio.sleep(2)
            assert not ref.resident
            ref.add_plugin(Counter())  # registered while away: used after activation
            await ref.prompt("two")
            kinds = [e.kind for e in drain(sub)]
        assert "deactivated" in kinds and "activated" in kinds
        assert kinds.index("deactivated") < kinds.index("activated") < len(kinds) - 1
        assert kinds.count("turn_start") == 2
        assert seen == ["a"]


async def test_stop_while_deactivated(tmp_path: Path, autojump_clock: Any) -> None:
    async with open_runtime(checkpoint_dir=tmp_path / "ck", deactivate_after=1, log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), config=cfg(tmp_path))
        await ref.prompt("one")
        await trio.sleep(2)
        await ref.stop()
        assert not ref.running and rt.whereis("a") is None and rt.agents == []
        with pytest.raises(AgentStopped):
            await ref.prompt("hello?")
        with pytest.raises(AgentStopped):
            ref.send_nowait("hello?")
        # the name is free again; its checkpoint stays, so it can resume
        again = await rt.spawn("a", echo_model(), config=cfg(tmp_path), resume=True)
        assert again is not ref and len((await again.state()).messages) == 2


async def test_delegation_reaches_a_deactivated_agent(tmp_path: Path) -> None:
    def lead(request: ModelRequest) -> Message | str:
        last = request.messages[-1]
        if last.role == "user":
            call = ToolCall(id="d1", name="delegate", arguments={"task": "say hi", "agent": "helper"})
            return Message.assistant("", tool_calls=(call,))
        return f"helper said: {last.text}"

    async with open_runtime(checkpoint_dir=tmp_path / "ck", deactivate_after=3600, log_events=False) as rt:
        helper = await rt.spawn("helper", echo_model(), config=cfg(tmp_path), accepts=["boss"])
        boss = await rt.spawn("boss", ScriptedProvider([lead], cycle=True), config=cfg(tmp_path), delegation=["helper"])
        assert await rt.deactivate("helper") and await rt.deactivate("boss")
        assert rt.resident == []
        assert (await boss.prompt("go")).text == "helper said: echo 1: say hi"
        assert helper.resident and rt.stats["activations"] == 2


async def test_a_crash_after_activation_restarts_from_the_last_commit(tmp_path: Path, autojump_clock: Any) -> None:
    script: list[Any] = ["first", RuntimeError("boom"), "second"]
    async with open_runtime(checkpoint_dir=tmp_path / "ck", deactivate_after=1, log_events=False) as rt:
        ref = await rt.spawn("a", ScriptedProvider(script), config=cfg(tmp_path), restart="transient")
        await ref.prompt("one")
        await trio.sleep(2)
        with pytest.raises(RuntimeError):
            await ref.prompt("crash")
        assert ref.restarts == 1 and ref.running
        assert (await ref.prompt("two")).text == "second"
        await trio.sleep(2)
        assert not ref.resident and ref.restarts == 1
        texts = [m.text for m in (await ref.state()).messages]
        assert texts == ["one", "first", "two", "second"]


async def test_a_failed_save_keeps_the_agent_resident(
    tmp_path: Path, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_runtime(checkpoint_dir=tmp_path / "ck", max_resident=5, log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), config=cfg(tmp_path))
        await ref.prompt("one")
        assert rt.checkpoints is not None

        async def broken(state: cmdc.State) -> Path:
            raise CheckpointError("disk full")

        ref.add_plugin(Plugin())  # state unchanged; force a save by changing it below
        agent = rt._agents["a"]
        agent.state = agent.state.append(Message.user("unsaved"))
        monkeypatch.setattr(rt.checkpoints, "save", broken)
        assert not await rt.deactivate("a")
        assert ref.resident and (await ref.state()).messages[-1].text == "unsaved"


async def test_virtual_agent_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="checkpoint_dir"):
        async with open_runtime(deactivate_after=5):
            pass
    for bad in (0, -1, True, "5", float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="deactivate_after"):
            async with open_runtime(checkpoint_dir=tmp_path, deactivate_after=bad):  # type: ignore[arg-type]
                pass
    for bad_n in (0, -3, True, 2.0, "10"):
        with pytest.raises(ConfigError, match="max_resident"):
            async with open_runtime(checkpoint_dir=tmp_path, max_resident=bad_n):  # type: ignore[arg-type]
                pass
    async with open_runtime(checkpoint_dir=tmp_path, log_events=False) as rt:
        with pytest.raises(ConfigError, match="virtual"):
            await rt.deactivate("x")


async def test_a_request_racing_a_deactivation_wins(tmp_path: Path) -> None:
    async with open_runtime(checkpoint_dir=tmp_path / "ck", max_resident=10, log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), config=cfg(tmp_path))
        await ref.prompt("one")
        rt._request_deactivation(rt._agents["a"])  # queued first ...
        ref.send_nowait("racing")  # ... and a request right behind it: the agent is not idle
        await settle()
        assert ref.resident and rt.stats["deactivations"] == 0
        assert (await ref.prompt("two")).text == "echo 3: two"


async def test_a_caller_cancelled_during_an_activation(tmp_path: Path) -> None:
    async with open_runtime(checkpoint_dir=tmp_path / "ck", max_resident=10, log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), config=cfg(tmp_path))
        await ref.prompt("one")
        assert await rt.deactivate("a")
        assert (await ref.prompt("two")).text == "echo 2: two"
        assert await rt.deactivate("a")
        with trio.CancelScope() as scope:  # a caller cancelled during the activation
            scope.cancel()
            await ref.prompt("never")
        assert (await ref.prompt("three")).text == "echo 3: three"
        assert rt.stats["activations"] in (2, 3)


async def test_a_resumed_agent_deactivated_before_its_first_turn_keeps_its_history(
    tmp_path: Path, autojump_clock: Any
) -> None:
    async with open_runtime(checkpoint_dir=tmp_path / "ck", log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), config=cfg(tmp_path))
        await ref.prompt("one")
    async with open_runtime(checkpoint_dir=tmp_path / "ck", deactivate_after=1, log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), resume=True)
        await trio.sleep(2)
        assert not ref.resident
        # activated from the checkpoint it was resumed from, not rebuilt as a new State
        assert [m.text for m in (await ref.state()).messages] == ["one", "echo 1: one"]
        assert (await ref.prompt("two")).text == "echo 2: two"
    async with open_runtime(checkpoint_dir=tmp_path / "ck", log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), resume="require")
        assert [m.text for m in (await ref.state()).messages] == ["one", "echo 1: one", "two", "echo 2: two"]


async def test_messages_sent_before_a_deactivation_reach_the_next_turn(tmp_path: Path) -> None:
    # With instructions= the spawned state is not saved yet, so the deactivation commits it:
    # that commit must not drop the messages queued with send() (they are not in the state).
    async with open_runtime(checkpoint_dir=tmp_path / "ck", max_resident=5, log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), config=cfg(tmp_path), instructions="be brief")
        await ref.send("remember: the code is 42")
        await ref.ping()
        assert await rt.deactivate("a")
        assert (await ref.prompt("what is the code?")).text == "echo 2: what is the code?"
        texts = [m.text for m in (await ref.state()).messages]
        assert texts == ["be brief", "remember: the code is 42", "what is the code?", "echo 2: what is the code?"]


async def test_messages_sent_before_a_manual_compaction_reach_the_next_turn(tmp_path: Path) -> None:
    config = {**cfg(tmp_path), "compact_keep": ("messages", 2)}

    async def summarize(*_: object) -> str:
        return "## Task\n- counting"

    async with open_runtime(checkpoint_dir=tmp_path / "ck", log_events=False) as rt:
        ref = await rt.spawn("a", echo_model(), config=config, summarizer=summarize)
        for word in ("one", "two", "three", "four"):
            await ref.prompt(f"{word} " + "words " * 30)
        await ref.send("remember: the code is 42")
        assert isinstance(await ref.compact(), cmdc.Compacted)
        await ref.prompt("what is the code?")
        texts = [m.text for m in (await ref.state()).messages]
        assert texts[-3:-1] == ["remember: the code is 42", "what is the code?"]


async def test_a_deactivated_agent_keeps_only_a_few_hundred_bytes(tmp_path: Path) -> None:
    """What stays in memory per addressable agent once it is deactivated is small and does not
    grow with what it did (no State, no task, no mailbox, no per-agent empty list or grants):
    a million agents fit. (~270 B measured: its slot, its AgentRef, its name, its registry entry,
    the caller's list slot; 307 B before the grants moved into the slot.)"""
    import gc
    import tracemalloc

    class Quick:
        async def complete(self, request: ModelRequest) -> Message:
            return Message.assistant("ok", usage=cmdc.TokenUsage(input_tokens=20, output_tokens=1))

    provider = Quick()
    async with open_runtime(store=str(tmp_path / "s"), max_resident=10, log_events=False) as rt:
        refs = []

        async def run(names: list[str]) -> None:
            for name in names:
                ref = await rt.spawn(name, provider)
                await ref.prompt("hello " * 50)
                refs.append(ref)
            for name in rt.resident:  # none resident at either snapshot: what is left is per agent
                await rt.deactivate(name)
            await settle()

        await run([f"warm-{i:03d}" for i in range(100)])  # caches, the resident set at its bound
        # Three rounds of 300, the smallest growth counts: a thread that another test left
        # behind (a store's indexer, a pool) allocates during a round now and then, and what
        # it holds at the second snapshot is not this runtime's.
        rounds = []
        for r in range(3):
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.take_snapshot()
                await run([f"agent-{r}-{i:03d}" for i in range(300)])
                gc.collect()
                after = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            diff = after.compare_to(before, "lineno")
            rounds.append((sum(s.size_diff for s in diff) / 300, [str(s) for s in diff[:5]]))
        assert rt.resident == []
        per_agent, top = min(rounds)
        assert per_agent < 400, f"{per_agent:.0f} bytes per deactivated agent; grown most at:\n" + "\n".join(top)


async def test_the_runtime_and_its_store_forget_what_deactivated_agents_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the resident bound nothing per agent piles up: no checkpoint lock, lease, pending
    deactivation, subscription or journal cache of a deactivated agent stays (the store keeps
    a bounded number of journal caches); every agent comes back with its history and its journal
    numbers go on, with each record written once."""
    import cmdc.offload as offload

    monkeypatch.setattr(offload, "_JOURNALS_KEPT", 4)

    async def summarize(*_: object) -> str:
        return "## Task\n- counting"

    config = {"compact_keep": ("messages", 2)}
    async with open_runtime(store=str(tmp_path / "s"), max_resident=3, log_events=False) as rt:
        store = rt.store
        assert isinstance(store, cmdc.store.FileStore)
        refs = [await rt.spawn(f"n{i}", echo_model(), config=config, summarizer=summarize) for i in range(24)]
        for round_ in range(2):
            for i, ref in enumerate(refs):
                for k in range(4):
                    await ref.prompt(f"round {round_} turn {k} of {i} " + "words " * 30)
                assert isinstance(await ref.compact(), cmdc.Compacted)
                await settle()
                assert len(rt.resident) <= 3
                assert len(store.journal._journals) <= 4
                assert rt.checkpoints is not None and not rt.checkpoints._locks  # type: ignore[attr-defined]
                assert len(rt._leaving) <= 1 and not rt._leased and not rt.bus._by_agent
        assert rt.stats["agents"] == 24 and rt.stats["activations"] >= 24
        for i, ref in enumerate(refs):
            texts = [m.text for m in (await ref.state()).messages]
            assert texts[-1].split(": ", 1)[1] == f"round 1 turn 3 of {i} " + "words " * 30
            records = await store.records(f"n{i}")
            assert [r.seq for r in records] == list(range(1, len(records) + 1))  # once each, in order
            assert len(records) >= 4 and (await store.verify(f"n{i}")).clean
