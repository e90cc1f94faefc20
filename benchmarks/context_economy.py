"""Context economy: what the cheap tiers save on long, tool-heavy coding sessions.

Seeded coding sessions (user requests naming files, with facts to remember; tools that read
files of several KB, run tests whose logs are sometimes huge, grep, diff) run with
`SimulatedModel` (a 128k window, compaction at 85% of it) under three policies:

- summary only: no caps, no masking (cmdc before issue 29);
- masking + summary: old tool results masked past half the trigger, no caps;
- caps + masking + summary: the defaults.

Per policy: the prompt tokens of every model request over the session (the cost; the
summarizer's requests are counted apart), the peak context, summarizer calls, prefix breaks
(requests whose messages do not extend the previous request's), thrash events, and retention
probes: the user's facts still in the context, the files touched still named in it, and the
tool outputs' facts recoverable (in the context or the journal). Checked at every tenth turn.

Targets: caps + masking + summary at most 50% of the summary-only prompt tokens and at most a
third of its summarizer calls, retention no lower; no thrash event.

Run: python -m benchmarks.context_economy [--turns N] [--seeds N]

The session generator (`coding_session`) is small and local; it has the shape of the retention
benchmark's (a list of turns, each a user message and the probes it plants) to switch to it.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from benchmarks._table import Row, check, render
from cmdc import Message, OffloadStore, open_runtime, tool
from cmdc.providers import ModelRequest, SimulatedModel
from cmdc.providers.simulated import PURPOSE_KEY, SUMMARIZE

WINDOW = 128_000
POLICIES: dict[str, dict[str, Any]] = {
    "summary only": {"mask_tool_results": False, "tool_result_limit": None},
    "masking + summary": {"tool_result_limit": None},
    "caps + masking + summary": {},
}
MODULES = ["billing", "invoice", "ledger", "retry", "auth", "export", "schema", "client", "worker", "report"]


# -- the seeded session ----------------------------------------------------------------------------


@attrs.frozen
class Turn:
    text: str
    facts: tuple[str, ...] = ()  # tokens the user states: must stay in the context
    files: tuple[str, ...] = ()  # paths named: must stay named in the context


def coding_session(seed: int, turns: int) -> list[Turn]:
    """A long coding session: each turn asks for work on one or two files; every fourth turn
    states a fact to remember (a ticket, a limit, a name)."""
    rng = random.Random(seed)
    out = []
    for i in range(turns):
        files = tuple(f"src/{rng.choice(MODULES)}/{rng.choice(MODULES)}_{rng.randint(1, 40)}.py" for _ in range(2))
        verb = rng.choice(["Fix the failing test around", "Refactor", "Add logging to", "Review", "Speed up"])
        text = f"Turn {i}: {verb} {files[0]} and check {files[1]}; run the tests after."
        facts: tuple[str, ...] = ()
        if i % 4 == 0:
            fact = f"FACT-{seed}-{i}-{rng.randint(1000, 9999)}"
            text += f" Remember for later: the release code is {fact}."
            facts = (fact,)
        out.append(Turn(text, facts, files))
    return out


def _rng(*parts: object) -> random.Random:
    return random.Random(hashlib.sha256(repr(parts).encode()).digest())


def make_tools(seed: int) -> list[Any]:
    """Deterministic tools: the same arguments give the same output."""

    @tool
    async def read_file(path: str) -> str:
        """Read a source file."""
        rng = _rng(seed, "read", path)
        lines = [f"# {path}"]
        for n in range(rng.randint(120, 320)):
            lines.append(f"def f{n}(x):  return x * {rng.randint(2, 99)}  # {rng.choice(MODULES)} helper")
        return "\n".join(lines)

    @tool
    async def run_tests(target: str) -> str:
        """Run the test suite for a target."""
        rng = _rng(seed, "tests", target)
        huge = rng.random() < 0.2  # a verbose log now and then: 60-120 KB
        lines = [f"collected {rng.randint(50, 400)} items ({target})"]
        for n in range(rng.randint(1_000, 2_000) if huge else rng.randint(40, 120)):
            lines.append(f"tests/test_{rng.choice(MODULES)}.py::test_case_{n} PASSED [{n % 100:3d}%]")
        lines.append(
            f"FAILED tests/test_{rng.choice(MODULES)}.py::test_edge - AssertionError: code E{rng.randint(100, 999)}"
        )
        return "\n".join(lines)

    @tool
    async def grep(pattern: str) -> str:
        """Search the code base."""
        rng = _rng(seed, "grep", pattern)
        return "\n".join(
            f"src/{rng.choice(MODULES)}/{rng.choice(MODULES)}.py:{rng.randint(1, 400)}: {pattern} = call_{n}()"
            for n in range(rng.randint(10, 60))
        )

    @tool
    async def git_diff(path: str) -> str:
        """Show the working tree's diff of a file."""
        rng = _rng(seed, "diff", path)
        return "\n".join(
            f"{'+-'[n % 2]} line {n}: value = {rng.randint(0, 10**6)}" for n in range(rng.randint(30, 150))
        )

    @tool
    async def list_dir(path: str) -> str:
        """List a directory."""
        rng = _rng(seed, "ls", path)
        return "\n".join(f"{path.rsplit('/', 1)[0]}/{rng.choice(MODULES)}_{n}.py" for n in range(rng.randint(5, 40)))

    return [read_file, run_tests, grep, git_diff, list_dir]


