"""The runtime at scale: a thousand agents at once, a simulated session of 200 turns."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.lowlevel
from fakes import Adder, add, agent_config

from cmdc import (
    ContextOverflow,
    open_runtime,
)
from cmdc.providers import SimulatedModel
from cmdc.testing import drain


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
                    config=agent_config(tmp_path, compact_trigger=("messages", 8), compact_keep=("messages", 3)),
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
            config=agent_config(tmp_path, compact_trigger=("tokens", 100_000), compact_keep=("messages", 4)),
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
