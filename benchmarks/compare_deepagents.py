"""DeepAgents' `SummarizationMiddleware` and cmdc's `Compactor`, side by side, in one run.

Run: python -m benchmarks.compare_deepagents  (add --quick for 1k and 10k messages only)
Needs the optional extra: pip install -e '.[compare]'  (installs deepagents)

Both systems get the same synthetic conversations (`cmdc.testing.conversation`: a system
prompt, then rounds of user -> assistant with 1-3 tool calls -> their results -> assistant text,
~400 characters a message, usage reported on assistant messages) at 1k, 10k and 50k messages,
converted to LangChain messages for DeepAgents. Nothing touches the network: the chat model is
LangChain's `GenericFakeChatModel`, both summarizers answer "summary" at once, DeepAgents counts
tokens with its default `count_tokens_approximately` (characters / 4, no tokenizer to download),
LangSmith tracing is off, and opening a socket raises while the figures are measured.

Figures (medians of a few repetitions, `time.perf_counter`):

- per-turn check: DeepAgents does its work in `wrap_model_call`, around every model call (it
  has no `before_model` hook); it is timed with a handler that returns a canned response, on a
  request just under its trigger, so the figure is the middleware's own work when nothing is to
  be summarized. cmdc: `Compactor.should_compact` on a state one append past its last check.
- one compaction: DeepAgents' `wrap_model_call` on a request over its trigger (cutoff, media
  scan, the markdown offload through its `FilesystemBackend`, the summary, the summarization
  event); cmdc's `maybe_compact` (split, JSONL offload with fsync, summary, replace).
- offload over 5 successive compactions of ~1k messages into one file: DeepAgents'
  `_offload_to_backend` (the call its compaction makes), cmdc's `OffloadStore.append`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import attrs
import trio
from deepagents.backends import FilesystemBackend
from deepagents.middleware.summarization import SUMMARIZATION_EVENT_KEY, SummarizationMiddleware
from langchain.agents.middleware.types import ExtendedModelResponse, ModelRequest, ModelResponse
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.graph.message import add_messages

from benchmarks import bench_compaction
from cmdc import Compactor, ImagePart, Message, State
from cmdc.testing import conversation

KEEP = 20  # messages kept by a compaction, both systems
COMPACT_TRIGGER = 50_000  # tokens; every size measured is over it
INSTALL_HINT = "pip install -e '.[compare]'"


# -- the conversation, as LangChain messages ------------------------------------------------------
def to_langchain(messages: Sequence[Message], *, provider: str | None = None) -> list[BaseMessage]:
    """cmdc messages as LangChain messages, ids kept: system -> `SystemMessage`, user ->
    `HumanMessage`, assistant -> `AIMessage` (tool calls and usage carried over; `provider` goes
    into `response_metadata["model_provider"]`, as a real chat model's replies carry it), tool
    result -> `ToolMessage` (status "error" when it is an error)."""
    out: list[BaseMessage] = []
    for m in messages:
        content = _content(m)
        if m.role == "system":
            out.append(SystemMessage(content=content, id=m.id))
        elif m.role == "user":
            out.append(HumanMessage(content=content, id=m.id))
        elif m.role == "assistant":
            usage = None
            if m.usage is not None:
                usage = {
                    "input_tokens": m.usage.input_tokens,
                    "output_tokens": m.usage.output_tokens,
                    "total_tokens": m.usage.total_tokens,
                }
            out.append(
                AIMessage(
                    content=content,
                    id=m.id,
                    tool_calls=[
                        {"id": c.id, "name": c.name, "args": dict(c.arguments), "type": "tool_call"}
                        for c in m.tool_calls
                    ],
                    usage_metadata=usage,
                    response_metadata={} if provider is None else {"model_provider": provider},
                )
            )
        elif m.role == "tool":
            out.append(
                ToolMessage(
                    content=content,
                    id=m.id,
                    tool_call_id=m.tool_call_id or "",
                    status="error" if m.is_error else "success",
                )
            )
        else:  # pragma: no cover - Message validates its role
            raise ValueError(f"unknown role {m.role!r}")
    return out


def _content(m: Message) -> Any:
    if isinstance(m.content, str):
        return m.content
    return [
        {"type": "image", "url": p.source, "mime_type": p.media_type}
        if isinstance(p, ImagePart)
        else {"type": "text", "text": p.text}
        for p in m.content
    ]


# -- DeepAgents' side ----------------------------------------------------------------------------
def fake_model() -> GenericFakeChatModel:
    """A chat model answering instantly, with no profile (so no fraction-based defaults)."""
    return GenericFakeChatModel(messages=itertools.cycle([AIMessage(content="ok")]))


def provider_of(model: GenericFakeChatModel) -> str | None:
    provider = model._get_ls_params().get("ls_provider")
    return provider if isinstance(provider, str) else None


def instant_summary(messages: list[AnyMessage]) -> str:
    return "summary"


_REPLY: ModelResponse[Any] = ModelResponse(result=[AIMessage(content="done")])


def answer(request: ModelRequest[Any]) -> ModelResponse[Any]:
    """The model call the middleware wraps: a canned reply, so only the middleware is timed."""
    return _REPLY


def middleware(model: GenericFakeChatModel, backend: FilesystemBackend, trigger: int) -> SummarizationMiddleware:
    """The middleware as `create_deep_agent` builds it for a model without a profile (all the
    evicted history is summarized, tool arguments of old messages are truncated from 20
    messages on), with a token trigger, cmdc's keep rule and the instant summarizer."""
    return SummarizationMiddleware(
        model=model,
        backend=backend,
        trigger=("tokens", trigger),
        keep=("messages", KEEP),
        trim_tokens_to_summarize=None,
        truncate_args_settings={"trigger": ("messages", 20), "keep": ("messages", 20)},
        summarizer=instant_summary,
    )


def request_for(model: GenericFakeChatModel, messages: list[BaseMessage]) -> ModelRequest[Any]:
    """A model request as a LangChain agent makes it: the system prompt apart, the state's
    messages (with no summarization event or session yet)."""
    system = messages[0] if messages and isinstance(messages[0], SystemMessage) else None
    rest: list[AnyMessage] = messages[1:] if system is not None else messages  # type: ignore[assignment]
    return ModelRequest(model=model, messages=rest, system_message=system, tools=[], state={"messages": rest})


def da_check(model: GenericFakeChatModel, lc: list[BaseMessage], root: Path, budget: float) -> float:
    """Seconds per `wrap_model_call` when nothing needs summarizing (median)."""
    backend = FilesystemBackend(root_dir=root, virtual_mode=True)
    request = request_for(model, lc)
    probe = middleware(model, backend, 10**12)
    counted = probe._count_tokens(request.messages, request.system_message, request.tools)
    reported = max(
        (m.usage_metadata["total_tokens"] for m in lc if isinstance(m, AIMessage) and m.usage_metadata), default=0
    )
    mw = middleware(model, backend, max(counted, reported) + 1_000)  # just under the trigger
    if mw.wrap_model_call(request, answer) is not _REPLY:  # also the warm-up
        raise AssertionError("DeepAgents summarized below its trigger")
    return _median_timed(lambda: mw.wrap_model_call(request, answer), budget)


def da_append(lc: list[BaseMessage], budget: float) -> float:
    """Seconds to add one message to the state's messages through LangGraph's `add_messages`
    reducer, as a LangChain agent's state update does (median)."""
    fresh = (ToolMessage(content="x" * 400, tool_call_id="c") for _ in itertools.count())
    return _median_timed(lambda: add_messages(lc, [next(fresh)]), budget)  # type: ignore[arg-type]


def da_compaction(model: GenericFakeChatModel, lc: list[BaseMessage], root: Path, reps: int) -> float:
    """Seconds per `wrap_model_call` that summarizes and offloads (median)."""
    backend = FilesystemBackend(root_dir=root, virtual_mode=True)
    mw = middleware(model, backend, COMPACT_TRIGGER)
    samples = []
    for _ in range(reps):
        request = request_for(model, lc)  # a fresh state: a fresh session, a new history file
        t0 = time.perf_counter()
        result = mw.wrap_model_call(request, answer)
        samples.append(time.perf_counter() - t0)
        if not isinstance(result, ExtendedModelResponse) or result.command is None:
            raise AssertionError("DeepAgents did not summarize over its trigger")
        update = result.command.update
        assert isinstance(update, dict)
        if update[SUMMARIZATION_EVENT_KEY]["file_path"] is None:
            raise AssertionError("DeepAgents' offload failed")
    return statistics.median(samples)


def da_offloads(model: GenericFakeChatModel, root: Path, batches: int, size: int, series: int) -> list[float]:
    """Seconds per `_offload_to_backend` of successive ~`size`-message batches into one
    history file; per position, the median over `series` fresh files."""
    backend = FilesystemBackend(root_dir=root, virtual_mode=True)
    mw = middleware(model, backend, COMPACT_TRIGGER)
    provider = provider_of(model)
    lc_batches = [
        to_langchain(conversation(size, seed=100 + i, system=False), provider=provider) for i in range(batches)
    ]
    runs = []
    for k in range(series):
        times = []
        for batch in lc_batches:
            t0 = time.perf_counter()
            path = mw._offload_to_backend(backend, batch, f"session_successive_{k}")  # type: ignore[arg-type]
            times.append(time.perf_counter() - t0)
            if path is None:
                raise AssertionError("DeepAgents' offload failed")
        runs.append(times)
    return [statistics.median(t) for t in zip(*runs, strict=True)]


def _median_timed(fn: Callable[[], object], budget: float, least: int = 3, most: int = 200) -> float:
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < least or (len(samples) < most and time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


# -- cmdc's side -----------------------------------------------------------------------------------
def cmdc_check(messages: list[Message], reps: int) -> float:
    """Seconds per `should_compact` on a state just under its trigger, one append past its
    last check (median)."""
    tokens = State(agent_id="chk", messages=messages).token_usage
    state = State(agent_id="chk", messages=messages, config={"compact_trigger": ("tokens", tokens + 1_000)})
    compactor = Compactor(bench_compaction.instant)
    if compactor.should_compact(state):
        raise AssertionError("cmdc compacts below its trigger")
    return bench_compaction.time_should_compact(compactor, state, reps)


def cmdc_append(messages: list[Message], budget: float) -> float:
    """Seconds per `State.append` of one new message (its estimate included) (median)."""
    state = State(agent_id="app", messages=messages)
    fresh = (Message.tool_result("c", "x" * 400) for _ in itertools.count())
    return _median_timed(lambda: state.append(next(fresh)), budget)


async def cmdc_offloads(root: Path, batches: int, size: int, series: int) -> list[float]:
    runs = [
        await bench_compaction.time_successive_offloads(root, batches, size, f"successive-{k}") for k in range(series)
    ]
    return [statistics.median(t) for t in zip(*runs, strict=True)]


# -- the comparison --------------------------------------------------------------------------------
@attrs.frozen
class Size:
    n: int
    messages: int
    da_check: float
    cmdc_check: float
    da_append: float
    cmdc_append: float
    da_compaction: float
    cmdc_compaction: float


@attrs.frozen
class Comparison:
    deepagents: str  # its version
    sizes: list[Size]
    da_offloads: list[float]
    cmdc_offloads: list[float]
    offload_size: int


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """No tracing, and any attempt to open a network connection raises."""
    saved = {k: os.environ.get(k) for k in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2")}
    os.environ.update({k: "false" for k in saved})
    original = socket.socket.connect

    def refuse(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"compare_deepagents runs offline; something tried to connect to {address!r}")
        original(self, address)

    socket.socket.connect = refuse  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        socket.socket.connect = original  # type: ignore[method-assign]
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure(
    sizes: Sequence[int] = (1_000, 10_000, 50_000),
    reps: int = 5,
    *,
    check_budget: float = 1.0,
    offload_batches: int = 5,
    offload_size: int = 1_000,
    offload_series: int = 3,
    progress: Callable[[str], None] | None = None,
) -> Comparison:
    """Both systems at each size, one after the other, then the successive offloads."""
    say = progress or (lambda _s: None)
    model = fake_model()
    provider = provider_of(model)
    out = []
    with offline(), tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for n in sizes:
            messages = conversation(n, seed=n)
            lc = to_langchain(messages, provider=provider)
            say(f"{len(messages):,} messages: per-turn check")
            da_c = da_check(model, lc, root / "da-check", check_budget)
            cm_c = cmdc_check(messages, reps * 4)
            da_a = da_append(lc, check_budget / 2)
            cm_a = cmdc_append(messages, check_budget / 2)
            say(f"{len(messages):,} messages: one compaction")
            da_k = da_compaction(model, lc, root / "da-compact", reps)
            cm_k = trio.run(bench_compaction.time_compaction, messages, root / "cmdc-compact", reps)
            out.append(Size(n, len(messages), da_c, cm_c, da_a, cm_a, da_k, cm_k))
            del lc
        say("successive offloads")
        da_o = da_offloads(model, root / "da-offload", offload_batches, offload_size, offload_series)
        cm_o = trio.run(cmdc_offloads, root / "cmdc-offload", offload_batches, offload_size, offload_series)
    return Comparison(version("deepagents"), out, da_o, cm_o, offload_size)


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:,.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:,.1f} ms"
    return f"{seconds * 1e6:,.2f} µs"


def table(c: Comparison) -> str:
    head = ("", "messages", "DeepAgents", "cmdc", "DeepAgents / cmdc")
    rows: list[tuple[str, ...]] = []
    figures: list[tuple[str, str, str, str]] = [
        ("per-turn check", "da_check", "cmdc_check", "{:,.0f}x"),
        ("(append 1 message)", "da_append", "cmdc_append", "{:,.0f}x"),
        ("one compaction", "da_compaction", "cmdc_compaction", "{:,.1f}x"),
    ]
    for label, da, cm, ratio in figures:
        for s in c.sizes:
            d, k = getattr(s, da), getattr(s, cm)
            rows.append((label, f"{s.messages:,}", _duration(d), _duration(k), ratio.format(d / k)))
    for i, (d, k) in enumerate(zip(c.da_offloads, c.cmdc_offloads, strict=True)):
        rows.append((f"offload #{i + 1}", f"~{c.offload_size:,}", _duration(d), _duration(k), f"{d / k:,.2f}x"))
    rows.append(
        (
            f"offload #{len(c.da_offloads)} / #1",
            "",
            f"{c.da_offloads[-1] / c.da_offloads[0]:.2f}",
            f"{c.cmdc_offloads[-1] / c.cmdc_offloads[0]:.2f}",
            "",
        )
    )
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in pairs)

    return "\n".join([line(head), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


NOTES = """\
How it was measured (time.perf_counter, medians of repetitions; same conversations for both):
- DeepAgents {version}: SummarizationMiddleware configured as create_deep_agent does for a model
  without a profile (trim_tokens_to_summarize=None, tool-argument truncation from 20 messages),
  trigger ("tokens", N), keep 20 messages, summarizer = an instant function, FilesystemBackend in a
  temp dir, GenericFakeChatModel as the model, no tools in the request. Token counting: its
  default count_tokens_approximately (chars/4, scaled by reported usage): no tokenizer download.
  Measured through its sync hooks (no thread hop for file I/O); its file writes are not fsync'd.
- cmdc: Compactor with an instant async summarizer, trigger ("tokens", N), keep 20 messages,
  offload journal in a temp dir; every append fsync'd (file, and directory on create).
- per-turn check: DeepAgents has no before_model hook; its check runs inside wrap_model_call,
  timed with a handler returning a canned reply, on a request just under its trigger (it counts
  every message's tokens and scans for tool arguments to truncate on each call). cmdc:
  should_compact on a state one append past its last check.
- (append 1 message): not part of the check, for context: what adding the next message to the
  state costs each system: LangGraph's add_messages reducer (a LangChain agent's state update);
  cmdc's State.append (copies the tuple, keeps the token figure up to date).
- one compaction: DeepAgents wrap_model_call over its trigger ({trigger:,} tokens): cutoff, media
  scan, markdown offload, summary, summarization event. cmdc: maybe_compact: split, offload,
  summary, replace.
- offload #1-#{batches}: successive batches of ~{size:,} messages into one file, median over {series}
  fresh files: DeepAgents _offload_to_backend (reads the whole history file, appends a markdown
  section, rewrites the file); cmdc OffloadStore.append (O_APPEND, JSONL).
Network: sockets refused and LangSmith tracing off for the whole run."""


def notes(c: Comparison, series: int) -> str:
    return NOTES.format(
        version=c.deepagents, trigger=COMPACT_TRIGGER, batches=len(c.da_offloads), size=c.offload_size, series=series
    )


def main(argv: Sequence[str] | None = None) -> Comparison:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1k and 10k messages, fewer repetitions")
    args = parser.parse_args(argv)
    sizes = (1_000, 10_000) if args.quick else (1_000, 10_000, 50_000)
    reps, budget, series = (3, 0.3, 2) if args.quick else (5, 1.0, 3)
    t0 = time.perf_counter()
    c = measure(
        sizes,
        reps,
        check_budget=budget,
        offload_series=series,
        progress=lambda s: print(f"  … {s}", file=sys.stderr, flush=True),
    )
    print(
        f"\nDeepAgents {c.deepagents} SummarizationMiddleware vs cmdc Compactor, instant summarizers, "
        f"~400-char messages ({time.perf_counter() - t0:.0f} s)"
    )
    print(table(c))
    print()
    print(notes(c, series))
    return c


if __name__ == "__main__":
    main()