# -- the meter -------------------------------------------------------------------------------------


class Meter:
    """A provider around the model that counts what each request costs and where prefixes break."""

    def __init__(self, model: SimulatedModel) -> None:
        self.model = model
        self.prompt_tokens = 0
        self.summarizer_tokens = 0
        self.summarizer_calls = 0
        self.requests = 0
        self.peak = 0
        self.breaks = 0
        self._previous: list[tuple[Any, ...]] | None = None

    async def complete(self, request: ModelRequest) -> Message:
        tokens = self.model.prompt_tokens(request)
        if request.metadata.get(PURPOSE_KEY) == SUMMARIZE:
            self.summarizer_calls += 1
            self.summarizer_tokens += tokens
        else:
            self.requests += 1
            self.prompt_tokens += tokens
            self.peak = max(self.peak, tokens)
            seen = [_visible(m) for m in request.messages]
            previous = self._previous
            if previous is not None and seen[: len(previous)] != previous:
                self.breaks += 1
            self._previous = seen
        return await self.model.complete(request)


def _visible(m: Message) -> tuple[Any, ...]:
    """What a provider sends of a message (its id is not sent)."""
    calls = tuple((c.id, c.name, tuple(sorted((k, repr(v)) for k, v in c.arguments.items()))) for c in m.tool_calls)
    return (m.role, m.text, m.tool_call_id, m.is_error, calls)


# -- a run -----------------------------------------------------------------------------------------


@attrs.frozen
class Result:
    policy: str
    prompt_tokens: int
    summarizer_tokens: int
    peak: int
    summarizer_calls: int
    requests: int
    breaks: int
    thrash: int
    failed_turns: int
    facts: float
    files: float
    recoverable: float


async def run_policy(policy: str, seed: int, turns: int, root: Path) -> Result:
    session = coding_session(seed, turns)
    model = SimulatedModel(WINDOW, seed=seed, tool_probability=0.95, max_tool_rounds=6)
    meter = Meter(model)
    config = {
        "context_window": WINDOW,
        "compact_trigger": ("fraction", 0.85),
        "compact_offload_dir": str(root / "journal"),
        **POLICIES[policy],
    }
    store = OffloadStore(root / "journal")
    thrash = failed = 0
    scores: list[tuple[float, float, float]] = []
    async with open_runtime(log_events=False) as rt:
        with rt.subscribe("dev", buffer=100_000) as sub:
            agent = await rt.spawn("dev", meter, tools=make_tools(seed), config=config, instructions="You write code.")
            for i, turn in enumerate(session):
                try:
                    await agent.prompt(turn.text)
                except Exception:  # a failed turn is counted, the session goes on
                    failed += 1
                while True:
                    try:
                        event = sub.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    thrash += event.kind == "compaction_thrash"
                if (i + 1) % 10 == 0 or i + 1 == len(session):
                    scores.append(await _retention(await agent.state(), store, session[: i + 1]))
    n = len(scores)
    return Result(
        policy,
        meter.prompt_tokens,
        meter.summarizer_tokens,
        meter.peak,
        meter.summarizer_calls,
        meter.requests,
        meter.breaks,
        thrash,
        failed,
        sum(s[0] for s in scores) / n,
        sum(s[1] for s in scores) / n,
        sum(s[2] for s in scores) / n,
    )


