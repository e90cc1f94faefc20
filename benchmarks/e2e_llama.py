"""Agents against a real model: llama.cpp's `llama-server` with SmolLM2-135M-Instruct in a
2,048-token window, the model summarizing its own context.

    python -m tests.e2e.llama_server fetch          # once per machine
    python -m benchmarks.e2e_llama [--turns 22]     # four runs, one table
    python -m benchmarks.e2e_llama --cache [--turns 20]  # prompt caching: cold vs warm compactions

Each run is one agent of `--turns` turns (a debugging session about a small web service) over
one API (OpenAI Chat Completions or Anthropic Messages, streaming or not) with either automatic
compaction (a token trigger below the window) or overflow-only compaction (no trigger the
conversation can reach: only the server's "context too long" compacts). Per run the table
gives the turns, the compactions (automatic / forced), the summaries accepted / rejected /
fallen back to the offline summarizer, replies cut off by the full window and continued, and
seconds per turn; then it checks that the journal holds exactly what left the context.
Every turn is bounded (`trio.fail_after`). The e2e tests run the same function.

`--cache` measures the server's prompt cache (llama-server reuses the KV cache of the common
prefix and reports `prompt_tokens_details.cached_tokens`): one agent of `--turns` turns with
automatic compaction, twice (summaries asked cold, with their own transcript request, then
warm, on the agent's cached prefix), printing per request the prompt tokens, those served from
the cache and those evaluated, and per session the share served from the cache.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

import cmdc
from cmdc.events import (
    COMPACTION_END,
    CONTINUED,
    OVERFLOW,
    SUMMARIZER_ATTEMPT,
    SUMMARIZER_FALLBACK,
    Event,
)
from cmdc.offload import OffloadStore
from cmdc.providers import AnthropicProvider, OpenAIProvider

Api = Literal["openai", "anthropic"]
Mode = Literal["auto", "overflow"]

WINDOW = 2048
REPLY_TOKENS = 64
"""Each answer's output limit: long enough to say something, short enough for a slow machine."""
CALL_SECONDS = 240.0
"""The bound on one HTTP request; one provider call, its retries included, gets twice that.
Loose on purpose: on an idle 2-core machine a request takes a second or two, but on one shared
by several test runs the server reads prompts at under 10 tokens/s."""
TURN_SECONDS = 900.0
"""The bound on one turn (its requests, retries and compactions)."""

