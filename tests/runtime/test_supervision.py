"""Supervision: one agent's crash never reaches another, restart policies (permanent,
transient, temporary), resuming from a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
from fakes import Adder, add, agent_config

from cmdc import (
    AgentStopped,
    Message,
    OffloadStore,
    ProviderError,
    open_runtime,
    tool,
)
from cmdc.providers import ModelRequest, ScriptedProvider


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
        healthy = await rt.spawn("healthy", Adder(), tools=[add], config=agent_config(tmp_path))
        tooly = await rt.spawn(
            "tooly",
            ScriptedProvider([ScriptedProvider.tool_call("explode", {}), "handled"]),
            tools=[explode],
            config=agent_config(tmp_path),
        )
        failing = await rt.spawn("failing", BadModel(ProviderError("503")), config=agent_config(tmp_path))
        crashy = await rt.spawn("crashy", crashing, config=agent_config(tmp_path), restart="permanent")
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
            "temp", ScriptedProvider([RuntimeError("x")]), config=agent_config(tmp_path), restart="temporary"
        )
        with pytest.raises(RuntimeError):
            await temp.prompt("hi")
        await trio.sleep(0.1)
        assert not temp.running and rt.whereis("temp") is None
        with pytest.raises(AgentStopped):
            await temp.prompt("again")

        trans = await rt.spawn(
            "trans", ScriptedProvider([RuntimeError("x")], cycle=True), config=agent_config(tmp_path), max_restarts=2
        )
        for _ in range(3):
            with pytest.raises(RuntimeError):
                await trans.prompt("hi")
        await trio.sleep(0.1)
        assert not trans.running


async def test_resume_from_checkpoint(tmp_path: Path) -> None:
    cfg = agent_config(tmp_path, compact_trigger=("messages", 6), compact_keep=("messages", 2))
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
