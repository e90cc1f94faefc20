"""Retention probes: what an agent still knows after every compaction of a long session.

A seeded session from `benchmarks.sessions` (a coding agent, realistic tool outputs, planted
facts in four categories) is replayed turn by turn through a `Compactor`; after every
compaction each probe that applies is scored at two levels:

- context: the answer is in what the model would be sent (kept messages, pins, the summary);
- recall: the agent's `recall` tool (the real one, over the store's search) shows it in its top
  5 for the probe's natural query (only probes whose source message is in the journal).

One table per summarizer (the offline default, a custom one that claims every task is done,
and with `--model-turns N` a model through the llama.cpp e2e server when it is cached and
`CMDC_E2E` is not 0) and per configuration.

Run: python -m benchmarks.retention [--turns 400] [--seed 0] [--no-recall] [--model-turns 40]
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio

from benchmarks.sessions import CATEGORIES, CONTINUATION, DECISION, RECALL, Probe, Session, generate, render_call
from cmdc import Compacted, Compactor, Message, OffloadStore, State
from cmdc.recall import recall_tool

__all__ = ["Compactor", "generate"]  # re-exported for benchmarks.__main__

TARGETS = {RECALL: 0.90, CONTINUATION: 0.90, DECISION: 0.80, "artifact": 0.70}
"""Context level after each of the first `TARGET_COMPACTIONS` compactions (issue 27)."""
TARGET_COMPACTIONS = 60
TRIGGER = 12_000

_RECORD = re.compile(r"^\[record (\d+) ", re.MULTILINE)


@attrs.frozen
class Score:
    """One compaction's figures: per category (passed, applicable) at each level, the recall
    category split into training and held-out phrasings, the pending task, the summary's size."""

    compaction: int
    turn: int
    context: dict[str, tuple[int, int]]
    recall: dict[str, tuple[int, int]]
    held_out: dict[str, tuple[int, int]]  # per category, probes stated by a held-out phrasing
    trained: dict[str, tuple[int, int]]  # ... and by a training phrasing (tool-stated facts among them)
    pending_kept: bool | None
    summary_tokens: int
    summary_budget: int
    missed: tuple[str, ...] = ()
    decision_kinds: dict[str, tuple[int, int]] = attrs.field(factory=dict)  # by phrasing set (probe kind)

    def ratio(self, category: str, level: str = "context") -> float | None:
        done, total = (self.context if level == "context" else self.recall)[category]
        return None if total == 0 else done / total


def context_units(state: State) -> list[tuple[str, list[str]]]:
    """What the model would be sent, as (unit text, its lines), lower case: each line of a
    summary is a unit; any other message is one, an assistant message together with its tool
    calls and their results."""
    units: list[tuple[str, list[str]]] = []
    results = {m.tool_call_id: m.text for m in state.messages if m.role == "tool"}
    for m in state.messages:
        if m.is_summary:
            units.extend((line, [line]) for line in m.text.lower().splitlines() if line.strip())
        elif m.role == "tool":
            continue
        else:
            parts = [m.text, *(render_call(c) + "\n" + results.get(c.id, "") for c in m.tool_calls)]
            text = "\n".join(parts).lower()
            units.append((text, text.splitlines()))
    return units


def in_context(probe: Probe, units: Sequence[tuple[str, list[str]]]) -> bool:
    needles = [n.lower() for n in probe.needles]
    for text, lines in units:
        if all(n in text for n in needles):
            if not probe.forbid:
                return True
            line = next(ln for ln in lines if needles[0] in ln)
            if not any(f.lower() in line for f in probe.forbid):
                return True
    return False


Summarizer = Callable[[Sequence[Message], str], Awaitable[str]]


async def claims_all_done(messages: Sequence[Message], instruction: str) -> str:
    """A custom summarizer, deliberately weak: a few lines, and it claims every task is done."""
    last = next((m.text for m in reversed(messages) if m.role == "assistant" and m.text.strip()), "")
    return f"## Pending tasks\nNone: every task is done.\n\n## Current work\n{last[:300]}\n"


