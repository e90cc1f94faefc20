"""OpenTelemetry traces of agents (extra `otel`: `pip install 'cmdc-agents[otel]'`).

    from opentelemetry.sdk.trace import TracerProvider
    async with cmdc.open_runtime(tracing=cmdc.otel.Tracing(tracer_provider=provider)) as rt: ...

Spans, after the OpenTelemetry GenAI semantic conventions (development status):

| span                       | kind     | when                                                  |
|----------------------------|----------|-------------------------------------------------------|
| `invoke_agent {agent}`     | INTERNAL | one turn (`prompt`), child of the span current where `prompt` was called |
| `chat {model}`             | CLIENT   | each model request (a retry after an overflow is another) |
| `execute_tool {tool}`      | INTERNAL | each tool call; a delegated agent's turn is its child  |
| `compact {agent}`          | INTERNAL | each compaction (auto, forced, manual)                |

Attributes: `gen_ai.operation.name`, `gen_ai.agent.name`, `gen_ai.conversation.id` (the agent),
`gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.request.max_tokens`, `server.address`
and `server.port` (HTTP providers), `gen_ai.usage.input_tokens` / `output_tokens` /
`cache_read.input_tokens` / `cache_creation.input_tokens` (per request, summed on the turn,
and on a compaction's span its summarizer requests' sum, with `cmdc.compaction.warm_cache`),
`gen_ai.response.finish_reasons`, `gen_ai.tool.name` / `call.id` / `type` /
`description`, `error.type`; compactions carry `cmdc.compaction.*` (reason, tokens and messages
before and after, evicted, the journal's record range, summarizer and its attempts, passes),
and the compactor's events (each summarizer attempt, fallbacks) are span events on them.

Privacy by default: no prompt, completion, tool argument or result text is recorded unless
`include_content=True` (then `gen_ai.input.messages`, `gen_ai.output.messages`,
`gen_ai.system_instructions`, `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result` and the
summary, each text clipped to `max_content_chars`).

A span that ends by an exception has an error status and `error.type` (its class name, or
`cancelled` when its task was cancelled: an aborted turn, a caller that gave up). Without
`include_content` its status description and `exception` event carry the error's type and
cmdc's own words for it only (`error_brief`), never its text, which may quote the conversation
(a summarizer's error, a provider's 400 echoing the prompt); the event's stack trace lists
the frames only. A tool result
the tool marked as an error sets `error.type` `tool_error`.

Tracing is off unless asked for: `open_runtime()` without `tracing=` does no tracing work, and
`Tracing()` without a `tracer_provider` uses the global one, which records nothing until an
application sets one (`opentelemetry.trace.set_tracer_provider`). Only `opentelemetry-api` is
needed; the SDK (or a vendor's distribution) is the application's choice.
"""

from __future__ import annotations

import contextlib
import contextvars
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
import orjson
import trio

from ._version import install_hint

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"cmdc.otel needs the otel extra: {install_hint('otel')} ({exc})") from exc

from ._check import flag, integer
from ._report import Compacted, CompactionReport, Skipped
from ._version import __version__
from .errors import CmdcError, ConfigError, ContextOverflow
from .events import (
    COMPACTION_FAILED,
    COMPACTION_FALLBACK,
    PINS_OVER_BUDGET,
    SUMMARIZER_ATTEMPT,
    SUMMARIZER_FALLBACK,
    TOOL_RESULTS_CLIPPED,
    Event,
)
from .message import Message, ToolCall
from .providers.base import STOP_REASON_KEY, ModelRequest, Provider
from .state import State
from .tools import Tool
from .tracing import Span

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

_PROVIDERS = {"OpenAIProvider": "openai", "AnthropicProvider": "anthropic"}

CONTENT_ATTRIBUTES = frozenset(
    {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "cmdc.compaction.summary",
    }
)
"""The attributes that carry conversation text: recorded only with `include_content=True`."""