async def _retention(state: Any, store: OffloadStore, turns: Sequence[Turn]) -> tuple[float, float, float]:
    """(user facts in the context, files touched named in it, tool output facts recoverable)."""
    context = "\n".join(
        [m.text for m in state.messages] + [str(c.arguments) for m in state.messages for c in m.tool_calls]
    )
    facts = [f for t in turns for f in t.facts]
    files = [f for t in turns for f in t.files]
    journal = "\n".join(m.text for m in await store.read("dev"))
    # the tool outputs' facts: the failing test's code of each test run the context or journal saw
    outputs = [m.text for m in state.messages if m.role == "tool"] + [
        m.text for m in await store.read("dev") if m.role == "tool"
    ]
    codes = {
        line.rsplit("code ", 1)[1] for text in outputs for line in text.splitlines() if "AssertionError: code" in line
    }
    everything = context + "\n" + journal
    return (
        _share([f in context for f in facts]),
        _share([f in context for f in files]),
        _share([c in everything for c in codes]),
    )


def _share(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else 1.0


async def run(turns: int, seeds: int) -> list[Result]:
    totals: list[Result] = []
    for policy in POLICIES:
        results = []
        for seed in range(seeds):
            with tempfile.TemporaryDirectory(prefix="cmdc-economy-") as tmp:
                results.append(await run_policy(policy, seed, turns, Path(tmp)))
        totals.append(_sum(results))
    return totals


def _sum(results: list[Result]) -> Result:
    n = len(results)
    first = results[0]
    return Result(
        first.policy,
        sum(r.prompt_tokens for r in results),
        sum(r.summarizer_tokens for r in results),
        max(r.peak for r in results),
        sum(r.summarizer_calls for r in results),
        sum(r.requests for r in results),
        sum(r.breaks for r in results),
        sum(r.thrash for r in results),
        sum(r.failed_turns for r in results),
        sum(r.facts for r in results) / n,
        sum(r.files for r in results) / n,
        sum(r.recoverable for r in results) / n,
    )


def rows(results: list[Result]) -> list[Row]:
    base, best = results[0], results[-1]
    out: list[Row] = []
    for r in results:
        b = f"context_economy: {r.policy}"
        out += [
            Row(b, "prompt tokens (model requests)", f"{r.prompt_tokens:,}"),
            Row(b, "summarizer prompt tokens", f"{r.summarizer_tokens:,}"),
            Row(b, "model requests", f"{r.requests:,}"),
            Row(b, "peak context (tokens)", f"{r.peak:,}"),
            Row(b, "summarizer calls", f"{r.summarizer_calls}"),
            Row(b, "prefix breaks", f"{r.breaks}"),
            check(b, "thrash events", r.thrash, "{:.0f}", "0", r.thrash == 0),
            check(b, "failed turns", r.failed_turns, "{:.0f}", "0", r.failed_turns == 0),
            Row(b, "retention: user facts in context", f"{r.facts:.1%}"),
            Row(b, "retention: files touched named", f"{r.files:.1%}"),
            Row(b, "retention: tool facts recoverable", f"{r.recoverable:.1%}"),
        ]
    b = "context_economy: caps+masking vs summary only"
    ratio = best.prompt_tokens / max(1, base.prompt_tokens)
    calls = best.summarizer_calls / max(1, base.summarizer_calls)
    out += [
        check(b, "prompt tokens", ratio, "{:.1%}", "<= 50%", ratio <= 0.5),
        check(b, "summarizer calls", calls, "{:.1%}", "<= 33.3%", best.summarizer_calls * 3 <= base.summarizer_calls),
        check(
            b,
            "retention no lower",
            min(best.facts - base.facts, best.files - base.files, best.recoverable - base.recoverable),
            "{:+.1%}",
            ">= 0",
            best.facts >= base.facts and best.files >= base.files and best.recoverable >= base.recoverable,
        ),
    ]
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.context_economy")
    parser.add_argument("--turns", type=int, default=120, help="user turns per session (default 120)")
    parser.add_argument("--seeds", type=int, default=2, help="sessions per policy (default 2)")
    args = parser.parse_args(argv)
    print(render(rows(trio.run(run, args.turns, args.seeds))))


if __name__ == "__main__":
    main()