async def replay(
    session: Session,
    compactor: Compactor,
    root: str,
    *,
    trigger: int = TRIGGER,
    keep: tuple[str, int] | None = None,
    recall: bool = True,
    recall_every: int = 1,
    max_compactions: int | None = None,
    agent_id: str = "retention",
    final: list[State] | None = None,
) -> list[Score]:
    """Replay `session` through `compactor` (journal under `root`), scoring every probe that
    applies after each compaction: the context level every time, the recall level (a search
    per evicted probe) after every `recall_every`-th compaction and the last one."""
    config: dict[str, Any] = {"compact_offload_dir": root, "compact_trigger": ("tokens", trigger)}
    if keep is not None:
        config["compact_keep"] = keep
    state = State(agent_id=agent_id, config=config)
    seen: set[str] = set()
    scores: list[Score] = []
    tool = recall_tool(OffloadStore(root), agent_id)
    turn_of = {m.id: i for i, t in enumerate(session.turns) for m in t}
    for i, turn in enumerate(session.turns):
        state = state.append(*turn)
        seen.update(m.id for m in turn)
        result = await compactor.maybe_compact(state)
        if not isinstance(result, Compacted):
            continue
        state = result.state
        last_report, last_turn = result.report, i
        active = [
            p
            for p in session.probes
            if p.source in seen and turn_of[p.source] <= i and (p.until is None or i < p.until)
        ]
        last_active = active
        searching = recall and (len(scores) + 1) % recall_every == 0
        scores.append(await _score(state, result.report, active, i, tool if searching else None))
        if max_compactions is not None and len(scores) >= max_compactions:
            break
    if recall and scores and len(scores) % recall_every != 0:  # the last compaction, searched too
        scores[-1] = await _score(state, last_report, last_active, last_turn, tool)
    if final is not None:  # the state after the last compaction, and the probes that apply then
        final.append(state)
    return scores


async def _score(state: State, report: Any, active: list[Probe], turn: int, tool: Any) -> Score:
    units = context_units(state)
    inside = {m.id for m in state.messages}
    context = dict.fromkeys(CATEGORIES, (0, 0))
    recalled = dict.fromkeys(CATEGORIES, (0, 0))
    trained = dict.fromkeys(CATEGORIES, (0, 0))
    held = dict.fromkeys(CATEGORIES, (0, 0))
    pending: bool | None = None
    missed: list[str] = []
    kinds: dict[str, tuple[int, int]] = {}
    for p in active:
        ok = in_context(p, units)
        if p.category == DECISION:
            key = f"{p.kind}{'/held-out' if p.held_out else ''}"
            kinds[key] = (kinds.get(key, (0, 0))[0] + ok, kinds.get(key, (0, 0))[1] + 1)
        done, total = context[p.category]
        context[p.category] = (done + ok, total + 1)
        if not ok:
            missed.append(f"{p.category}/{p.kind}: {' + '.join(p.needles)}")
        split = held if p.held_out else trained
        split[p.category] = (split[p.category][0] + ok, split[p.category][1] + 1)
        if p.kind == "pending":
            pending = ok
        if tool is not None and p.source not in inside:
            out = (await tool.run({"query": p.query, "limit": 5})).lower()
            found = all(n.lower() in out for n in p.needles)
            done, total = recalled[p.category]
            recalled[p.category] = (done + found, total + 1)
    return Score(
        report.compaction,
        turn,
        context,
        recalled,
        held,
        trained,
        pending,
        report.summary_tokens,
        report.summary_budget,
        tuple(missed),
        kinds,
    )


# -- the tables ----------------------------------------------------------------------------------


def _pct(done: int, total: int) -> str:
    return "-" if total == 0 else f"{100 * done / total:.0f}%"


def _sum(scores: Sequence[Score], field: str, category: str) -> tuple[int, int]:
    """(passed, applicable) summed over `scores`, of `field` ("context", "recall", "trained",
    "held_out") for `category`."""
    pairs = [getattr(s, field)[category] for s in scores]
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