SPAN_EVENTS = frozenset(
    {
        SUMMARIZER_ATTEMPT,
        SUMMARIZER_FALLBACK,
        COMPACTION_FALLBACK,
        COMPACTION_FAILED,
        PINS_OVER_BUDGET,
        TOOL_RESULTS_CLIPPED,
    }
)
"""The compactor's event kinds added to the current span (a compaction's, or a turn's for
clipped tool results) as span events, with their figures as `cmdc.*` attributes. Their `error`
texts (which may quote a model's answer) only with `include_content=True`."""


@attrs.define
class _TurnTotals:
    """What a turn's requests, tools and compactions add up to (set on the turn's span)."""

    requests: int = 0
    tool_calls: int = 0
    compactions: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0


_turn: contextvars.ContextVar[_TurnTotals | None] = contextvars.ContextVar("cmdc_otel_turn", default=None)


class Tracing:
    """A tracer for `open_runtime(tracing=...)`: OpenTelemetry spans of every agent's turns,
    model requests, tool calls and compactions.

    `tracer_provider`: where spans go (None: the global provider, which records nothing until
    the application sets one). `include_content`: also record the text of prompts, replies,
    tool arguments and results, and summaries (off by default: traces often leave the machine).
    `max_content_chars`: each such text is clipped to this many characters."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        include_content: bool = False,
        max_content_chars: int = 16_384,
    ) -> None:
        self.include_content = flag(include_content, "include_content")
        self.max_content_chars = integer(max_content_chars, "max_content_chars")
        if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
            raise ConfigError(f"tracer_provider must be an OpenTelemetry TracerProvider, got {tracer_provider!r:.80}")
        self.tracer = trace.get_tracer("cmdc", __version__, tracer_provider=tracer_provider)

    def __repr__(self) -> str:
        return f"Tracing(include_content={self.include_content})"

    # -- the cmdc.tracing.Tracer protocol ---------------------------------------------------------
    def turn(
        self, agent: str, incoming: tuple[Message, ...], parent: contextvars.Context | None
    ) -> AbstractContextManager[Span]:
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": agent,
        }
        parent_context = None if parent is None else parent.run(otel_context.get_current)
        return self._span(f"invoke_agent {agent}", SpanKind.INTERNAL, attributes, _Turn, incoming, parent_context)

    def request(self, agent: str, provider: Provider, request: ModelRequest) -> AbstractContextManager[Span]:
        model = _model_name(provider)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": _provider_name(provider),
            "gen_ai.request.model": model,
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": agent,
            "cmdc.request.messages": len(request.messages),
            "cmdc.request.tools": len(request.tools),
        }
        if request.max_output_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_output_tokens
        attributes.update(_server(provider))
        return self._span(f"chat {model}", SpanKind.CLIENT, attributes, _Request, request)

    def tool(self, agent: str, call: ToolCall, tool: Tool | None) -> AbstractContextManager[Span]:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": agent,
        }
        if tool is not None and tool.description:
            attributes["gen_ai.tool.description"] = tool.description
        return self._span(f"execute_tool {call.name}", SpanKind.INTERNAL, attributes, _Tool, call)

    def compaction(
        self, agent: str, reason: str, state: State, parent: contextvars.Context | None = None
    ) -> AbstractContextManager[Span]:
        attributes = {
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": agent,
            "cmdc.compaction.reason": reason,
            "cmdc.compaction.tokens_before": state.token_usage,
            "cmdc.compaction.messages_before": len(state.messages),
        }
        parent_context = None if parent is None else parent.run(otel_context.get_current)
        return self._span(f"compact {agent}", SpanKind.INTERNAL, attributes, _Compaction, state, parent_context)

    def event(self, event: Event) -> None:
        if event.kind not in SPAN_EVENTS:
            return
        span = trace.get_current_span()
        if not span.is_recording():
            return
        attributes: dict[str, Any] = {}
        for key, value in event.data.items():
            if key == "error" and not self.include_content:
                continue
            if isinstance(value, (str, bool, int, float)):
                attributes[f"cmdc.{key}"] = self.content(value) if isinstance(value, str) else value
        with contextlib.suppress(Exception):
            span.add_event(event.kind, attributes)

    # -- the span's life ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _span(
        self,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, Any],
        record: type[_Record],
        subject: Any,
        parent: otel_context.Context | None = None,
    ) -> Iterator[Span]:
        """Start a span (child of `parent`, else of the current span), make it current, end it
        on the way out: with an error status when the block raised, `cancelled` when its task
        was cancelled."""
        try:
            span = self.tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
        except Exception:  # a broken span processor: tracing never breaks an agent
            span = trace.INVALID_SPAN
        recorder = record(self, span, subject) if span.is_recording() else _Record(self, span, subject)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        totals = _turn.set(_TurnTotals()) if record is _Turn else None
        try:
            with contextlib.suppress(Exception):
                recorder.start()
            yield recorder
        except BaseException as exc:
            with contextlib.suppress(Exception):
                recorder.failed(exc)
            raise
        finally:
            with contextlib.suppress(Exception):
                recorder.finish()
            if totals is not None:
                _turn.reset(totals)
            otel_context.detach(token)
            with contextlib.suppress(Exception):
                span.end()

    def content(self, text: str) -> str:
        limit = self.max_content_chars
        return text if len(text) <= limit else f"{text[:limit]}…[{len(text) - limit} more characters]"

    def messages_json(self, messages: Sequence[Message]) -> str:
        """`messages` in the GenAI input/output messages JSON form, texts clipped."""
        return orjson.dumps([self.message_dict(m) for m in messages]).decode()

    def message_dict(self, m: Message) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        if m.role == "tool":
            parts.append({"type": "tool_call_response", "id": m.tool_call_id, "response": self.content(m.text)})
        elif m.text:
            parts.append({"type": "text", "content": self.content(m.text)})
        for call in m.tool_calls:
            arguments = self.content(orjson.dumps(_jsonable(call.arguments)).decode())
            parts.append({"type": "tool_call", "id": call.id, "name": call.name, "arguments": arguments})
        out: dict[str, Any] = {"role": m.role, "parts": parts}
        if m.role == "assistant":
            out["finish_reason"] = _finish_reason(m)
        return out


class _Record:
    """The `Span` an agent holds: records results as attributes (a non-recording span: nothing)."""

    def __init__(self, tracing: Tracing, span: trace.Span, subject: Any) -> None:
        self.tracing = tracing
        self.span = span
        self.subject = subject

    @property
    def content(self) -> bool:
        return self.tracing.include_content

    def start(self) -> None:
        return None

    def record(self, result: Message | Compacted | Skipped) -> None:
        if self.span.is_recording():
            with contextlib.suppress(Exception):
                self.recorded(result)

    def recorded(self, result: Message | Compacted | Skipped) -> None:
        return None

    def failed(self, exc: BaseException) -> None:
        span = self.span
        if not span.is_recording():
            return
        if _cancelled(exc):
            span.set_attribute("error.type", "cancelled")
            span.set_status(Status(StatusCode.ERROR, "cancelled"))
            return
        span.set_attribute("error.type", type(exc).__qualname__)
        if self.content:  # the error's own text, which may quote the conversation
            if isinstance(exc, Exception):
                span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))
            return
        brief = error_brief(exc)
        if isinstance(exc, Exception):  # as record_exception, without the message: frames only
            span.add_event(
                "exception",
                {
                    "exception.type": type(exc).__name__,
                    "exception.message": brief,
                    "exception.stacktrace": "".join(traceback.format_tb(exc.__traceback__))[-8_000:],
                    "exception.escaped": "False",
                },
            )
        span.set_status(Status(StatusCode.ERROR, brief))

    def finish(self) -> None:
        return None


class _Turn(_Record):
    def start(self) -> None:
        incoming: tuple[Message, ...] = self.subject
        if self.content:
            users = [m for m in incoming if m.role != "system"]
            self.span.set_attribute("gen_ai.input.messages", self.tracing.messages_json(users))

    def recorded(self, result: Message | Compacted | Skipped) -> None:
        if not isinstance(result, Message):
            return
        self.span.set_attribute("gen_ai.response.finish_reasons", (_finish_reason(result),))
        if self.content:
            self.span.set_attribute("gen_ai.output.messages", self.tracing.messages_json([result]))

    def finish(self) -> None:
        totals = _turn.get()
        if totals is None or not self.span.is_recording():
            return
        self.span.set_attributes(
            {
                "gen_ai.usage.input_tokens": totals.input_tokens,
                "gen_ai.usage.output_tokens": totals.output_tokens,
                "gen_ai.usage.cache_read.input_tokens": totals.cache_read_tokens,
                "gen_ai.usage.cache_creation.input_tokens": totals.cache_creation_tokens,
                "cmdc.turn.requests": totals.requests,
                "cmdc.turn.tool_calls": totals.tool_calls,
                "cmdc.turn.compactions": totals.compactions,
            }
        )


class _Request(_Record):
    def start(self) -> None:
        totals = _turn.get()
        if totals is not None:
            totals.requests += 1
        if not self.content:
            return
        request: ModelRequest = self.subject
        system = [m for m in request.messages if m.role == "system"]
        if system:
            parts = [{"type": "text", "content": self.tracing.content(m.text)} for m in system]
            self.span.set_attribute("gen_ai.system_instructions", orjson.dumps(parts).decode())
        others = [m for m in request.messages if m.role != "system"]
        self.span.set_attribute("gen_ai.input.messages", self.tracing.messages_json(others))

    def recorded(self, result: Message | Compacted | Skipped) -> None:
        if not isinstance(result, Message):
            return
        span = self.span
        span.set_attribute("gen_ai.response.finish_reasons", (_finish_reason(result),))
        span.set_attribute("cmdc.response.tool_calls", len(result.tool_calls))
        usage = result.usage
        if usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            if usage.cache_read_tokens:
                span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cache_read_tokens)
            if usage.cache_creation_tokens:
                span.set_attribute("gen_ai.usage.cache_creation.input_tokens", usage.cache_creation_tokens)
            totals = _turn.get()
            if totals is not None:
                totals.input_tokens += usage.input_tokens
                totals.output_tokens += usage.output_tokens
                totals.cache_read_tokens += usage.cache_read_tokens
                totals.cache_creation_tokens += usage.cache_creation_tokens
        if self.content:
            span.set_attribute("gen_ai.output.messages", self.tracing.messages_json([result]))

    def failed(self, exc: BaseException) -> None:
        super().failed(exc)
        if isinstance(exc, ContextOverflow) and self.span.is_recording():
            if exc.prompt_tokens is not None:
                self.span.set_attribute("cmdc.overflow.prompt_tokens", exc.prompt_tokens)
            if exc.limit is not None:
                self.span.set_attribute("cmdc.overflow.limit", exc.limit)


class _Tool(_Record):
    def start(self) -> None:
        totals = _turn.get()
        if totals is not None:
            totals.tool_calls += 1
        if self.content:
            call: ToolCall = self.subject
            arguments = orjson.dumps(_jsonable(call.arguments)).decode()
            self.span.set_attribute("gen_ai.tool.call.arguments", self.tracing.content(arguments))

    def recorded(self, result: Message | Compacted | Skipped) -> None:
        if not isinstance(result, Message):
            return
        if result.is_error:
            self.span.set_attribute("error.type", "tool_error")
            self.span.set_status(Status(StatusCode.ERROR, "the tool call's result is an error"))
        if self.content:
            self.span.set_attribute("gen_ai.tool.call.result", self.tracing.content(result.text))


class _Compaction(_Record):
    def start(self) -> None:
        totals = _turn.get()
        if totals is not None:
            totals.compactions += 1

    def recorded(self, result: Message | Compacted | Skipped) -> None:
        if isinstance(result, Compacted):
            self.report(result.report, result.state)
        elif isinstance(result, Skipped):
            self.span.set_attribute("cmdc.compaction.skipped", result.reason)
            if result.skipped_by is not None:
                self.span.set_attribute("cmdc.compaction.skipped_by", result.skipped_by)

    def report(self, report: CompactionReport, state: State | None) -> None:
        attributes: dict[str, Any] = {
            "cmdc.compaction.number": report.compaction,
            "cmdc.compaction.tokens_before": report.tokens_before,
            "cmdc.compaction.tokens_after": report.tokens_after,
            "cmdc.compaction.messages_before": report.messages_before,
            "cmdc.compaction.messages_after": report.messages_after,
            "cmdc.compaction.evicted": report.evicted,
            "cmdc.compaction.journal.first_seq": report.first_seq,
            "cmdc.compaction.journal.last_seq": report.last_seq,
            "cmdc.compaction.journal.path": report.offload_path,
            "cmdc.compaction.summary_tokens": report.summary_tokens,
            "cmdc.compaction.summarizer": report.summarizer,
            "cmdc.compaction.summarizer_attempts": report.attempts,
            "cmdc.compaction.passes": report.passes,
        }
        if report.fallback is not None:
            attributes["cmdc.compaction.fallback"] = report.fallback
        if report.summarizer_input_tokens or report.summarizer_output_tokens:
            # The summarizer's requests, summed (GenAI usage attributes: what the compaction cost).
            attributes["gen_ai.usage.input_tokens"] = report.summarizer_input_tokens
            attributes["gen_ai.usage.output_tokens"] = report.summarizer_output_tokens
            attributes["gen_ai.usage.cache_read.input_tokens"] = report.summarizer_cache_read_tokens
            attributes["gen_ai.usage.cache_creation.input_tokens"] = report.summarizer_cache_creation_tokens
        attributes["cmdc.compaction.warm_cache"] = report.warm_cache
        self.span.set_attributes(attributes)
        if self.content and state is not None:
            summary = next((m for m in state.messages if m.is_summary), None)
            if summary is not None:
                self.span.set_attribute("cmdc.compaction.summary", self.tracing.content(summary.text))

    def failed(self, exc: BaseException) -> None:
        super().failed(exc)
        report = getattr(exc, "report", None)  # CompactionIncomplete: compacted, still over a trigger
        if isinstance(report, CompactionReport) and self.span.is_recording():
            state = getattr(exc, "state", None)
            self.report(report, state if isinstance(state, State) else None)


# -- helpers --------------------------------------------------------------------------------------


def error_brief(exc: BaseException) -> str:
    """What a span says of an error without content capture: its type and cmdc's own words
    for it (the first sentence of a cmdc error class's description, an HTTP status, a context
    overflow's figures), never the error's text, which may quote a prompt (a summarizer's
    error, a provider's 400 echoing the request)."""
    name = type(exc).__name__
    if not isinstance(exc, CmdcError):
        return name
    doc = " ".join((type(exc).__doc__ or "").split("\n\n")[0].split())
    sentence = doc.split(". ")[0].rstrip(".")
    parts = [f"{name}: {sentence}" if sentence else name]
    status = getattr(exc, "status", None)
    if isinstance(status, int) and not isinstance(status, bool):
        parts.append(f"HTTP {status}")
    if isinstance(exc, ContextOverflow):
        parts += [f"{k} {v}" for k, v in (("prompt_tokens", exc.prompt_tokens), ("limit", exc.limit)) if v is not None]
    return "; ".join(parts)[:500]


def _cancelled(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(trio.Cancelled)
        return rest is None
    return False


def _finish_reason(m: Message) -> str:
    """The provider's stop reason; else what the reply shows (tool calls, or a finished answer)."""
    reason = m.metadata.get(STOP_REASON_KEY)
    if isinstance(reason, str) and reason:
        return reason
    return "tool_calls" if m.tool_calls else "stop"


def _provider_name(provider: Provider) -> str:
    known = _PROVIDERS.get(type(provider).__name__)
    if known is not None:
        return known
    name = getattr(provider, "name", None)
    return name if isinstance(name, str) and name else type(provider).__name__


def _model_name(provider: Provider) -> str:
    for attr in ("model", "name"):
        value = getattr(provider, attr, None)
        if isinstance(value, str) and value:
            return value
    return type(provider).__name__


def _server(provider: Provider) -> dict[str, Any]:
    base_url = getattr(provider, "base_url", None)
    if not isinstance(base_url, str) or not base_url:
        return {}
    try:
        parts = urlsplit(base_url)
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    except ValueError:
        return {}
    if not parts.hostname:
        return {}
    out: dict[str, Any] = {"server.address": parts.hostname}
    if port is not None:
        out["server.port"] = port
    return out


def _jsonable(value: Any) -> Any:
    """Frozen mappings and tuples as plain JSON values."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


# -- reading spans back: the tree `cmdc demo --trace` prints ------------------------------------------


def span_tree(spans: Sequence[ReadableSpan], *, agent: str | None = None) -> list[str]:
    """Finished spans (an SDK exporter's, e.g. `InMemorySpanExporter().get_finished_spans()`)
    as an indented tree, one line per span: its name, duration and key figures. `agent`: only
    the trees whose root span is that agent's."""
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    children: dict[int | None, list[ReadableSpan]] = {}
    for s in spans:
        parent = s.parent.span_id if s.parent is not None and s.parent.span_id in by_id else None
        children.setdefault(parent, []).append(s)
    for group in children.values():
        group.sort(key=lambda s: s.start_time or 0)
    roots = [
        r for r in children.get(None, []) if agent is None or (r.attributes or {}).get("gen_ai.agent.name") == agent
    ]
    lines: list[str] = []

    def walk(s: ReadableSpan, prefix: str, last: bool, root: bool) -> None:
        branch = "" if root else ("└─ " if last else "├─ ")
        lines.append(f"{prefix}{branch}{describe_span(s)}")
        kids = children.get(s.context.span_id if s.context is not None else None, [])
        inner = prefix if root else prefix + ("   " if last else "│  ")
        for i, kid in enumerate(kids):
            walk(kid, inner, i == len(kids) - 1, False)

    for r in roots:
        walk(r, "", True, True)
    return lines


def describe_span(s: ReadableSpan) -> str:
    """One line: the span's name, duration and key attributes (and its error, if any)."""
    a: Mapping[str, Any] = s.attributes or {}
    duration = ((s.end_time or 0) - (s.start_time or 0)) / 1e6
    figures: list[str] = []
    op = a.get("gen_ai.operation.name")
    if op == "invoke_agent":
        counts = [
            _count(a.get("cmdc.turn.requests", 0), "request"),
            _count(a.get("cmdc.turn.tool_calls", 0), "tool call"),
        ]
        if a.get("cmdc.turn.compactions"):
            counts.append(_count(a["cmdc.turn.compactions"], "compaction"))
        figures.append(", ".join(counts))
    elif op == "execute_tool":
        figures.append(f"call {a.get('gen_ai.tool.call.id', '?')}")
    elif "cmdc.compaction.reason" in a:
        figures.append(str(a["cmdc.compaction.reason"]))
        if "cmdc.compaction.tokens_after" in a:
            figures.append(
                f"{a['cmdc.compaction.tokens_before']:,} -> {a['cmdc.compaction.tokens_after']:,} tokens, "
                f"{a['cmdc.compaction.evicted']} evicted to journal #{a['cmdc.compaction.journal.first_seq']}"
                f"-{a['cmdc.compaction.journal.last_seq']}, "
                f"{_count(a['cmdc.compaction.summarizer_attempts'], 'summarizer attempt')}"
            )
        elif "cmdc.compaction.skipped" in a:
            figures.append(f"skipped: {a['cmdc.compaction.skipped']}")
    if "gen_ai.usage.input_tokens" in a:
        figures.append(f"in {a['gen_ai.usage.input_tokens']:,} out {a.get('gen_ai.usage.output_tokens', 0):,} tokens")
    reasons = a.get("gen_ai.response.finish_reasons")
    if op == "chat" and reasons:
        figures.append(f"finish {','.join(reasons)}")
    error = a.get("error.type")
    if error is not None:
        figures.append(f"✗ {error}")
    if "cmdc.overflow.prompt_tokens" in a and "cmdc.overflow.limit" in a:
        figures.append(f"(prompt {a['cmdc.overflow.prompt_tokens']:,} tokens, window {a['cmdc.overflow.limit']:,})")
    detail = "  ".join(f for f in figures if f)
    return f"{s.name}  {_duration(duration)}" + (f"  {detail}" if detail else "")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _duration(ms: float) -> str:
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 10:
        return f"{ms:.0f} ms"
    return f"{ms:.1f} ms"


__all__ = ["CONTENT_ATTRIBUTES", "Tracing", "describe_span", "span_tree"]
