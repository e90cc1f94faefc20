"""The web page's costs (cmdc.ui, extra `ui`).

Run: python -m benchmarks.bench_ui  [--agents 1000] [--turn-agents 100] [--turns 10] [--reps 9]

- the agents page of a live runtime with 1,000 agents (each has run a turn): the server's time
  to build the page (its `Server-Timing: app` header, median of 20 requests) and the whole
  request over loopback; target < 300 ms;
- the same page of a store with 1,000 checkpointed agents (`cmdc ui DIR`), first and cached;
- what live updates add to a turn: CPU per turn of the runtime's turn benchmark
  (`bench_runtime.turns`: an instant provider, a tool call per turn, compaction on) without the
  page, and with it served and a live page open (a `curl` process reading `/events`, as a
  browser's agents page does), in `reps` back-to-back pairs; the median pair ratio; target < 5 %.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import attrs
import httpx
import trio

import cmdc
from benchmarks.bench_runtime import Instant, echo
from cmdc import Message, State
from cmdc.store import FileStore

PAGE_TARGET_MS = 300.0
OVERHEAD_TARGET = 0.05


@attrs.frozen
class Figures:
    agents: int
    page_ms: float  # server time, live runtime
    page_round_trip_ms: float
    page_bytes: int
    store_first_ms: float
    store_cached_ms: float
    turn_cpu_us: float  # without the page
    turn_cpu_us_page: float  # with the page open
    turns: int
    updates: int  # live updates the page received
    overhead: float  # the median of the pairs' ratios (with / without), minus 1
    thread_overhead: float  # the same for the trio thread's CPU alone (the runtime's own work)


def _server_ms(response: httpx.Response) -> float:
    timing = response.headers["server-timing"]
    return float(timing.split("dur=", 1)[1])


async def _page_times(server: Any, requests: int) -> tuple[float, float, int]:
    base = f"http://127.0.0.1:{server.port}"
    cookies = {f"cmdc-ui-{server.port}": server.token}
    server_ms: list[float] = []
    trips: list[float] = []
    size = 0
    async with httpx.AsyncClient(base_url=base, cookies=cookies, timeout=60) as client:
        for _ in range(requests):
            t = time.perf_counter()
            response = await client.get("/")
            trips.append((time.perf_counter() - t) * 1000)
            response.raise_for_status()
            server_ms.append(_server_ms(response))
            size = len(response.content)
    return statistics.median(server_ms), statistics.median(trips), size


async def live_page(agents: int, requests: int = 20) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        config = {"compact_offload_dir": tmp, "compact_trigger": ("messages", 12), "compact_keep": ("messages", 4)}
        async with cmdc.open_runtime(log_events=False) as rt:
            refs = [await rt.spawn(f"agent-{i}", Instant(), tools=[echo], config=config) for i in range(agents)]
            async with trio.open_nursery() as nursery:
                for ref in refs:
                    nursery.start_soon(ref.prompt, "go")
            server = await rt.serve_ui()
            rows = await _page_times(server, requests)
            assert rows[2] > agents * 500, "every agent's row is in the page"
            return rows


async def store_page(agents: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(tmp)
        config = {"compact_trigger": ("tokens", 5_000), "context_window": 8_000}
        for i in range(agents):
            state = State(agent_id=f"agent-{i}", messages=(Message.user(f"task {i}"),), config=config)
            await store.checkpoints.save(state)
        async with trio.open_nursery() as nursery:
            server = await nursery.start(cmdc.ui.serve_store, tmp)
            first, _, _ = await _page_times(server, 1)
            cached, _, _ = await _page_times(server, 10)
            nursery.cancel_scope.cancel()
        return first, cached


async def _turns(agents: int, per_agent: int, page: bool) -> tuple[float, int, int, float]:
    """CPU µs per turn (and turns, updates received, the trio thread's CPU µs per turn) of
    bench_runtime's turn workload."""
    with tempfile.TemporaryDirectory() as tmp:
        config = {"compact_offload_dir": tmp, "compact_trigger": ("messages", 12), "compact_keep": ("messages", 4)}
        async with cmdc.open_runtime(log_events=False) as rt:
            refs = [await rt.spawn(f"t{i}", Instant(), tools=[echo], config=config) for i in range(agents)]
            reader = None
            out_path = trio.Path(tmp) / "events.txt"
            if page:
                server = await rt.serve_ui()
                out = await trio.to_thread.run_sync(open, str(out_path), "wb")
                with out:
                    reader = await trio.lowlevel.open_process(
                        [
                            "curl",
                            "-sN",
                            "--cookie",
                            f"cmdc-ui-{server.port}={server.token}",
                            f"http://127.0.0.1:{server.port}/events",
                        ],
                        stdout=out,
                    )
                with trio.fail_after(30):
                    while (await out_path.stat()).st_size == 0:  # noqa: ASYNC110 (connected: its first line came)
                        await trio.sleep(0.01)

            async def work(ref: cmdc.AgentRef) -> None:
                for _ in range(per_agent):
                    await ref.prompt("go")

            cpu0, thread0 = time.process_time(), time.thread_time()
            async with trio.open_nursery() as nursery:
                for ref in refs:
                    nursery.start_soon(work, ref)
            cpu, thread = time.process_time() - cpu0, time.thread_time() - thread0
            updates = 0
            if reader is not None:
                await trio.sleep(1.0)  # the last coalesced update
                reader.terminate()
                await reader.wait()
                updates = (await out_path.read_bytes()).count(b"\ndata: ")
    n = agents * per_agent
    return cpu / n * 1e6, n, updates, thread / n * 1e6


async def overhead(agents: int, per_agent: int, reps: int) -> tuple[float, float, int, int, float, float]:
    """Runs without and with the page, alternated (each pair back to back, so a neighbour's
    load on the shared machine weighs on both alike); medians, and the median pair ratio."""
    plain: list[float] = []
    paged: list[float] = []
    ratios: list[float] = []
    thread_ratios: list[float] = []
    updates = 0
    n = 0
    await _turns(agents, per_agent, False)  # warm up
    for i in range(reps):
        order = (False, True) if i % 2 == 0 else (True, False)
        pair = {}
        threads = {}
        for page in order:
            cpu, n, got, thread = await _turns(agents, per_agent, page)
            pair[page], threads[page] = cpu, thread
            updates = max(updates, got)
        plain.append(pair[False])
        paged.append(pair[True])
        ratios.append(pair[True] / pair[False])
        thread_ratios.append(threads[True] / threads[False])
    ratio, thread_ratio = statistics.median(ratios) - 1, statistics.median(thread_ratios) - 1
    return statistics.median(plain), statistics.median(paged), n, updates, ratio, thread_ratio


def measure(agents: int = 1_000, turn_agents: int = 100, turns: int = 10, reps: int = 9) -> Figures:
    page_ms, trip_ms, size = trio.run(live_page, agents)
    first, cached = trio.run(store_page, agents)
    plain, paged, n, updates, ratio, thread_ratio = trio.run(overhead, turn_agents, turns, reps)
    return Figures(agents, page_ms, trip_ms, size, first, cached, plain, paged, n, updates, ratio, thread_ratio)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=1_000)
    parser.add_argument("--turn-agents", type=int, default=100)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    f = measure(args.agents, args.turn_agents, args.turns, args.reps)
    ok = "ok" if f.page_ms < PAGE_TARGET_MS else "MISSED"
    print(f"agents page, {f.agents:,} live agents: {f.page_ms:.1f} ms server time (target < 300 ms: {ok}); ", end="")
    print(f"{f.page_round_trip_ms:.1f} ms round trip, {f.page_bytes / 1e6:.2f} MB")
    print(
        f"agents page, {f.agents:,} agents of a store: {f.store_first_ms:.1f} ms first, "
        f"{f.store_cached_ms:.1f} ms cached"
    )
    ok = "ok" if f.overhead < OVERHEAD_TARGET else "MISSED"
    print(
        f"a turn's CPU: {f.turn_cpu_us:,.0f} µs without the page, {f.turn_cpu_us_page:,.0f} µs with a live page open "
        f"(median of {args.reps} pairs: {f.overhead:+.1%}, target < 5%: {ok}; the trio thread's CPU alone: "
        f"{f.thread_overhead:+.1%}; {f.turns:,} turns a run, {f.updates} coalesced updates sent)"
    )


if __name__ == "__main__":
    main()