PHRASING_SETS = {
    "decision": "training",
    "decision/held-out": "held-out (first set)",
    "decision_late": "written later, then tuned on",
    "decision_fresh": "fresh set (tuned on since)",
}
"""The decision probes' phrasing sets (`benchmarks.sessions.DECISIONS`), as the table names them."""


def _sum_kind(scores: Sequence[Score], kind: str) -> tuple[int, int]:
    pairs = [s.decision_kinds.get(kind, (0, 0)) for s in scores]
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def unseen_decisions() -> tuple[int, int, int, int]:
    """The ledger's decision reading on phrasings it was never designed on
    (`benchmarks.sessions.UNSEEN_DECISIONS`, every choice of `CHOICES` and `MORE_CHOICES`):
    (read with the choice and its reason in one entry, sentences; non-decisions read as one,
    non-decision sentences)."""
    from benchmarks.sessions import CHOICES, MORE_CHOICES, UNSEEN_DECISIONS, UNSEEN_NON_DECISIONS
    from cmdc.compaction.ledger import decisions

    found = wrong = 0
    choices = CHOICES + MORE_CHOICES
    for template in UNSEEN_DECISIONS:
        for a, b, reason, key in choices:
            text = template.format(a=a, b=b, r=reason)
            read = decisions(text[0].upper() + text[1:])
            found += any(a.lower() in d.lower() and key.lower() in d.lower() for d in read)
    for template in UNSEEN_NON_DECISIONS:
        for a, b, reason, _ in choices:
            text = template.format(a=a, b=b, r=reason)
            wrong += bool(decisions(text[0].upper() + text[1:]))
    return found, len(UNSEEN_DECISIONS) * len(choices), wrong, len(UNSEEN_NON_DECISIONS) * len(choices)


def worst(scores: Sequence[Score], category: str, level: str = "context") -> float | None:
    """The lowest ratio of `category` over `scores` (None: it never applied)."""
    ratios = [r for s in scores if (r := s.ratio(category, level)) is not None]
    return min(ratios) if ratios else None


def summary_rows(scores: Sequence[Score]) -> dict[str, str]:
    """One line of figures: per category the mean and worst context level, the recall level,
    the held-out phrasings, the pending task, the summary within budget."""
    first = scores[:TARGET_COMPACTIONS]
    row: dict[str, str] = {"compactions": str(len(scores))}
    for c in CATEGORIES:
        w = worst(first, c)
        row[f"{c} ctx"] = f"{_pct(*_sum(first, 'context', c))} (min {'-' if w is None else f'{w:.0%}'})"
        row[f"{c} recall"] = _pct(*_sum(first, "recall", c))
    for c in (RECALL, DECISION):
        row[f"{c}: trained / held-out"] = f"{_pct(*_sum(first, 'trained', c))} / {_pct(*_sum(first, 'held_out', c))}"
    kinds = sorted({k for s in first for k in s.decision_kinds})
    row["decision by phrasing set"] = ", ".join(
        f"{PHRASING_SETS.get(k, k)} {_pct(*_sum_kind(first, k))}" for k in kinds
    )
    kept = [s.pending_kept for s in scores if s.pending_kept is not None]
    row["pending stays pending"] = f"{sum(kept)}/{len(kept)}"
    row["summary within budget"] = f"{sum(s.summary_tokens <= s.summary_budget for s in scores)}/{len(scores)}"
    return row


def levels(scores: Sequence[Score]) -> str:
    """One line: per category the mean context level (and the worst) over the first
    `TARGET_COMPACTIONS` compactions."""
    first = scores[:TARGET_COMPACTIONS]
    parts = []
    for c in CATEGORIES:
        w = worst(first, c)
        parts.append(f"{c} {_pct(*_sum(first, 'context', c))} ({'-' if w is None else f'{w:.0%}'})")
    return ", ".join(parts)


