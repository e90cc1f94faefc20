"""Load with faults: thousands of agents at once, compaction on, providers and tools failing.

Run: python -m benchmarks.load_faults [--agents 2000] [--turns 30] [--provider-faults 0.05]
                                       [--tool-faults 0.01] [--seed 1]

Every agent runs its turns one after another, all agents at once, in one trio run. A turn is a
request that calls a tool (or two), the tool calls, and a request that answers. The model is
fast and deterministic, but a fraction of its calls fail at random: half of them raise
`ProviderError`, half `ContextOverflow` (the agent compacts and retries). A fraction of the
tool calls raise (the agent gives the model an error result). Each agent compacts when its
context passes the token trigger; the summarizer is the offline extractive one, and every
offload is fsync'd.

Checked: every turn returns an assistant message or raises a typed `CmdcError` (never another
exception, never a hang); every agent ends consistent and on its own: each tool call in its
state has its result, its summary's compaction number is its count and the records it names are
on disk, the after_compact hook saw at least as many compactions as the state counts, and its
state and journal hold only its own messages, every acknowledged turn's prompt among them.

Then the stall check (`--recall-records`, 0 skips it): one agent recalls over a journal of that
many records while a neighbour answers pings; the longest scheduling stall every agent would see
is printed against its target (< 50 ms; see `benchmarks/recall_stall.py`).

Printed: turns per second, and per turn the runtime's overhead: the turn's wall time minus the
time spent inside the provider and the tools (under this load that includes waiting for the one
trio thread the agents share), and the runtime's CPU time (the trio-thread time of the agent's
tasks minus provider and tools), as percentiles.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.lowlevel

import cmdc
from benchmarks import recall_stall
from cmdc import (
    AfterCompact,
    CmdcError,
    ContextOverflow,
    Message,
    OffloadStore,
    Plugin,
    ProviderError,
    TokenUsage,
    ToolCall,
)
from cmdc.providers import ModelRequest
from cmdc.tokens import estimate_tokens_from_messages

TAG = re.compile(r"\[(a\d+)\]")
FILLER = "the parser reads the config, the cache holds the schema and the handler checks each value " * 3


@attrs.define
class AgentStats:
    name: str
    provider_calls: int = 0
    provider_errors: int = 0
    overflows: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    provider_time: float = 0.0
    tool_time: float = 0.0
    cpu: float = 0.0  # trio-thread time of the agent's tasks
    compactions: Counter[str] = attrs.field(factory=Counter)  # after_compact, by reason
    outcomes: Counter[str] = attrs.field(factory=Counter)
    acknowledged: list[str] = attrs.field(factory=list)  # prompt ids of completed turns
    overhead: list[float] = attrs.field(factory=list)
    cpu_overhead: list[float] = attrs.field(factory=list)
    problems: list[str] = attrs.field(factory=list)


class FaultyModel:
    """Answers at once: tool calls on a user message, text after tool results. A `fault_rate`
    share of its calls fail, half with `ProviderError`, half with `ContextOverflow`."""

    def __init__(self, stats: AgentStats, rng: random.Random, fault_rate: float) -> None:
        self.stats, self.rng, self.fault_rate = stats, rng, fault_rate
        self.ids = 0

    async def complete(self, request: ModelRequest) -> Message:
        t0 = time.perf_counter()
        try:
            stats, rng = self.stats, self.rng
            stats.provider_calls += 1
            if rng.random() < self.fault_rate:
                if rng.random() < 0.5:
                    stats.provider_errors += 1
                    raise ProviderError(f"[{stats.name}] injected provider failure")
                stats.overflows += 1
                raise ContextOverflow("prompt is too long (injected)", prompt_tokens=9_000, limit=8_000)
            usage = TokenUsage(input_tokens=estimate_tokens_from_messages(request.messages), output_tokens=40)
            last = request.messages[-1]
            if last.role == "user":
                calls = []
                for _ in range(rng.choice((1, 1, 2))):
                    self.ids += 1
                    tool = rng.choice(("lookup", "compute"))
                    args = {"key": f"{stats.name}-{self.ids}"} if tool == "lookup" else {"a": self.ids, "b": 2}
                    calls.append(ToolCall(id=f"t{self.ids}", name=tool, arguments=args))
                return Message.assistant("", tool_calls=calls, usage=usage)
            return Message.assistant(f"[{stats.name}] done: {FILLER[: rng.randint(100, 300)]}", usage=usage)
        finally:
            self.stats.provider_time += time.perf_counter() - t0


def make_tools(stats: AgentStats, rng: random.Random, fault_rate: float) -> list[cmdc.Tool]:
    def maybe_fail() -> None:
        stats.tool_calls += 1
        if rng.random() < fault_rate:
            stats.tool_errors += 1
            raise RuntimeError("injected tool failure")

    async def lookup(key: str) -> str:
        """Look a key up."""
        t0 = time.perf_counter()
        try:
            maybe_fail()
            return f"[{stats.name}] {key} = {FILLER[: 200 + len(key)]}"
        finally:
            stats.tool_time += time.perf_counter() - t0

    async def compute(a: int, b: int) -> int:
        """Multiply two integers."""
        t0 = time.perf_counter()
        try:
            maybe_fail()
            return a * b
        finally:
            stats.tool_time += time.perf_counter() - t0

    return [cmdc.tool(lookup), cmdc.tool(compute)]


class CountCompactions(Plugin):
    def __init__(self, stats: AgentStats) -> None:
        self.stats = stats

    async def after_compact(self, ctx: AfterCompact) -> None:
        self.stats.compactions[ctx.report.reason] += 1


class TaskTime(trio.abc.Instrument):
    """Trio-thread time per agent: its own task and the tasks it spawns (its tool calls)."""

    def __init__(self, by_name: dict[str, AgentStats]) -> None:
        self.by_name = by_name
        self.owner: dict[trio.lowlevel.Task, AgentStats] = {}
        self.t0 = 0.0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        stats = self.by_name.get(task.name)
        if stats is None and task.parent_nursery is not None:
            stats = self.owner.get(task.parent_nursery.parent_task)
        if stats is not None:
            self.owner[task] = stats

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.owner.pop(task, None)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.t0 = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        stats = self.owner.get(task)
        if stats is not None:
            stats.cpu += time.perf_counter() - self.t0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _drive(
    rt: Any,
    stats: AgentStats,
    turns: int,
    provider_faults: float,
    tool_faults: float,
    seed: int,
    config: dict[str, Any],
    refs: dict[str, Any],
) -> None:
    rng = random.Random(seed)
    agent = await rt.spawn(
        stats.name,
        FaultyModel(stats, random.Random(rng.random()), provider_faults),
        tools=make_tools(stats, random.Random(rng.random()), tool_faults),
        plugins=[CountCompactions(stats)],
        config=config,
        summarizer=cmdc.ExtractiveSummarizer(),
        compaction_cooldown=1.0,
    )
    refs[stats.name] = agent
    for turn in range(turns):
        prompt = Message.user(f"[{stats.name}] turn {turn}: please look into the parser and the cache. {FILLER[:120]}")
        before = (trio.current_time(), stats.provider_time, stats.tool_time, stats.cpu)
        try:
            with trio.fail_after(120):
                reply = await agent.prompt(prompt)
        except trio.TooSlowError:
            stats.outcomes["hung"] += 1
            stats.problems.append(f"turn {turn} hung")
            continue
        except CmdcError as exc:
            stats.outcomes[type(exc).__name__] += 1
        except Exception as exc:
            stats.outcomes["untyped"] += 1
            stats.problems.append(f"turn {turn}: untyped {exc!r}")
        else:
            if not isinstance(reply, Message) or reply.role != "assistant" or f"[{stats.name}]" not in reply.text:
                stats.problems.append(f"turn {turn}: odd reply {reply!r:.80}")
            stats.outcomes["completed"] += 1
            stats.acknowledged.append(prompt.id)
        wall = trio.current_time() - before[0]
        inside = (stats.provider_time - before[1]) + (stats.tool_time - before[2])
        stats.overhead.append(wall - inside)
        stats.cpu_overhead.append(stats.cpu - before[3] - inside)


async def _verify(stats: AgentStats, refs: dict[str, Any], store: OffloadStore) -> None:
    state = await refs[stats.name].state()
    problems = stats.problems
    calls = {c.id for m in state.messages for c in m.tool_calls}
    results = [m.tool_call_id for m in state.messages if m.role == "tool"]
    if calls != set(results) or len(results) != len(set(results)):
        problems.append("a tool call without its result, or a result without its call")
    summaries = [m for m in state.messages if m.is_summary]
    records = await store.records(stats.name)
    on_disk = {r.seq for r in records}
    if state.compactions:
        if len(summaries) != 1 or summaries[0].metadata.get("cmdc.compaction") != state.compactions:
            problems.append(f"{state.compactions} compactions but summaries {[s.metadata for s in summaries]}")
        for s in summaries:
            first, last = s.metadata["cmdc.first_seq"], s.metadata["cmdc.last_seq"]
            if not set(range(first, last + 1)) <= on_disk:
                problems.append(f"the summary names records {first}-{last}, not all on disk")
    elif summaries:
        problems.append("a summary but no compaction counted")
    if state.compactions > sum(stats.compactions.values()):
        problems.append(
            f"state counts {state.compactions} compactions, after_compact saw {sum(stats.compactions.values())}"
        )
    texts = [m.text for m in state.messages] + [r.message.text for r in records]
    strangers = {t for text in texts for t in TAG.findall(text)} - {stats.name}
    if strangers:
        problems.append(f"messages of other agents: {sorted(strangers)[:5]}")
    present = {m.id for m in state.messages} | {r.message.id for r in records}
    lost = [i for i in stats.acknowledged if i not in present]
    if lost:
        problems.append(f"{len(lost)} prompts of completed turns are lost")


def run(
    agents: int = 2_000,
    turns: int = 30,
    *,
    provider_faults: float = 0.05,
    tool_faults: float = 0.01,
    seed: int = 1,
    trigger: int = 2_000,
    directory: Path | None = None,
    out: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the load; return its figures (`failures` lists what went wrong, if anything).
    `trigger`: the compaction token trigger (each turn adds about 250 tokens)."""
    with tempfile.TemporaryDirectory(prefix="cmdc-load-") as tmp:
        where = directory if directory is not None else Path(tmp)
        config = {
            "compact_offload_dir": str(where / "offload"),
            "compact_trigger": ("tokens", trigger),
            "compact_keep": ("messages", 6),
            "context_window": 8_000,
        }
        all_stats = [AgentStats(f"a{i}") for i in range(agents)]
        by_name = {s.name: s for s in all_stats}
        refs: dict[str, Any] = {}
        timing: dict[str, float] = {}

        async def main() -> None:
            instrument = TaskTime(by_name)
            trio.lowlevel.add_instrument(instrument)
            try:
                async with cmdc.open_runtime(log_events=False) as rt:
                    t0, c0 = time.perf_counter(), time.process_time()
                    async with trio.open_nursery() as nursery:
                        for i, stats in enumerate(all_stats):
                            nursery.start_soon(
                                _drive,
                                rt,
                                stats,
                                turns,
                                provider_faults,
                                tool_faults,
                                seed * 1_000_003 + i,
                                config,
                                refs,
                            )
                    timing["wall"], timing["cpu"] = time.perf_counter() - t0, time.process_time() - c0
                    trio.lowlevel.remove_instrument(instrument)
                    store = OffloadStore(where / "offload")
                    limiter = trio.CapacityLimiter(32)

                    async def verify(stats: AgentStats) -> None:
                        async with limiter:
                            await _verify(stats, refs, store)

                    async with trio.open_nursery() as nursery:
                        for stats in all_stats:
                            nursery.start_soon(verify, stats)
            finally:
                with contextlib.suppress(KeyError):  # already removed once the turns were done
                    trio.lowlevel.remove_instrument(instrument)

        trio.run(main)

    outcomes: Counter[str] = Counter()
    compactions: Counter[str] = Counter()
    for s in all_stats:
        outcomes.update(s.outcomes)
        compactions.update(s.compactions)
    failures = [f"{s.name}: {p}" for s in all_stats for p in s.problems]
    total = agents * turns
    overhead = [x for s in all_stats for x in s.overhead]
    cpu_overhead = [x for s in all_stats for x in s.cpu_overhead]
    figures: dict[str, Any] = {
        "agents": agents,
        "turns": total,
        "completed": outcomes["completed"],
        "typed_errors": {k: v for k, v in outcomes.items() if k not in ("completed", "untyped", "hung")},
        "untyped": outcomes["untyped"],
        "hung": outcomes["hung"],
        "provider_calls": sum(s.provider_calls for s in all_stats),
        "provider_errors": sum(s.provider_errors for s in all_stats),
        "overflows": sum(s.overflows for s in all_stats),
        "tool_calls": sum(s.tool_calls for s in all_stats),
        "tool_errors": sum(s.tool_errors for s in all_stats),
        "compactions": dict(compactions),
        "consistent_agents": sum(1 for s in all_stats if not s.problems),
        "wall": timing["wall"],
        "cpu": timing["cpu"],
        "turns_per_second": total / timing["wall"],
        "overhead_p50": percentile(overhead, 0.50),
        "overhead_p99": percentile(overhead, 0.99),
        "cpu_overhead_p50": percentile(cpu_overhead, 0.50),
        "cpu_overhead_p99": percentile(cpu_overhead, 0.99),
        "cpu_overhead_mean": statistics.fmean(cpu_overhead) if cpu_overhead else 0.0,
        "failures": failures,
    }
    report(figures, provider_faults, tool_faults, out)
    return figures


