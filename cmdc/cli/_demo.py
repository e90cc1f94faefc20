"""`cmdc demo`: agents on a small context window compacting live, then a table of what happened.

Each agent works a long scripted task (a billing-service migration): a system prompt, the task,
then one short user message per turn, constraints among them and two pinned facts. It has two
small tools (`read_file`, `run_tests`) whose outputs make the context grow, and `recall`. The
offline model is `SimulatedModel`: it calls the tools it is offered, reports usage and refuses a
prompt that does not fit its window, like a real model.

The workload is sized from the window: the compaction trigger is 80% of it, and every request
reserves 23% of it for the reply (`max_output_tokens`), which the trigger does not count. So a
step that jumps past the trigger is compacted before the request (an automatic compaction),
while a context that creeps into the last 3% below the trigger no longer leaves room for the
reply: the model answers "too long" and the agent compacts and retries (a forced compaction).
Both happen in every run.

Progress (the live table on a terminal, else one line per compaction and every 10 turns) goes
to stderr; the final table and the verdict to stdout. The demo fails (exit 1) when a turn
fails, a retention check fails, or most of the agents' tool calls fail: a demo that shows a
failing agent as a success is worse than none. Without `--offload-dir`, the journals live in a
temporary directory removed at the end.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import shutil
import signal
import sys
import tempfile
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, TextIO

import attrs
import trio

from .._trio import reraise
from .._version import install_hint
from ..compaction import CompactionReport, Compactor, ExtractiveSummarizer
from ..compaction.finalize import USER_MESSAGES_KEY
from ..compaction.summary import Summarizer
from ..errors import CmdcError, DemoError, ProviderError
from ..events import COMPACTION_END, OVERFLOW, REQUEST, RESPONSE, TOOL_END, TOOL_RESULTS_CLIPPED, Event
from ..message import PINNED_KEY, Message, TokenUsage, ToolCall
from ..providers.base import ModelRequest, Provider
from ..providers.simulated import SimulatedModel
from ..runtime import open_runtime
from ..runtime.agent import AgentRef
from ..state import State
from ..store.file.journal import OffloadStore
from ..tokens import estimate_message_tokens
from ..tools import Tool, tool
from ..tracing import UNTRACED, Span, Tracer

ProviderName = Literal["simulated", "openai", "anthropic"]
DisplayMode = Literal["auto", "live", "plain"]

TRIGGER_SHARE = 0.8
"""The compaction trigger, as a share of the window."""

OUTPUT_SHARE = 0.23
"""The room each request reserves for the reply, as a share of the window."""

MIN_WINDOW = 3_000
"""The smallest window the workload fits: tool schemas, system prompt, task, pins, a summary, a reply."""

_KEYS = {"openai": "OPENAI", "anthropic": "ANTHROPIC"}

SYSTEM = (
    "You are a careful coding agent. Work on the task step by step. Use read_file to look at the code "
    "and run_tests to check your work before you answer; answer in one or two sentences."
)
TASKS = (
    "TASK: migrate the billing service to the invoice API v2 (ticket PAY-4821); keep src/legacy/ untouched.",
    "TASK: add retries with backoff to the payment gateway client (ticket PAY-5107); no new dependencies.",
    "TASK: move invoice rendering to the templates module (ticket DOC-311); keep the PDF layout identical.",
    "TASK: replace float amounts by integer cents in the ledger (ticket LED-92); migrations must be reversible.",
)
CONSTRAINTS = (
    "Constraint: all amounts stay in integer cents.",
    "Constraint: never call api.billing.example/v1 from tests.",
    "Constraint: keep parse_invoice() backwards compatible.",
    "Constraint: the timeout for invoice fetches is 7 seconds.",
    "Constraint: docs go to docs/billing/migration.md.",
    "Constraint: the feature flag is INVOICE_V2_ENABLED.",
)
PINS = ("PIN: the staging database is db-stg-07.", "PIN: the release owner is Dana (on-call OPS-2210).")
PIN_TURNS = (4, 15)
FILES = (
    "src/billing/client.py",
    "src/billing/models.py",
    "src/billing/retry.py",
    "src/billing/invoice.py",
    "tests/test_billing.py",
)
_CODE = (
    "amount_cents = parse_invoice(row).total_cents",
    "if response.status == 429: backoff.sleep(attempt)",
    "invoice = InvoiceV2(customer_id=row.customer, currency=row.currency.upper())",
    "assert ledger.balance(account) == expected_cents",
    "logger.info('retry %d for invoice %s', attempt, invoice.id)",
    "return Money(cents=int(value), currency=currency)",
)


def make_tools(window: int) -> list[Tool]:
    """The agents' tools; their outputs are sized from the window (up to about a tenth of it)."""
    lines_max = max(8, window // 150)

    async def read_file(path: str) -> str:
        """Read a source file of the project and return its numbered lines.

        Args:
            path: The file's path, relative to the repository root (for example src/billing/client.py).
        """
        h = zlib.crc32(path.encode())
        n = lines_max // 3 + h % (lines_max - lines_max // 3 + 1)
        body = [f"{i + 1:4} | {_CODE[(h + i) % len(_CODE)]}" for i in range(n)]
        return f"# {path} ({n} lines)\n" + "\n".join(body)

    async def run_tests(target: str) -> str:
        """Run the project's tests for a file or a test name and report the results.

        Args:
            target: A test file, a module path or a test name.
        """
        h = zlib.crc32(target.encode())
        failed = h % 3
        lines = [f"collected {40 + h % 20} tests for {target}"]
        for k in range(failed):
            name = ("test_retry_backoff", "test_invoice_total_cents", "test_currency_upper")[k]
            lines.append(f"FAILED tests/test_billing.py::{name} - AssertionError: expected 700 got {690 + h % 9}")
        lines.append(f"{40 + h % 20 - failed} passed, {failed} failed")
        return "\n".join(lines)

    return [tool(read_file), tool(run_tests)]


@attrs.frozen
class DemoOptions:
    """What `cmdc demo` runs."""

    agents: int = 8
    turns: int = 40
    window: int = 6_000
    offload_dir: Path | None = None
    seed: int = 0
    provider: ProviderName = "simulated"
    model: str | None = None
    summarizer: Literal["extractive", "model"] | None = None  # None: extractive offline, the model otherwise
    latency: float = 0.05
    display: DisplayMode = "auto"
    trace: bool = False  # print the span tree of agent-1's session (OpenTelemetry's SDK)
    ui: int | None = None  # serve the web page on this port (0: a free one) and stay up until Ctrl-C

    @property
    def trigger(self) -> int:
        return int(self.window * TRIGGER_SHARE)

    @property
    def output_reserve(self) -> int:
        return int(self.window * OUTPUT_SHARE)


@attrs.define
class Retention:
    """What survived in an agent's final context. `users` counts the user messages that must be
    there (in the context, or quoted in the summary) out of those required: every one, unless
    the evicted ones outgrow the preserved-messages budget; then the newest that fit in it.
    `users_sent` is how many were sent in all."""

    task: bool
    users: tuple[int, int]
    pins: tuple[int, int]
    users_sent: int = 0

    @property
    def ok(self) -> bool:
        return self.task and self.users[0] == self.users[1] and self.pins[0] == self.pins[1]


@attrs.define
class AgentStats:
    """One agent's figures, updated from its events."""

    name: str
    turns: int = 0
    tokens: int = 0
    reports: list[CompactionReport] = attrs.field(factory=list)
    overflows: int = 0
    clipped: int = 0
    errors: list[str] = attrs.field(factory=list)
    journal_bytes: int = 0
    retention: Retention | None = None
    tool_calls: int = 0
    tool_failed: int = 0
    tool_errors: list[str] = attrs.field(factory=list)  # error results seen in the context
    prompt_tokens: int = 0  # the agent's requests' prompt tokens, as the model reported them
    cached_tokens: int = 0  # of them, read from the model's prompt cache
    cache_writes: int = 0  # tokens written to the cache (Anthropic)

    @property
    def compactions(self) -> int:
        return len(self.reports)

    @property
    def forced(self) -> int:
        return sum(1 for r in self.reports if r.reason == "forced")

    @property
    def auto(self) -> int:
        return sum(1 for r in self.reports if r.reason == "auto")


def make_provider(options: DemoOptions, index: int) -> Provider:
    """The model of agent `index`: a `SimulatedModel`, or the real endpoint asked for."""
    if options.provider == "simulated":
        return SimulatedModel(
            context_window=options.window,
            seed=options.seed * 1_000 + index,
            tool_probability=0.7,
            max_tool_rounds=2,
            reply_chars=240,
            latency=options.latency,
        )
    return real_provider(options.provider, options.model)


def real_provider(kind: str, model: str | None) -> Provider:
    """`OpenAIProvider` or `AnthropicProvider` from the environment, with clear errors for a
    missing model, key or `http` extra."""
    if not model:
        raise DemoError(f"--provider {kind} needs --model NAME (the model to call)")
    prefix = _KEYS[kind]
    if not os.environ.get(f"{prefix}_API_KEY") and not os.environ.get(f"{prefix}_BASE_URL"):
        raise DemoError(
            f"--provider {kind} needs the environment variable {prefix}_API_KEY "
            f"(or {prefix}_BASE_URL for a server that takes no key)"
        )
    from .. import providers

    name = "OpenAIProvider" if kind == "openai" else "AnthropicProvider"
    try:
        cls = getattr(providers, name)
    except ImportError:
        raise DemoError(f"--provider {kind} needs the 'http' extra (httpx): {install_hint('http')}") from None
    provider: Provider = cls(model=model)
    return provider


# -- the workload -------------------------------------------------------------------------------


@attrs.frozen
class Script:
    """What one agent is told: the messages of each turn (the first opens with the system
    prompt and the task)."""

    turns: tuple[tuple[Message, ...], ...]

    @property
    def task(self) -> Message:
        return self.turns[0][1]

    def users(self, sent: int) -> list[Message]:
        """The user messages of the first `sent` turns."""
        return [m for turn in self.turns[:sent] for m in turn if m.role == "user"]

    def pins(self, sent: int) -> list[Message]:
        """The pinned messages of the first `sent` turns."""
        return [m for m in self.users(sent) if m.is_pinned]


def script(index: int, turns: int) -> Script:
    """Agent `index`'s scripted session of `turns` turns."""
    plan: list[tuple[Message, ...]] = [(Message.system(SYSTEM), Message.user(TASKS[index % len(TASKS)]))]
    constraints = iter(CONSTRAINTS)
    for t in range(1, turns):
        constraint = next(constraints, None) if t % 6 == 2 else None
        path = FILES[(t + index) % len(FILES)]
        message = Message.user(constraint or f"Step {t}: update {path}; read it, change it, run its tests.")
        if t in PIN_TURNS:
            pin = Message.user(PINS[PIN_TURNS.index(t)], metadata={PINNED_KEY: True})
            plan.append((pin, message))
        else:
            plan.append((message,))
    return Script(turns=tuple(plan))


def user_budget(options: DemoOptions) -> int:
    """The compactor's budget for the user messages a summary quotes, with the demo's config."""
    state = State(agent_id="demo", config=demo_config(options, Path(".")))
    compactor = Compactor(ExtractiveSummarizer())
    return compactor.budgets(compactor.compact_config(state), options.window)[1]


def demo_config(options: DemoOptions, offload_dir: Path) -> dict[str, Any]:
    """Every agent's `state.config`."""
    return {
        "context_window": options.window,
        "compact_trigger": ("tokens", options.trigger),
        "compact_keep": ("messages", 6),
        "compact_offload_dir": str(offload_dir),
    }


def check_retention(state: State, plan: Script, user_budget: int, sent: int | None = None) -> Retention:
    """Of the first `sent` turns (all by default): the task still in the context; every pin in
    it; every user message in it or quoted in a summary, newest first and without a gap, as far
    back as the summary quotes them. The summary's room for quoted user messages is what its
    session ledger leaves of the summary budget (at most `user_budget` tokens), so where they
    stop varies; older ones are in the ledger's entries or pointers and in the journal."""
    sent = len(plan.turns) if sent is None else sent
    users, pins = plan.users(sent), plan.pins(sent)
    ids = {m.id for m in state.messages}
    summaries = " ".join(" ".join(m.text.split()) for m in state.messages if m.is_summary)
    preserved = {  # the user messages the summaries quote as such (not the ledger's lines)
        " ".join(t.split())
        for m in state.messages
        if m.is_summary
        for t in m.metadata.get(USER_MESSAGES_KEY, ())
        if isinstance(t, str)
    }
    quoted = [u.id not in ids and " ".join(u.text.split()) in summaries for u in users]
    firsts = [i for i, u in enumerate(users) if u.id not in ids and " ".join(u.text.split()) in preserved]
    oldest = firsts[0] if firsts else len(users)
    present = required = 0
    left = user_budget
    for i in range(len(users) - 1, -1, -1):
        u = users[i]
        if u.id in ids:
            present += 1
            required += 1
            continue
        left -= estimate_message_tokens(u)
        if left < 0 or i < oldest:
            continue  # past what the summary quotes: in the ledger and the journal
        required += 1
        present += quoted[i]
    return Retention(
        task=plan.task.id in ids,
        users=(present, required),
        pins=(sum(1 for p in pins if p.id in ids), len(pins)),
        users_sent=len(users),
    )


# -- display ------------------------------------------------------------------------------------


def _bar(tokens: int, window: int, width: int = 12) -> str:
    filled = min(width, round(width * tokens / window)) if window else 0
    return "█" * filled + "░" * (width - filled)


def live_lines(stats: Sequence[AgentStats], options: DemoOptions, recent: Sequence[str] = ()) -> list[str]:
    """The live table: per agent, turns, tokens in context (with a bar against the window) and
    compactions (automatic / forced); then the latest compactions."""
    lines = [f"{'agent':<10} {'turns':>7}  {'tokens in context':<19} {'compactions':>11} {'auto':>5} {'forced':>6}"]
    for s in stats:
        turns = f"{s.turns}/{options.turns}"
        errors = f"  {len(s.errors)} failed turns" if s.errors else ""
        lines.append(
            f"{s.name:<10} {turns:>7}  {s.tokens:>6,} {_bar(s.tokens, options.window)} "
            f"{s.compactions:>11} {s.auto:>5} {s.forced:>6}{errors}"
        )
    total = f"{sum(s.turns for s in stats)}/{options.turns * len(stats)}"
    lines.append(
        f"{'all':<10} {total:>7}  {'':<19} {sum(s.compactions for s in stats):>11} "
        f"{sum(s.auto for s in stats):>5} {sum(s.forced for s in stats):>6}"
    )
    lines += [f"  {line}" for line in recent]
    return lines


class LiveTable:
    """Redraws a block of lines in place on a terminal: ANSI cursor-up and clear-line, no curses."""

    def __init__(self, stream: TextIO, width: int | None = None) -> None:
        self.stream = stream
        self.width = width or shutil.get_terminal_size((100, 24)).columns
        self.drawn = 0

    def draw(self, lines: Sequence[str]) -> None:
        out = [f"\x1b[{self.drawn}A"] if self.drawn else ["\x1b[?25l"]  # up to the block; hide the cursor
        # lines are clipped to the terminal's width so none wraps (which would break the count)
        out += [f"\r\x1b[2K{line[: self.width - 1]}\n" for line in lines]
        out += ["\r\x1b[2K\n"] * (self.drawn - len(lines))  # clear what a longer block left
        self.stream.write("".join(out))
        self.stream.flush()
        self.drawn = max(self.drawn, len(lines))

    def close(self) -> None:
        self.stream.write("\x1b[?25h")  # show the cursor again
        self.stream.flush()


def _event_line(stats: AgentStats, event: Event) -> str | None:
    if event.kind == TOOL_RESULTS_CLIPPED:
        return f"{stats.name}: trailing tool results clipped to fit the window"
    report = event.data.get("report")
    if event.kind != COMPACTION_END or not isinstance(report, CompactionReport):
        return None
    why = {"auto": "automatic", "forced": "forced after an overflow", "manual": "manual"}.get(
        report.reason, report.reason
    )
    return (
        f"{stats.name}: compaction #{report.compaction} ({why}): {report.tokens_before:,} -> "
        f"{report.tokens_after:,} tokens, {report.evicted} messages to journal records "
        f"{report.first_seq}-{report.last_seq}"
    )


# -- the run ------------------------------------------------------------------------------------


def _apply(stats: AgentStats, event: Event) -> None:
    if event.kind == REQUEST:
        tokens = event.data.get("tokens")
        if isinstance(tokens, int):
            stats.tokens = tokens
    elif event.kind == RESPONSE:
        usage = event.data.get("usage")
        if isinstance(usage, TokenUsage):
            stats.prompt_tokens += usage.input_tokens
            stats.cached_tokens += usage.cache_read_tokens
            stats.cache_writes += usage.cache_creation_tokens
    elif event.kind == OVERFLOW:
        stats.overflows += 1
    elif event.kind == TOOL_END:
        stats.tool_calls += 1
        stats.tool_failed += bool(event.data.get("error"))
    elif event.kind == TOOL_RESULTS_CLIPPED:
        stats.clipped += 1
    elif event.kind == COMPACTION_END:
        report = event.data.get("report")
        if isinstance(report, CompactionReport):
            stats.reports.append(report)
            stats.tokens = report.tokens_after


async def run_demo(
    options: DemoOptions, out: TextIO | None = None, progress: TextIO | None = None
) -> tuple[int, list[AgentStats]]:
    """Run the demo: progress to `progress` (stderr), the final table and verdict to `out`
    (stdout). Return the exit code (0: every turn answered, every retention check holds and
    most tool calls worked; else 1) and the figures."""
    out = out or sys.stdout
    progress = progress or sys.stderr
    if options.provider != "simulated":
        real_provider(options.provider, options.model)  # a missing key or extra fails before anything starts
    traced = _Traced("agent-1") if options.trace else None  # so does a missing SDK
    # SIGTERM is taken from here on (before the temporary directory exists): one that comes
    # while the agents start ends the demo as one that comes later does
    with trio.open_signal_receiver(signal.SIGTERM) as terminations:
        temporary = options.offload_dir is None
        offload_dir = options.offload_dir or Path(tempfile.mkdtemp(prefix="cmdc-demo-"))
        model = "SimulatedModel" if options.provider == "simulated" else f"{options.provider} {options.model}"
        print(f"cmdc demo: {options.agents} agents x {options.turns} turns on {model}", file=progress)
        print(
            f"window {options.window:,} tokens, compaction trigger {options.trigger:,}, "
            f"{options.output_reserve:,} reserved for each reply",
            file=progress,
        )
        print(f"journals: {offload_dir}" + (" (temporary)" if temporary else ""), file=progress)
        stats = [AgentStats(f"agent-{i + 1}") for i in range(options.agents)]
        providers = [make_provider(options, i) for i in range(options.agents)]
        started = trio.current_time()
        try:
            run = functools.partial(_run, options, offload_dir, stats, providers, progress, traced)
            await _unless_terminated(terminations, run)
        finally:
            try:
                for provider in providers:
                    close = getattr(provider, "aclose", None)
                    if close is not None:
                        with trio.CancelScope(shield=True), trio.move_on_after(5):
                            await close()
            finally:  # a second Ctrl-C while the first one unwinds still removes the journals
                if temporary:
                    _remove_tree(offload_dir)
    elapsed = trio.current_time() - started
    code, lines = verdict(stats, options)
    where = (
        "journals removed (keep them with --offload-dir DIR)"
        if temporary
        else f"journals in {offload_dir} (read one: cmdc history {offload_dir} agent-1)"
    )
    if traced is not None:
        print(file=out)
        for line in traced.lines():
            print(line, file=out)
    print(file=out)
    for line in [*final_table(stats, options), "", f"{elapsed:.1f} s; {where}", *lines]:
        print(line, file=out)
    return code, stats


def verdict(stats: Sequence[AgentStats], options: DemoOptions) -> tuple[int, list[str]]:
    """The exit code and what went wrong, in words: failed turns (a model endpoint that cannot
    be reached says so), failed tool calls (most of them failing fails the demo), failed
    retention checks (only of agents whose turns all worked: an agent that never ran has
    nothing to retain)."""
    lines: list[str] = []
    failed = [e for s in stats for e in s.errors]
    if failed and all(s.turns == len(s.errors) for s in stats):
        lines.append("no turn was answered: the model could not be used (the first failure below)")
    if failed:
        lines.append(f"{len(failed)} turns failed; the first: {failed[0]}")
    calls = sum(s.tool_calls for s in stats)
    errors = sum(s.tool_failed for s in stats)
    mostly = calls > 0 and 2 * errors > calls
    if calls and not errors:
        lines.append(f"{calls:,} tool calls, all worked")
    if errors:
        first = next((e for s in stats for e in s.tool_errors), None)
        lines.append(f"{errors} of {calls} tool calls failed" + (f"; one: {first}" if first else ""))
    if mostly:
        lines.append("most tool calls failed: the agents did not do their work")
    checked = [s.retention for s in stats if s.retention is not None]
    retained = all(r.ok for r in checked)
    if not retained:
        lines.append("a retention check failed (✗ above)")
    unchecked = sum(1 for s in stats if s.retention is None)
    if unchecked:
        lines.append(f"retention not checked for {unchecked} agent(s) whose turns failed")
    return (0 if not failed and not mostly and retained and checked else 1), lines


class _Traced:
    """`--trace`: one agent's turns, requests, tool calls and compactions as OpenTelemetry
    spans in memory (the SDK's in-memory exporter), printed as a tree at the end. The other
    agents are not traced."""

    def __init__(self, agent: str) -> None:
        try:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

            from ..otel import Tracing
        except ImportError:
            hint = install_hint("otel")
            raise DemoError(f"--trace needs OpenTelemetry's SDK: {hint}, and opentelemetry-sdk") from None
        self.agent = agent
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracing = Tracing(tracer_provider=self.provider)

    def turn(
        self, agent: str, incoming: tuple[Message, ...], parent: contextvars.Context | None
    ) -> AbstractContextManager[Span]:
        return self.tracing.turn(agent, incoming, parent) if agent == self.agent else UNTRACED

    def request(self, agent: str, provider: Provider, request: ModelRequest) -> AbstractContextManager[Span]:
        return self.tracing.request(agent, provider, request) if agent == self.agent else UNTRACED

    def tool(self, agent: str, call: ToolCall, tool: Tool | None) -> AbstractContextManager[Span]:
        return self.tracing.tool(agent, call, tool) if agent == self.agent else UNTRACED

    def compaction(
        self, agent: str, reason: str, state: State, parent: contextvars.Context | None = None
    ) -> AbstractContextManager[Span]:
        return self.tracing.compaction(agent, reason, state, parent) if agent == self.agent else UNTRACED

    def event(self, event: Event) -> None:
        if event.agent_id == self.agent:
            self.tracing.event(event)

    def lines(self) -> list[str]:
        from ..otel import span_tree

        spans = self.exporter.get_finished_spans()
        self.provider.shutdown()
        turns = sum(1 for s in spans if s.parent is None)
        head = f"trace of {self.agent}: {turns} turns, {len(spans)} spans (OpenTelemetry, GenAI conventions)"
        return [head, *span_tree(spans, agent=self.agent)]


async def _run(
    options: DemoOptions,
    offload_dir: Path,
    stats: list[AgentStats],
    providers: list[Provider],
    out: TextIO,
    traced: _Traced | None = None,
) -> None:
    """Run the agents, showing progress on `out`."""
    live = options.display == "live" or (options.display == "auto" and out.isatty())
    use_extractive = options.summarizer == "extractive" or (
        options.summarizer is None and options.provider == "simulated"
    )
    summarizer: Summarizer | None = None
    if use_extractive:
        summarizer = ExtractiveSummarizer(max_chars=max(1_000, options.window // 2))
    config = demo_config(options, offload_dir)
    tools = make_tools(options.window)
    plans = [script(i, options.turns) for i in range(options.agents)]
    table = LiveTable(out) if live else None
    recent: deque[str] = deque(maxlen=3)
    with _warnings_into(recent if table is not None else None):
        await _drive_all(
            options, offload_dir, stats, providers, out, table, recent, plans, config, tools, summarizer, traced
        )


@contextlib.contextmanager
def _warnings_into(recent: deque[str] | None) -> Iterator[None]:
    """While a live table is drawn, cmdc's warnings (a provider's retries) become lines of the
    table instead of lines that would break its redrawing."""
    if recent is None:
        yield
        return
    logger = logging.getLogger("cmdc")
    saved = logger.handlers[:]
    lines = recent

    class ToTable(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = ToTable(logging.WARNING)
    logger.handlers = [h for h in saved if isinstance(h, logging.NullHandler)] + [handler]
    try:
        yield
    finally:
        logger.handlers = saved


async def _drive_all(
    options: DemoOptions,
    offload_dir: Path,
    stats: list[AgentStats],
    providers: list[Provider],
    out: TextIO,
    table: LiveTable | None,
    recent: deque[str],
    plans: list[Script],
    config: dict[str, Any],
    tools: list[Tool],
    summarizer: Summarizer | None,
    tracing: Tracer | None = None,
) -> None:
    by_name = {s.name: s for s in stats}

    def handle(event: Event) -> None:
        s = by_name.get(event.agent_id or "")
        if s is None:
            return
        _apply(s, event)
        line = _event_line(s, event)
        if line is None:
            return
        if table is None:
            print(line, file=out)
        else:
            recent.append(line)

    async def drive(ref: AgentRef, s: AgentStats, plan: Script) -> None:
        seen: set[str] = set()  # error results already counted
        for turn, messages in enumerate(plan.turns, 1):
            try:
                await ref.prompt(messages)
            except CmdcError as exc:
                s.errors.append(f"{s.name}, turn {turn}: {type(exc).__name__}: {exc}")
                fatal = isinstance(exc, ProviderError)  # auth, quota, connection: the next turn would fail too
                if table is None:
                    more = "; its remaining turns are skipped" if fatal else ""
                    print(f"{s.name}: turn {turn} failed: {type(exc).__name__}: {exc}{more}", file=out)
                if fatal:
                    s.turns = turn
                    return
            s.turns = turn
            state = await ref.state()
            s.tokens = state.token_usage
            for m in state.messages:
                if m.role == "tool" and m.is_error and m.id not in seen:
                    seen.add(m.id)
                    s.tool_errors.append(f"{s.name}: {' '.join(m.text.split())[:160]}")
            if table is None and turn % 10 == 0:
                print(
                    f"{s.name}: turn {turn}/{options.turns}: {s.tokens:,} tokens in context, "
                    f"{s.compactions} compactions ({s.forced} forced)",
                    file=out,
                )

    async with open_runtime(log_events=False, tracing=tracing) as rt:
        if options.ui is not None:
            server = await rt.serve_ui(options.ui)
            print(f"web page: {server.url}", file=out, flush=True)
        with rt.subscribe(buffer=100_000) as events:

            async def consume(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
                with trio.CancelScope() as scope:
                    task_status.started(scope)
                    async for event in events:
                        handle(event)

            async def redraw(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
                with trio.CancelScope() as scope:
                    task_status.started(scope)
                    while table is not None:
                        table.draw(live_lines(stats, options, recent))
                        await trio.sleep(0.1)

            refs = [
                await rt.spawn(
                    s.name,
                    provider,
                    tools=tools,
                    config=config,
                    summarizer=summarizer,
                    recall=True,
                    max_output_tokens=options.output_reserve,
                    compaction_cooldown=1.0,
                )
                for s, provider in zip(stats, providers, strict=True)
            ]
            try:
                async with trio.open_nursery() as nursery:
                    consumer: trio.CancelScope = await nursery.start(consume)
                    painter: trio.CancelScope = await nursery.start(redraw)
                    async with trio.open_nursery() as drivers:
                        for ref, s, plan in zip(refs, stats, plans, strict=True):
                            drivers.start_soon(drive, ref, s, plan)
                    consumer.cancel()
                    painter.cancel()
                while True:  # what the consumer had not taken yet
                    try:
                        handle(events.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if table is not None:
                    table.draw(live_lines(stats, options, recent))
            finally:
                if table is not None:
                    table.close()
            store = OffloadStore(offload_dir)
            for ref, s, plan in zip(refs, stats, plans, strict=True):
                state = await ref.state()
                s.tokens = state.token_usage
                if not s.errors:  # an agent whose turns failed has nothing to retain
                    s.retention = check_retention(state, plan, user_budget(options), s.turns)
                path = store.path_for(s.name)
                s.journal_bytes = path.stat().st_size if path.exists() else 0
            if options.ui is not None:
                print("turns done; the web page stays open until Ctrl-C", file=out, flush=True)
                await until_interrupted()


@trio.lowlevel.enable_ki_protection
def _remove_tree(directory: Path) -> None:
    """Remove the demo's temporary journals in trio's thread, shielded from Ctrl-C (trio raises
    it at the next checkpoint instead): a second Ctrl-C landing at the cleanup's checkpoints
    left the whole directory behind."""
    shutil.rmtree(directory, ignore_errors=True)


class _Terminated(KeyboardInterrupt):
    """The demo ended by a SIGTERM (`timeout`, a service manager), as by a Ctrl-C: the journals
    are removed and the command exits 143."""


async def _unless_terminated(terminations: AsyncIterator[int], run: Callable[[], Awaitable[None]]) -> None:
    """`run()`, cancelled by a SIGTERM (from `terminations`, a signal receiver), which then
    raises `_Terminated` (SIGTERM's default ended the process at once, the temporary journals
    left behind)."""
    terminated = False
    try:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal terminated
                async for _ in terminations:
                    terminated = True
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(watch)
            await run()
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # what `run()` raised, as itself (a Ctrl-C, an error)
        raised = [e for e in group.exceptions if not isinstance(e, trio.Cancelled)] or list(group.exceptions)
        if len(raised) != 1:
            raise
        reraise(raised[0])
    if terminated:
        raise _Terminated


async def until_interrupted() -> None:
    """Return at the first Ctrl-C (SIGINT), which then ends nothing else."""
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            return


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KB", "MB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _check(ok: bool, counts: tuple[int, int] | None = None, note: str = "") -> str:
    mark = "✓" if ok else "✗"
    return mark if counts is None else f"{mark} {counts[0]}/{counts[1]}{note}"


def _size_short(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if size >= 10 else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def final_table(stats: Sequence[AgentStats], options: DemoOptions) -> list[str]:
    """Per agent and in total: turns answered, compactions and forced ones, mean tokens before
    and after a compaction, journal size, the share of tool calls that worked, and the
    retention checks (task, user messages, pins). At most 80 columns with the default sizes."""
    head = (
        f"{'agent':<8} {'turns':>7} {'comp':>5} {'forced':>6} {'tokens':>11} {'journal':>7} {'tools':>5}  "
        f"{'task':<4} {'users':<10} {'pins'}"
    )
    rule = "-" * len(head)
    budgeted = False

    def row(name: str, group: Sequence[AgentStats]) -> str:
        nonlocal budgeted
        reports = [r for s in group for r in s.reports]
        before = round(sum(r.tokens_before for r in reports) / len(reports)) if reports else 0
        after = round(sum(r.tokens_after for r in reports) / len(reports)) if reports else 0
        tokens = f"{before:,}\N{RIGHTWARDS ARROW}{after:,}" if reports else "-"
        checks = [s.retention for s in group if s.retention is not None]
        users = (sum(c.users[0] for c in checks), sum(c.users[1] for c in checks))
        pins = (sum(c.pins[0] for c in checks), sum(c.pins[1] for c in checks))
        past_budget = any(c.users[1] < c.users_sent for c in checks)
        budgeted = budgeted or past_budget
        answered = sum(s.turns - len(s.errors) for s in group)
        turns = f"{answered}/{options.turns * len(group)}"
        calls = sum(s.tool_calls for s in group)
        tools = f"{100 * (calls - sum(s.tool_failed for s in group)) // calls}%" if calls else "-"
        retention = (
            f"{_check(all(c.task for c in checks)):<4} "
            f"{_check(users[0] == users[1], users, '*' if past_budget else ''):<10} "
            f"{_check(pins[0] == pins[1], pins)}"
            if checks
            else f"{'-':<4} {'-':<10} -"
        )
        return (
            f"{name:<8} {turns:>7} {len(reports):>5} {sum(s.forced for s in group):>6} {tokens:>11} "
            f"{_size_short(sum(s.journal_bytes for s in group)):>7} {tools:>5}  {retention}"
        )

    lines = [head, rule, *(row(s.name, [s]).rstrip() for s in stats), rule, row("total", stats).rstrip()]
    lines += [*cache_lines(stats), ""]
    lines += [
        "turns: answered/asked; comp: compactions; tokens: the mean before->after one",
        "tools: calls that worked; users: user messages in the context or quoted in",
        "the summary/sent; pins: pinned messages still in the context",
    ]
    if budgeted:
        lines += [
            f"* only the newest user messages within the preserved-messages budget ({user_budget(options):,}",
            "  tokens) must be quoted; older ones are in the journal",
        ]
    return lines


def cache_lines(stats: Sequence[AgentStats]) -> list[str]:
    """The prompt cache, per agent and in total: the prompt tokens of the agent's requests and
    of its compactions' summarizer requests, and the share of each read from the cache."""

    def share(cached: int, prompt: int) -> str:
        return f"{100 * cached / prompt:.0f}%" if prompt else "-"

    def row(name: str, group: Sequence[AgentStats]) -> str:
        prompt, cached = sum(s.prompt_tokens for s in group), sum(s.cached_tokens for s in group)
        reports = [r for s in group for r in s.reports]
        summarizer = sum(r.summarizer_input_tokens for r in reports)
        summarizer_cached = sum(r.summarizer_cache_read_tokens for r in reports)
        warm = sum(r.warm_cache for r in reports)
        both = share(cached + summarizer_cached, prompt + summarizer)
        return (
            f"{name:<8} {prompt:>12,} {share(cached, prompt):>6} {summarizer:>11,} "
            f"{share(summarizer_cached, summarizer):>6} {f'{warm}/{len(reports)}':>6} {both:>6}"
        )

    head = f"{'cache':<8} {'prompt tok.':>12} {'read':>6} {'summarizer':>11} {'read':>6} {'warm':>6} {'all':>6}"
    lines = ["", head, "-" * len(head), *(row(s.name, [s]) for s in stats)]
    if len(stats) > 1:
        lines.append(row("total", stats))
    lines.append("prompt tok.: the agents' requests; read: the share served from the prompt cache")
    lines.append("summarizer: the compactions' requests; warm: asked on the agent's cached prefix")
    writes = sum(s.cache_writes for s in stats)
    if writes:
        lines.append(f"{writes:,} tokens written to the prompt cache")
    return lines


__all__ = [
    "AgentStats",
    "DemoError",
    "DemoOptions",
    "LiveTable",
    "Retention",
    "check_retention",
    "final_table",
    "live_lines",
    "make_tools",
    "run_demo",
    "script",
]