def table(name: str, scores: Sequence[Score]) -> str:
    row = summary_rows(scores)
    lines = [f"{name}: {row['compactions']} compactions (figures over the first {TARGET_COMPACTIONS})"]
    lines.append(f"  {'category':<13} {'context (mean, worst)':>24} {'recall top 5':>13} {'target (worst)':>15}")
    for c in CATEGORIES:
        lines.append(f"  {c:<13} {row[f'{c} ctx']:>24} {row[f'{c} recall']:>13} {f'≥ {TARGETS[c]:.0%}':>15}")
    lines.append(
        f"  trained / held-out phrasings (context, mean): recall {row['recall: trained / held-out']}, "
        f"decision {row['decision: trained / held-out']}"
    )
    lines.append(f"  decisions by phrasing set (context, mean): {row['decision by phrasing set']}")
    lines.append(
        f"  pending task still pending: {row['pending stays pending']}; summary within budget: "
        f"{row['summary within budget']}"
    )
    return "\n".join(lines)


def met(scores: Sequence[Score]) -> dict[str, bool]:
    """Each target of issue 27 (context level, first 60 compactions; the summary's budget)."""
    first = scores[:TARGET_COMPACTIONS]
    out = {c: (worst(first, c) or 0.0) >= t for c, t in TARGETS.items()}
    out["budget"] = all(s.summary_tokens <= s.summary_budget for s in scores)
    out["pending"] = all(s.pending_kept is not False for s in scores)
    return out


def llama_missing() -> str | None:
    """Why the llama.cpp e2e server cannot summarize here (None: it can)."""
    if os.environ.get("CMDC_E2E") == "0":
        return "CMDC_E2E=0"
    try:
        from tests.e2e import llama_server
    except ImportError:
        return "tests.e2e is not importable (run from the repository)"
    return llama_server.missing()


MODEL_PROBES = 4
"""How many probes the model level asks (a few: each is two or three requests on 2 cores)."""
MODEL_CONTEXT = 8_192
"""The e2e server's window (SmolLM2's own): a compaction's input in one request, and the summary
and a question for the model level."""
MODEL_COMPACTIONS = 2
"""The model summarizer's compactions per configuration (each is a minute or so on 2 cores)."""
MODEL_SUMMARY_TOKENS = 160
MODEL_SYSTEM = (
    "You are a coding agent resuming a long session. Older messages were compacted into the summary "
    "below and saved to a journal; the recall tool searches that journal. Answer the user's question "
    "briefly, with exact names and values."
)


@attrs.frozen
class ModelLevel:
    """The model level: the probe questions the model answered with every needle, asked with
    `recall` offered (tool choice auto) and with one recall call required before the answer."""

    asked: int
    offered: int  # answered with recall offered
    offered_calls: int  # how many of those answers called recall on their own
    required: int  # answered after a required recall call


def model_probes(session: Session, state: State, most: int = MODEL_PROBES) -> list[Probe]:
    """Up to `most` probes that apply after the last compaction and whose source was evicted,
    taken a category at a time (deterministic)."""
    inside = {m.id for m in state.messages}
    turn_of = {m.id: i for i, t in enumerate(session.turns) for m in t}
    last = max((turn_of[m.id] for m in state.messages if m.id in turn_of), default=0)
    evicted = [
        p
        for p in session.probes
        if p.source not in inside and p.source in turn_of and turn_of[p.source] <= last
        and (p.until is None or last < p.until)
    ]  # fmt: skip
    by_category = [[p for p in evicted if p.category == c] for c in CATEGORIES]
    picked: list[Probe] = []
    while len(picked) < most and any(by_category):
        for group in by_category:
            if group and len(picked) < most:
                picked.append(group.pop(0))
    return picked