INSTRUCTIONS = "You are a concise operations assistant. Answer in a few sentences."
PROMPTS = (
    "I'm deploying a small Flask app called ledgerd (an invoice ledger) behind gunicorn and nginx on a "
    "Debian 12 VM. The repository is github.com/acme/ledgerd and the entry point is ledgerd/wsgi.py. "
    "Give me a short checklist for the first deployment.",
    "gunicorn starts but nginx returns 502 Bad Gateway. The nginx error log says: connect() to "
    "unix:/run/ledgerd.sock failed (13: Permission denied). What does that mean?",
    "The socket is owned by ledgerd:ledgerd with mode 0660 and nginx runs as www-data. How do I fix "
    "the permissions without running nginx as root?",
    "That worked. Now /healthz answers 200 but POST /invoices times out after 30 seconds. gunicorn "
    "runs with --workers 2 --timeout 30. The handler calls the tax service at tax.internal:8443.",
    "curl from the VM to https://tax.internal:8443/rates hangs too. DNS resolves it to 10.20.0.14. "
    "What should I check on the network side?",
    "The firewall was blocking port 8443; I opened it with nft. POST /invoices now returns 500 with "
    "'psycopg.OperationalError: connection to server at \"db-01\" failed: FATAL: too many connections'.",
    "Postgres max_connections is 100 and we have 4 app servers with 2 workers each. Each worker uses "
    "SQLAlchemy with pool_size=20. Explain why we run out of connections.",
    "Should I add pgbouncer or just lower pool_size? We expect about 50 requests per second at peak.",
    "Let's set pool_size=5 and max_overflow=5. Write the SQLAlchemy create_engine call for "
    "postgresql+psycopg://ledgerd@db-01/ledger with those settings and pool_pre_ping.",
    "Next problem: the invoice PDF export (GET /invoices/<id>/pdf) uses WeasyPrint and takes 8 "
    "seconds for a 3-page invoice. Any quick wins?",
    "We decided to render PDFs in a background job with RQ and Redis. Sketch the job function "
    "render_invoice_pdf(invoice_id) and how the endpoint returns 202 with a status URL.",
    "Where should the generated PDFs live? We have an S3-compatible bucket ledgerd-pdfs on MinIO.",
    "Now logging: I want JSON logs from gunicorn and Flask with a request id that nginx sets in "
    "X-Request-ID. What do I configure in each of the three?",
    "The request id shows up in nginx logs but not in Flask's. My middleware reads "
    "request.headers['X-Request-Id']. Is the header name the issue?",
    "Good. Next: a health check for the load balancer should fail when the database is down but "
    "not when the tax service is down. How would you write /healthz?",
    "We also need a systemd unit for gunicorn. Write ledgerd.service with the socket, the user, "
    "Restart=on-failure and an EnvironmentFile at /etc/ledgerd/env.",
    "After a reboot the service fails: 'ModuleNotFoundError: No module named ledgerd'. "
    "WorkingDirectory is /srv/ledgerd and the venv is /srv/ledgerd/.venv. What's wrong?",
    "Fixed, it was ExecStart using the system python. Now let's plan zero-downtime deploys: "
    "two VMs behind the load balancer, releases as git tags. Outline the steps.",
    "How do database migrations (Alembic) fit into that without breaking the old release that is "
    "still serving traffic?",
    "Write the expand/contract plan for renaming the column invoices.total to invoices.total_cents.",
    "Last thing for today: summarize every change we made to the deployment so far, as a list I "
    "can paste into the ops ticket OPS-3318.",
    "Thanks. Tomorrow I'll start with the Redis persistence settings. What should I read first?",
    "One more: which of today's fixes would you monitor first after the next release, and with which metric?",
    "And which of them is most likely to regress if someone changes the nginx config?",
)


@attrs.frozen
class RunResult:
    """What one agent run did, with the figures the table shows."""

    name: str
    api: str
    stream: bool
    mode: str
    turns: int
    auto: int
    forced: int
    accepted: int
    rejected: int
    fallen_back: int
    continued: int
    overflows: int
    seconds: float
    journal: int
    evicted: int
    lost: tuple[str, ...]
    unknown: tuple[str, ...]
    replies: tuple[str, ...] = attrs.field(repr=False, default=())

    @property
    def per_turn(self) -> float:
        return self.seconds / max(1, self.turns)

    @property
    def journal_ok(self) -> bool:
        """Every message that left the context is in the journal, and the journal holds
        nothing else (summaries written and evicted within one turn included)."""
        return not self.lost and not self.unknown


def provider(url: str, api: Api, stream: bool, max_output_tokens: int = REPLY_TOKENS, **extra: Any) -> Any:
    """A provider for the server at `url` (no key: the server asks for none); `extra`: more
    keywords for `OpenAIProvider` (such as `extra_body`)."""
    if api == "openai":
        return OpenAIProvider(
            "smollm2",
            base_url=f"{url}/v1",
            api_key="",
            stream=stream,
            max_output_tokens=max_output_tokens,
            timeout=CALL_SECONDS,
            deadline=2 * CALL_SECONDS,
            **extra,
        )
    return AnthropicProvider(
        "smollm2",
        base_url=url,
        api_key="",
        stream=stream,
        max_output_tokens=max_output_tokens,
        timeout=CALL_SECONDS,
        deadline=2 * CALL_SECONDS,
    )


def run_name(api: Api, stream: bool, mode: Mode) -> str:
    return f"{api}-{'stream' if stream else 'plain'}-{mode}"