def report(f: dict[str, Any], provider_faults: float, tool_faults: float, out: Callable[[str], None]) -> None:
    for failure in f["failures"][:20]:
        out(f"FAILED {failure}")
    typed = ", ".join(f"{k} {v:,}" for k, v in sorted(f["typed_errors"].items(), key=lambda kv: -kv[1])) or "none"
    out(
        f"load with faults: {f['agents']:,} agents x {f['turns'] // max(1, f['agents'])} turns at once, "
        f"compaction on; {provider_faults:.0%} of provider calls fail (ProviderError or ContextOverflow), "
        f"{tool_faults:.0%} of tool calls raise"
    )
    out(
        f"turns: {f['turns']:,}: {f['completed']:,} completed, {sum(f['typed_errors'].values()):,} typed errors "
        f"({typed}), {f['untyped']} untyped, {f['hung']} hung"
    )
    out(
        f"provider calls: {f['provider_calls']:,} ({f['provider_errors']:,} ProviderError, "
        f"{f['overflows']:,} overflows injected); tool calls: {f['tool_calls']:,} "
        f"({f['tool_errors']:,} raised, each an error result)"
    )
    kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(f["compactions"].items()))
    out(
        f"compactions: {sum(f['compactions'].values()):,} ({kinds}); agents consistent and on their own: "
        f"{f['consistent_agents']:,}/{f['agents']:,}; failures: {len(f['failures'])}"
    )
    out(f"throughput: {f['turns_per_second']:,.0f} turns/s ({f['wall']:.1f} s wall, {f['cpu']:.1f} s CPU)")
    out(
        f"runtime overhead per turn (wall - provider - tools), under this load: p50 {f['overhead_p50'] * 1e3:.1f} ms, "
        f"p99 {f['overhead_p99'] * 1e3:.1f} ms (includes waiting for the trio thread {f['agents']:,} agents share)"
    )
    out(
        f"runtime CPU per turn (trio-thread time of the agent's tasks - provider - tools): "
        f"p50 {f['cpu_overhead_p50'] * 1e3:.2f} ms, p99 {f['cpu_overhead_p99'] * 1e3:.2f} ms, "
        f"mean {f['cpu_overhead_mean'] * 1e3:.2f} ms"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--agents", type=int, default=2_000)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--provider-faults", type=float, default=0.05)
    parser.add_argument("--tool-faults", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trigger", type=int, default=2_000, help="compaction token trigger (a turn adds ~250)")
    parser.add_argument("--dir", type=Path, default=None, help="keep the journals here (default: a temp dir)")
    parser.add_argument(
        "--recall-records", type=int, default=5_000, help="then: the stall check's journal size (0: skip it)"
    )
    parser.add_argument("--recall-big-mb", type=int, default=0, help="the stall check: add one record of this many MB")
    args = parser.parse_args(argv)
    figures = run(
        args.agents,
        args.turns,
        provider_faults=args.provider_faults,
        tool_faults=args.tool_faults,
        seed=args.seed,
        trigger=args.trigger,
        directory=args.dir,
    )
    missed = False
    if args.recall_records > 0:
        print("\nstall check: one agent recalls over a large journal while a neighbour answers pings")
        stall = recall_stall.run(args.recall_records, args.recall_big_mb, args.seed)
        missed = not stall["answered"]
    sys.exit(1 if figures["failures"] or missed else 0)


if __name__ == "__main__":
    main()