async def model_level(
    session: Session, state: State, url: str, root: str, agent_id: str, probes: int = MODEL_PROBES
) -> ModelLevel:
    """Ask the e2e server's model each of `model_probes` as a question, after the summary (the
    compacted context without its kept messages, which do not hold these probes), with the real
    recall tool over the journal under `root`: once offered (the model may call it), once
    required (llama.cpp constrains the reply to one call; cmdc runs it; then an answer)."""
    from benchmarks.e2e_llama import provider
    from cmdc.providers.base import ModelRequest

    tool = recall_tool(OffloadStore(root), agent_id)
    summaries = [m for m in state.messages if m.is_summary]
    asking = model_probes(session, state, probes)
    offered = offered_calls = required = 0
    greedy = {"temperature": 0}
    auto = provider(url, "openai", False, max_output_tokens=96, extra_body=greedy)
    calling = provider(
        url, "openai", False, max_output_tokens=64,
        extra_body={**greedy, "tool_choice": "required", "parallel_tool_calls": False},
    )  # fmt: skip
    answering = provider(url, "openai", False, max_output_tokens=96, extra_body={**greedy, "tool_choice": "none"})
    try:
        for p in asking:
            question = Message.user(f"{p.query[0].upper()}{p.query[1:]}?")
            asked = (Message.system(MODEL_SYSTEM), *summaries, question)
            reply = await auto.complete(ModelRequest(asked, tools=(tool.schema,)))
            answer = reply.text
            if reply.tool_calls:
                offered_calls += 1
                answer = await _answer_after_recall(answering, tool, asked, reply)
            offered += _answered(p, answer)
            call = await calling.complete(ModelRequest(asked, tools=(tool.schema,)))
            answer = await _answer_after_recall(answering, tool, asked, call) if call.tool_calls else call.text
            required += _answered(p, answer)
    finally:
        for model in (auto, calling, answering):
            await model.aclose()
    return ModelLevel(len(asking), offered, offered_calls, required)


async def _answer_after_recall(model: Any, tool: Any, asked: Sequence[Message], reply: Message) -> str:
    """The model's answer once its first recall call has run (other calls are answered as not run)."""
    from cmdc.providers.base import ModelRequest

    results = []
    for i, call in enumerate(reply.tool_calls):
        try:
            first = i == 0 and call.name == tool.name
            text = await tool.run(call.arguments) if first else "not run: one call at a time"
        except Exception as exc:  # a bad argument: the model reads the error, as an agent's would
            text = f"error: {exc}"
        results.append(Message.tool_result(call.id, text))
    final = await model.complete(ModelRequest((*asked, reply, *results), tools=(tool.schema,)))
    return str(final.text)


def _answered(probe: Probe, answer: str) -> bool:
    low = answer.lower()
    return all(n.lower() in low for n in probe.needles)


async def model_table(
    session: Session,
    out: Callable[[str], None],
    configs: Sequence[str] = (),
    compactions: int = MODEL_COMPACTIONS,
    probes: int = MODEL_PROBES,
) -> list[Score]:
    """The session summarized by SmolLM2-135M through the llama.cpp e2e server (its 8k window,
    the first `MODEL_COMPACTIONS` compactions; the offline summarizer as the fallback, as an agent
    has), per configuration (`configs`: names in `CONFIGS`, all by default); after the first
    configuration, the model level."""
    from benchmarks.e2e_llama import provider
    from cmdc.providers import ExtractiveSummarizer
    from tests.e2e import llama_server

    first: list[Score] = []
    with llama_server.cached_server(context=MODEL_CONTEXT) as server:
        for n, name in enumerate(configs or CONFIGS):
            with tempfile.TemporaryDirectory() as tmp:
                model = provider(server.url, "openai", False, max_output_tokens=MODEL_SUMMARY_TOKENS)
                compactor = Compactor(
                    model, summarizer_window=MODEL_CONTEXT, retries=1, fallbacks=[ExtractiveSummarizer()]
                )
                final: list[State] = []
                scores = await replay(
                    session,
                    compactor,
                    tmp,
                    recall=False,
                    final=final,
                    max_compactions=compactions,
                    **CONFIGS[name],
                )
                await model.aclose()
                out("")
                out(table(f"SmolLM2-135M (llama.cpp) summarizer, {len(session.turns)} turns; {name}", scores))
                if n == 0 and final:
                    level = await model_level(session, final[0], server.url, tmp, "retention", probes)
                    out(
                        f"  model level (SmolLM2-135M asked {level.asked} evicted probes after the last summary, "
                        f"not gated): recall offered {level.offered}/{level.asked} answered "
                        f"({level.offered_calls} called recall on its own); one recall call required "
                        f"{level.required}/{level.asked} answered"
                    )
                first = first or scores
    return first


