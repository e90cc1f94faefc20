"""The trio loop's longest stall while one agent's turn runs beside a chatty neighbour: shared by
the stall benchmarks (argument_stall, mcp_stall)."""

from __future__ import annotations

import time

import trio

from cmdc import AgentRef


async def turn_beside_a_neighbour(agent: AgentRef, neighbour: AgentRef, prompt: str = "go") -> tuple[float, float, int]:
    """Run `agent.prompt(prompt)` while a probe sleeps 2 ms at a time (how late it wakes is the
    loop's stall) and `neighbour` answers prompts in a loop: (the turn's seconds, the longest
    stall in seconds, the neighbour's turns meanwhile)."""
    worst = 0.0
    turns = 0
    done = trio.Event()

    async def probe() -> None:
        nonlocal worst
        while not done.is_set():
            t = trio.current_time()
            await trio.sleep(0.002)
            worst = max(worst, trio.current_time() - t - 0.002)

    async def chat() -> None:
        nonlocal turns
        while not done.is_set():
            await neighbour.prompt("q")
            turns += 1

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe)
        nursery.start_soon(chat)
        await agent.prompt(prompt)
        elapsed = time.perf_counter() - t0
        done.set()
    return elapsed, worst, turns
