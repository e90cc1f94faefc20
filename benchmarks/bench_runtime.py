"""The runtime's own costs, side by side with bare trio.

Run: python -m benchmarks.bench_runtime  (add --quick for a short run)

- spawning idle agents vs a task plus a memory channel each (seconds, RSS bytes per agent);
- a trivial request to an agent (`ping`, through its mailbox) vs a ping-pong over two channels;
- the runtime's cost per turn with an instantly answering provider, compaction on.
Each memory figure is measured in a fresh subprocess, so one does not inherit the other's heap.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.lowlevel
import trio.testing

import cmdc
from cmdc import Message, TokenUsage, ToolCall
from cmdc.providers import ModelRequest


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class Instant:
    """Answers at once: a tool call on a user message, text after a tool result."""

    async def complete(self, request: ModelRequest) -> Message:
        usage = TokenUsage(input_tokens=cmdc.estimate_tokens_from_messages(request.messages[-4:]), output_tokens=8)
        if request.metadata.get("cmdc.purpose") == "summarize":
            return Message.assistant("summary", usage=usage)
        if request.messages[-1].role == "user":
            return Message.assistant(
                "", tool_calls=(ToolCall(id="c", name="echo", arguments={"x": "hi"}),), usage=usage
            )
        return Message.assistant("done", usage=usage)


@cmdc.tool
async def echo(x: str) -> str:
    """Echo."""
    return x


async def spawn_baseline(n: int) -> dict[str, float]:
    async def idle(receive: trio.MemoryReceiveChannel[Any]) -> None:
        async for _ in receive:
            pass

    gc.collect()
    before = rss()
    t0 = time.perf_counter()
    keep = []
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            send, receive = trio.open_memory_channel[Any](16)
            keep.append(send)
            nursery.start_soon(idle, receive)
        await trio.testing.wait_all_tasks_blocked()  # every task has started and parked
        elapsed = time.perf_counter() - t0
        gc.collect()
        per = (rss() - before) / n
        nursery.cancel_scope.cancel()
    return {"seconds": elapsed, "bytes": per}


async def spawn_agents(n: int) -> dict[str, float]:
    provider = Instant()
    gc.collect()
    before = rss()
    t0 = time.perf_counter()
    async with cmdc.open_runtime(log_events=False) as rt:
        for i in range(n):
            await rt.spawn(f"a{i}", provider)
        await trio.testing.wait_all_tasks_blocked()  # every agent has started and parked
        elapsed = time.perf_counter() - t0
        gc.collect()
        per = (rss() - before) / n
    return {"seconds": elapsed, "bytes": per}


async def ping_pong(rounds: int) -> float:
    s1, r1 = trio.open_memory_channel[Any](16)  # buffered like an agent mailbox
    s2, r2 = trio.open_memory_channel[Any](16)

    async def echo_task() -> None:
        async for x in r1:
            await s2.send(x)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo_task)
        t0 = time.perf_counter()
        for i in range(rounds):
            await s1.send(i)
            await r2.receive()
        elapsed = time.perf_counter() - t0
        nursery.cancel_scope.cancel()
    return elapsed / rounds


async def agent_round_trip(rounds: int) -> float:
    async with cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn("pinger", Instant())
        t0 = time.perf_counter()
        for _ in range(rounds):
            await agent.ping()
        return (time.perf_counter() - t0) / rounds


async def turns(agents: int, per_agent: int) -> dict[str, float]:
    provider = Instant()
    with tempfile.TemporaryDirectory() as tmp:
        config = {"compact_offload_dir": tmp, "compact_trigger": ("messages", 12), "compact_keep": ("messages", 4)}
        durations: list[float] = []
        async with cmdc.open_runtime(log_events=False) as rt:
            refs = [await rt.spawn(f"t{i}", provider, tools=[echo], config=config) for i in range(agents)]

            async def work(ref: cmdc.AgentRef) -> None:
                for _ in range(per_agent):
                    t = time.perf_counter()
                    await ref.prompt("go")
                    durations.append(time.perf_counter() - t)

            t0, cpu0 = time.perf_counter(), time.process_time()
            async with trio.open_nursery() as nursery:
                for ref in refs:
                    nursery.start_soon(work, ref)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            compactions = sum([(await ref.state()).compactions for ref in refs])
    n = agents * per_agent
    return {
        "us_per_turn": elapsed / n * 1e6,
        "cpu_us_per_turn": cpu / n * 1e6,
        "turns": n,
        "compactions": compactions,
        "median_turn_latency_us": statistics.median(durations) * 1e6,
    }


def child(kind: str, n: int) -> None:
    fn = {"baseline": spawn_baseline, "agents": spawn_agents}[kind]
    print(json.dumps(trio.run(fn, n)))


ROOT = Path(__file__).resolve().parent.parent  # the directory `-m benchmarks...` runs from


def in_subprocess(kind: str, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_runtime", "--child", kind, str(n)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@attrs.frozen
class Figures:
    n: int  # idle agents spawned
    base: dict[str, float]  # {"seconds", "bytes"}: a trio task + a memory channel each
    agents: dict[str, float]  # the same for cmdc agents
    ping_pong: float  # seconds per round trip over two channels
    round_trip: float  # seconds per `agent.ping()`
    turn_agents: int
    turns_per_agent: int
    turns: dict[str, float]  # see `turns`

    @property
    def spawn_ratio(self) -> float:
        return self.agents["seconds"] / self.base["seconds"]

    @property
    def rss_ratio(self) -> float:
        return self.agents["bytes"] / self.base["bytes"]

    @property
    def round_trip_ratio(self) -> float:
        return self.round_trip / self.ping_pong


def measure(n: int = 10_000, rounds: int = 20_000, agents: int = 1_000, per_agent: int = 20) -> Figures:
    """Every figure of this benchmark (`main` prints them); the memory figures each come from a
    fresh subprocess."""
    base = in_subprocess("baseline", n)
    spawned = in_subprocess("agents", n)
    pp = trio.run(ping_pong, rounds)
    rt = trio.run(agent_round_trip, rounds)
    result = trio.run(turns, agents, per_agent)
    return Figures(n, base, spawned, pp, rt, agents, per_agent, result)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "N"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    n = 2_000 if args.quick else 10_000
    rounds = 5_000 if args.quick else 20_000
    a, t = (200, 10) if args.quick else (1_000, 20)
    f = measure(n, rounds, a, t)
    base, agents = f.base, f.agents
    print(f"cmdc runtime benchmark ({n:,} idle agents; baseline: a trio task + a memory channel each)")
    print(f"{'':28} {'baseline':>12} {'cmdc':>12} {'ratio':>7}  target")
    print(f"{'spawn, seconds':28} {base['seconds']:>12.3f} {agents['seconds']:>12.3f} {f.spawn_ratio:>7.2f}  <= 2")
    print(
        f"{'RSS per idle agent, bytes':28} {base['bytes']:>12,.0f} {agents['bytes']:>12,.0f} "
        f"{f.rss_ratio:>7.2f}  cmdc <= 16,384"
    )
    pp, rt = f.ping_pong, f.round_trip
    print(f"{'round trip, µs':28} {pp * 1e6:>12.1f} {rt * 1e6:>12.1f} {f.round_trip_ratio:>7.2f}  <= 3")
    result = f.turns
    print(f"\n{a:,} agents x {t} turns, all at once (a turn: request, tool call, request; compaction on,")
    print(
        f"every offload fsync'd): {result['us_per_turn']:.0f} µs per turn of wall time, "
        f"{result['cpu_us_per_turn']:.0f} µs of CPU; {result['turns']:,} turns, {result['compactions']:,} compactions"
    )


if __name__ == "__main__":
    main()