CONFIGS: dict[str, dict[str, Any]] = {
    "default, trigger 12k": {"trigger": 12_000},
    "trigger 8k, keep 3k tokens": {"trigger": 8_000, "keep": ("tokens", 3_000)},
}


SUMMARIZERS: list[tuple[str, Callable[[], Compactor]]] = [
    ("ExtractiveSummarizer (default)", Compactor),
    ("custom: claims all done", lambda: Compactor(claims_all_done)),
]
"""The summarizers every table is made with (the llama.cpp model's: `model_table`)."""


async def run_all(
    turns: int,
    seed: int,
    recall: bool,
    out: Callable[[str], None] = print,
    recall_every: int = 10,
    model_turns: int = 0,
    model_compactions: int = MODEL_COMPACTIONS,
    model_probes: int = MODEL_PROBES,
) -> list[Score]:
    """Every table; returns the default summarizer's scores in the default configuration. The
    recall level (a search per evicted probe) is scored in the first configuration only, after
    every `recall_every`-th compaction and the last: it depends on the journal, which every
    configuration fills alike."""
    session = generate(seed, turns)
    counts = {c: sum(p.category == c for p in session.probes) for c in CATEGORIES}
    out(
        f"cmdc retention probes: seeded session (seed {seed}), {len(session.turns)} turns, "
        f"{len(session.messages)} messages, probes " + ", ".join(f"{c} {n}" for c, n in counts.items())
    )
    main: list[Score] = []
    for n, (config_name, config) in enumerate(CONFIGS.items()):
        for name, make in SUMMARIZERS:
            with tempfile.TemporaryDirectory() as tmp:
                searched = recall and n == 0
                scores = await replay(session, make(), tmp, recall=searched, recall_every=recall_every, **config)
            if not main:
                main = scores
            out("")
            out(table(f"{name}; {config_name}", scores))
    found, asked, wrong, plain = unseen_decisions()
    out(
        f"\ndecisions in phrasings never designed on (benchmarks.sessions.UNSEEN_DECISIONS): {found}/{asked} "
        f"({found / asked:.0%}) read with the choice and its reason; sentences that decide nothing read as a "
        f"decision: {wrong}/{plain}"
    )
    why = llama_missing()
    if why is not None:
        out(f"\nmodel summarizer (llama.cpp e2e server): skipped: {why}")
    elif model_turns:
        await model_table(generate(seed, model_turns), out, (), model_compactions, model_probes)
    return main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retention")
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-recall", action="store_true", help="context level only (faster)")
    parser.add_argument("--recall-every", type=int, default=10, help="score the recall level every N compactions")
    parser.add_argument(
        "--model-turns",
        type=int,
        default=0,
        help="also a session of this many turns summarized by the llama.cpp e2e server's model (slow: minutes "
        "per compaction on 2 cores; needs python -m tests.e2e.llama_server fetch)",
    )
    parser.add_argument("--model-compactions", type=int, default=MODEL_COMPACTIONS, help="per configuration")
    parser.add_argument("--model-probes", type=int, default=MODEL_PROBES, help="questions for the model level")
    args = parser.parse_args(argv)
    scores = trio.run(
        run_all,
        args.turns,
        args.seed,
        not args.no_recall,
        print,
        args.recall_every,
        args.model_turns,
        args.model_compactions,
        args.model_probes,
    )
    print(f"\ntargets (default summarizer, default configuration): {met(scores)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