def config(mode: Mode, offload_dir: Path) -> dict[str, Any]:
    trigger = ("tokens", 1500) if mode == "auto" else ("tokens", 1_000_000)
    return {
        "compact_trigger": trigger,
        "compact_keep": ("messages", 2),
        "context_window": WINDOW,
        "compact_offload_dir": str(offload_dir),
    }


def _drain(sub: Any, into: list[Event]) -> None:
    while True:
        try:
            into.append(sub.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return


async def run_agent(
    url: str, *, api: Api, stream: bool, mode: Mode, turns: int, offload_dir: Path, name: str | None = None
) -> RunResult:
    """One agent of `turns` turns against the server at `url`; every turn bounded by `TURN_SECONDS`."""
    name = name or run_name(api, stream, mode)
    model = provider(url, api, stream)
    events: list[Event] = []
    seen: dict[str, cmdc.Message] = {}
    replies: list[str] = []
    started = time.monotonic()
    async with model, cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn(name, model, instructions=INSTRUCTIONS, config=config(mode, offload_dir))
        with rt.subscribe(name, buffer=100_000) as sub:
            for i in range(turns):
                with trio.fail_after(TURN_SECONDS):
                    reply = await agent.prompt(PROMPTS[i % len(PROMPTS)])
                replies.append(reply.text)
                for m in (await agent.state()).messages:
                    seen.setdefault(m.id, m)
                _drain(sub, events)
            final = await agent.state()
            await agent.stop()
            _drain(sub, events)
    seconds = time.monotonic() - started
    journal = await OffloadStore(offload_dir).read(name)
    in_journal = {m.id for m in journal}
    in_context = {m.id for m in final.messages}
    evicted = set(seen) - in_context
    lost = tuple(sorted(evicted - in_journal))
    # In the journal without ever being seen at a turn's end: only a summary made and evicted
    # within one turn may be (several compactions in one turn).
    unknown = tuple(sorted(m.id for m in journal if m.id not in seen and not m.is_summary))
    reports = [e.data["report"] for e in events if e.kind == COMPACTION_END and "report" in e.data]
    attempts = [e for e in events if e.kind == SUMMARIZER_ATTEMPT]
    return RunResult(
        name=name,
        api=api,
        stream=stream,
        mode=mode,
        turns=turns,
        auto=sum(1 for r in reports if r.reason == "auto"),
        forced=sum(1 for r in reports if r.reason == "forced"),
        accepted=sum(1 for e in attempts if e.data.get("ok") and e.data.get("role") == "primary"),
        rejected=sum(1 for e in attempts if not e.data.get("ok") and e.data.get("role") == "primary"),
        fallen_back=sum(1 for e in events if e.kind == SUMMARIZER_FALLBACK),
        continued=sum(1 for e in events if e.kind == CONTINUED),
        overflows=sum(1 for e in events if e.kind == OVERFLOW),
        seconds=seconds,
        journal=len(journal),
        evicted=len(evicted),
        lost=lost,
        unknown=unknown,
        replies=tuple(replies),
    )


def table(results: Sequence[RunResult]) -> str:
    head = (
        "run", "turns", "compactions auto/forced", "summaries ok/rejected/fallback", "cut+continued",
        "overflows", "s/turn", "journal == evicted",
    )  # fmt: skip
    rows = [
        (
            r.name,
            str(r.turns),
            f"{r.auto} / {r.forced}",
            f"{r.accepted} / {r.rejected} / {r.fallen_back}",
            str(r.continued),
            str(r.overflows),
            f"{r.per_turn:.1f}",
            f"yes ({r.journal})" if r.journal_ok else f"NO (lost {len(r.lost)}, unknown {len(r.unknown)})",
        )
        for r in results
    ]
    widths = [max(len(x[i]) for x in (head, *rows)) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in (head, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


RUNS: tuple[tuple[Api, bool, Mode], ...] = (
    ("openai", False, "auto"),
    ("openai", True, "overflow"),
    ("anthropic", True, "auto"),
    ("anthropic", False, "overflow"),
)


async def run_all(url: str, turns: int, runs: Sequence[tuple[Api, bool, Mode]] = RUNS) -> list[RunResult]:
    results = []
    with tempfile.TemporaryDirectory(prefix="cmdc-e2e-") as tmp:
        for api, stream, mode in runs:
            result = await run_agent(url, api=api, stream=stream, mode=mode, turns=turns, offload_dir=Path(tmp))
            print(table([result]).splitlines()[-1], file=sys.stderr, flush=True)
            results.append(result)
    return results


# -- prompt caching ---------------------------------------------------------------------------------


@attrs.frozen
class CacheRow:
    """One model request of a cache run: the agent's (`kind` "agent") or a compaction's
    summarizer's (`kind` "summary"); `after_change`: the first agent request after a
    compaction (its context changed, so its prefix did too); `warm`: a summarizer request on
    the agent's cached prefix."""

    kind: str
    prompt: int
    cached: int
    output: int
    after_change: bool = False
    warm: bool = False

    @property
    def evaluated(self) -> int:
        return self.prompt - self.cached


@attrs.frozen
class CacheRun:
    name: str
    rows: tuple[CacheRow, ...]
    compactions: int
    seconds: float

    def share(self, rows: Sequence[CacheRow] | None = None) -> float:
        """The share of prompt tokens served from the cache (all requests, summaries included)."""
        rows = self.rows if rows is None else rows
        prompt = sum(r.prompt for r in rows)
        return sum(r.cached for r in rows) / prompt if prompt else 0.0

    def steady(self) -> list[int]:
        """Per agent request between changes: the tokens of the previous agent request's prompt
        it evaluated again (0 for a perfect prefix: only the new tokens are evaluated)."""
        out: list[int] = []
        last: CacheRow | None = None
        for r in self.rows:
            if r.kind != "agent":
                continue
            if last is not None and not r.after_change:
                out.append(max(0, last.prompt - r.cached))
            last = r
        return out

    def summaries(self) -> list[CacheRow]:
        return [r for r in self.rows if r.kind == "summary"]


class _Recording(OpenAIProvider):
    """An `OpenAIProvider` that records each request's usage, agent's or summarizer's."""

    def __init__(self, log: list[CacheRow], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log = log

    async def complete(self, request: cmdc.providers.ModelRequest) -> cmdc.Message:
        reply = await super().complete(request)
        u = reply.usage
        if u is not None:
            summary = request.metadata.get("cmdc.purpose") == "summarize"
            after = bool(self.log) and self.log[-1].kind == "summary" and not summary
            warm = bool(request.metadata.get("cmdc.warm_cache"))
            kind = "summary" if summary else "agent"
            self.log.append(CacheRow(kind, u.input_tokens, u.cache_read_tokens, u.output_tokens, after, warm))
        return reply


def _recording(log: list[CacheRow], url: str) -> _Recording:
    return _Recording(
        log,
        "smollm2",
        base_url=f"{url}/v1",
        api_key="",
        max_output_tokens=REPLY_TOKENS,
        timeout=CALL_SECONDS,
        deadline=2 * CALL_SECONDS,
    )


async def run_cache(url: str, *, turns: int, warm: bool, offload_dir: Path) -> CacheRun:
    """One agent of `turns` turns (OpenAI API, automatic compaction, the model its own
    summarizer), summaries asked warm (the default: the summarizer is the agent's provider) or
    cold (the same server as a summarizer of its own, as before warm-cache compaction)."""
    name = f"cache-{'warm' if warm else 'cold'}"
    log: list[CacheRow] = []
    model = _recording(log, url)
    summarizer = None if warm else _recording(log, url)
    events: list[Event] = []
    started = time.monotonic()
    settings = {**config("auto", offload_dir), "compact_trigger": CACHE_TRIGGER}
    async with model, cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn(name, model, instructions=INSTRUCTIONS, config=settings, summarizer=summarizer)
        with rt.subscribe(name, buffer=100_000) as sub:
            for i in range(turns):
                with trio.fail_after(TURN_SECONDS):
                    await agent.prompt(PROMPTS[i % len(PROMPTS)])
                _drain(sub, events)
            await agent.stop()
            _drain(sub, events)
    if summarizer is not None:
        await summarizer.aclose()
    compactions = sum(1 for e in events if e.kind == COMPACTION_END)
    return CacheRun(name, tuple(log), compactions, time.monotonic() - started)


def cache_table(runs: Sequence[CacheRun]) -> str:
    """Per request (one column pair per run) and per session."""
    lines = []
    for run in runs:
        lines.append(f"{run.name}: request  kind     prompt  cached  evaluated")
        for i, r in enumerate(run.rows, 1):
            note = " (after a compaction)" if r.after_change else ""
            if r.kind == "summary":
                note = " (warm)" if r.warm else " (cold)"
            figures = f"{r.prompt:>6}  {r.cached:>6}  {r.evaluated:>9}{note}"
            lines.append(f"{'':>{len(run.name)}}  {i:>7}  {r.kind:<7} {figures}")
    lines.append("")
    head = ("run", "requests", "compactions", "from cache", "steady re-evaluated (max)", "summary evaluated / prompt")
    rows = []
    for run in runs:
        steady = run.steady()
        summaries = run.summaries()
        evaluated = sum(r.evaluated for r in summaries)
        prompt = sum(r.prompt for r in summaries)
        rows.append(
            (
                run.name,
                str(len(run.rows)),
                str(run.compactions),
                f"{run.share():.1%}",
                f"{max(steady) if steady else 0} (mean {sum(steady) / max(1, len(steady)):.1f})",
                f"{evaluated / max(1, len(summaries)):.0f} / {prompt / max(1, len(summaries)):.0f} per compaction",
            )
        )
    widths = [max(len(x[i]) for x in (head, *rows)) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in (head, *rows)]
    cold = [r for run in runs for r in run.summaries() if not r.warm]
    hot = [r for run in runs for r in run.summaries() if r.warm]
    if cold and hot:
        c = sum(r.prompt for r in cold) / len(cold)
        w = sum(r.evaluated for r in hot) / len(hot)
        lines.append(
            f"a warm summarizer request evaluates {w:.0f} tokens on average: {w / c:.0%} of a cold "
            f"summarizer request's {c:.0f} prompt tokens"
        )
    return "\n".join(lines)


CACHE_TRIGGER = ("tokens", 1300)
"""The cache runs' trigger: low enough that the agent's context, the summary instruction and
the summary's output budget fit the 2,048-token window together (the warm request)."""


async def run_caches(url: str, turns: int) -> list[CacheRun]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="cmdc-e2e-cache-") as tmp:
        for warm in (False, True):
            runs.append(await run_cache(url, turns=turns, warm=warm, offload_dir=Path(tmp)))
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    from tests.e2e import llama_server

    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e_llama", description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=22)
    parser.add_argument("--cache", action="store_true", help="measure the prompt cache: cold vs warm compactions")
    args = parser.parse_args(argv)
    why = llama_server.missing()
    if why is not None:
        print(why, file=sys.stderr)
        return 1
    if args.cache:
        with llama_server.cached_server() as server:
            print(cache_table(trio.run(run_caches, server.url, args.turns)))
        return 0
    with llama_server.cached_server() as server:
        started = time.monotonic()
        results = trio.run(run_all, server.url, args.turns)
        print(table(results))
        print(f"\n{len(results)} runs of {args.turns} turns in {time.monotonic() - started:.0f} s (SmolLM2-135M, "
              f"{WINDOW}-token window, llama-server -t 2)")  # fmt: skip
    return 0 if all(r.journal_ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
