"""A huge MCP tool result does not stall the runtime: the trio loop's longest stall, and a
neighbour agent's turns, while one agent's stdio MCP server answers with one line of N MB.

Run: python -m benchmarks.mcp_stall [--mb 5 10 20 100] [--sdk] [--repeat 3]

The server is tests/_support/mcp_hostile.py (its `huge` tool writes the text in 1 MiB pieces). Meanwhile
a probe task sleeps 2 ms at a time and records how late it wakes (the stall every agent sees)
and a neighbour agent answers prompts. Printed per size: the call's duration, the longest
stall (median and worst of `--repeat` runs: on a loaded machine the scheduler's own noise shows
in single runs), the neighbour's turns per second, and the result's size. `--sdk` reads with the MCP
SDK's own stdio transport (what cmdc used before: the line re-joined per chunk, quadratic, on
the trio thread) for the before figures; give it small sizes (20 MB took 18 s).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from pathlib import Path
from typing import Any

import trio

import cmdc
import cmdc.mcp
from benchmarks._stall import turn_beside_a_neighbour
from cmdc.providers import ScriptedProvider

HOSTILE = str(Path(__file__).resolve().parent.parent / "tests" / "_support" / "mcp_hostile.py")


def _use_the_sdk_transport() -> None:
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    def transport(self: cmdc.mcp.MCPTools, errlog: Any, link: Any) -> Any:
        assert isinstance(self.target, StdioServerParameters)
        return stdio_client(self.target, errlog=errlog) if errlog is not None else stdio_client(self.target)

    cmdc.mcp.MCPTools._transport = transport  # type: ignore[method-assign]


async def one(mb: int) -> tuple[float, float, float, int]:
    size = mb * 1024 * 1024
    server = cmdc.mcp.stdio(sys.executable, HOSTILE, name="hostile", restarts=None)
    provider = ScriptedProvider([ScriptedProvider.tool_call("huge", {"size": size}), "done"])
    async with cmdc.open_runtime(log_events=False) as rt:
        # no cap at arrival (the tiers'): what is measured is the MCP reader and its own clip
        agent = await rt.spawn("a1", provider, tools=[server], config={"tool_result_limit": None})
        neighbour = await rt.spawn("n1", ScriptedProvider([f"a{i}" for i in range(100_000)]))
        gc.collect()
        gc.freeze()  # the setup's objects (the neighbour's script) are not the reader's to scan
        elapsed, worst, turns = await turn_beside_a_neighbour(agent, neighbour)
        state = await agent.state()
    result = next(m for m in state.messages if m.role == "tool")
    return elapsed, worst * 1000, turns / elapsed, len(result.text.encode())


async def idle(seconds: float = 2.0) -> float:
    """The longest stall of the probe alone: the machine's own noise, for comparison."""
    worst = 0.0
    end = trio.current_time() + seconds
    while trio.current_time() < end:
        t = trio.current_time()
        await trio.sleep(0.002)
        worst = max(worst, trio.current_time() - t - 0.002)
    return worst * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[5, 10, 20, 100])
    parser.add_argument("--sdk", action="store_true", help="the MCP SDK's own stdio transport (before)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size (the median and worst are shown)")
    args = parser.parse_args()
    if args.sdk:
        _use_the_sdk_transport()
    reader = "MCP SDK stdio_client" if args.sdk else "cmdc stdio transport"
    print(f"reader: {reader}; idle (the machine's own noise): longest stall {trio.run(idle):.1f} ms")
    head = f"{'MB':>5} {'call s':>8} {'longest stall ms: median':>25} {'worst':>7}"
    print(f"{head} {'neighbour turns/s':>18} {'result bytes':>13}")
    for mb in args.mb:
        runs = [trio.run(one, mb) for _ in range(args.repeat)]
        elapsed = statistics.median(r[0] for r in runs)
        stalls = [r[1] for r in runs]
        rate = statistics.median(r[2] for r in runs)
        median, worst, size = statistics.median(stalls), max(stalls), runs[-1][3]
        print(f"{mb:>5} {elapsed:>8.2f} {median:>25.1f} {worst:>7.1f} {rate:>18.1f} {size:>13,}", flush=True)


if __name__ == "__main__":
    main()
