"""One tool call with a huge number of argument keys does not stall the runtime: the trio loop's
longest stall and the agent's turn while a model (OpenAI's reply format, served in memory)
asks for one call with `--keys` argument keys.

Run: python -m benchmarks.argument_stall [--keys 800000]

Printed: the reply's size, the turn's duration, the longest stall (a probe task sleeping 2 ms
at a time records how late it wakes), the neighbour agent's answered prompts, and the size of
the tool result the model reads back.
"""

from __future__ import annotations

import argparse
from typing import Any

import httpx
import orjson
import trio

import cmdc
from benchmarks._stall import turn_beside_a_neighbour
from cmdc.providers import OpenAIProvider, ScriptedProvider


def reply(keys: int) -> bytes:
    arguments = orjson.dumps({f"k{i}": i for i in range(keys)}).decode()
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": arguments}}
    first = {"role": "assistant", "content": None, "tool_calls": [call]}
    return orjson.dumps({"choices": [{"index": 0, "message": first, "finish_reason": "tool_calls"}]})


async def run(keys: int) -> None:
    body = reply(keys)
    done = {"role": "assistant", "content": "done"}
    final = orjson.dumps({"choices": [{"index": 0, "message": done, "finish_reason": "stop"}]})
    answers = iter([body, final])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=next(answers), headers={"content-type": "application/json"})

    provider = OpenAIProvider(
        "m", api_key="k", max_retries=0, client=httpx.AsyncClient(transport=httpx.MockTransport(answer))
    )

    @cmdc.tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async with cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", provider, tools=[add])
        neighbour = await rt.spawn("n1", ScriptedProvider([f"a{i}" for i in range(100_000)]))
        elapsed, worst, pings = await turn_beside_a_neighbour(agent, neighbour)
        state = await agent.state()
    result: Any = next(m for m in state.messages if m.role == "tool")
    print(
        f"keys {keys:,}: reply {len(body) / 2**20:.1f} MiB; turn {elapsed:.2f} s; longest stall {worst * 1000:.0f} ms;"
    )
    print(f"  neighbour answered {pings} prompts meanwhile; the tool result is {len(result.content):,} characters:")
    print(f"  {result.content[:200]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=800_000)
    trio.run(run, parser.parse_args().keys)


if __name__ == "__main__":
    main()
