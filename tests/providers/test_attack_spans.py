"""Prompt text never reaches spans through an error (issue 24, item 2): with tracing at its
private defaults, a summarizer error quoting the conversation and a provider 400 echoing the
prompt leave the `compact`, `chat` and turn spans with the error's type and cmdc's own words;
with `include_content=True` the error's text is kept, as before."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import cmdc
import cmdc.otel
from cmdc import Message, open_runtime
from cmdc.errors import CmdcError, ProviderError
from cmdc.providers import ScriptedProvider
from cmdc.providers.overflow import classify

PADDING = "\n" + " ".join(f"line {i} of a long report." for i in range(200))
SECRET = "SECRET-CONVERSATION-TEXT"


def recorder() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def everything(span: ReadableSpan) -> str:
    """All a span carries that an exporter sends: attributes, events and status."""
    return repr((dict(span.attributes or {}), [(e.name, dict(e.attributes or {})) for e in span.events], span.status))


async def test_a_summarizer_error_quoting_the_conversation_stays_off_the_compact_span(tmp_path: Path) -> None:
    for content in (False, True):
        provider, exporter = recorder()

        async def quoting(messages: Sequence[Message], instruction: str) -> str:
            raise ValueError(f"cannot summarize {' '.join(m.text for m in messages)[:300]!r}")

        config = {
            "compact_offload_dir": str(tmp_path / f"o{content}"),
            "compact_keep": ("messages", 2),
            "compact_trigger": ("tokens", 100_000),
        }
        tracing = cmdc.otel.Tracing(tracer_provider=provider, include_content=content)
        async with open_runtime(log_events=False, tracing=tracing) as rt:
            agent = await rt.spawn(
                "a1", ScriptedProvider([f"one {SECRET}" + PADDING, "two" + PADDING]), config=config, summarizer=quoting
            )
            await agent.prompt(f"first {SECRET}")
            await agent.prompt("second")
            with pytest.raises(CmdcError):
                await agent.compact()
        (compact,) = [s for s in exporter.get_finished_spans() if s.name == "compact a1"]
        assert compact.status.status_code is StatusCode.ERROR
        assert (SECRET in everything(compact)) is content
        if not content:
            assert compact.status.description is not None
            assert compact.status.description.startswith("SummarizerError: ")
            (event,) = [e for e in compact.events if e.name == "exception"]
            assert dict(event.attributes or {})["exception.type"] == "SummarizerError"
            assert "in summarize" in str(dict(event.attributes or {})["exception.stacktrace"])


async def test_a_provider_400_echoing_the_prompt_stays_off_the_chat_and_turn_spans(tmp_path: Path) -> None:
    for content in (False, True):
        provider, exporter = recorder()
        echo = classify(400, {}, {"error": {"message": f"Invalid request near: {SECRET} please", "type": "invalid"}})
        assert isinstance(echo, ProviderError) and SECRET in str(echo)
        tracing = cmdc.otel.Tracing(tracer_provider=provider, include_content=content)
        async with open_runtime(log_events=False, tracing=tracing) as rt:
            agent = await rt.spawn("a1", ScriptedProvider([echo]), config={"compact_offload_dir": str(tmp_path)})
            with pytest.raises(ProviderError):
                await agent.prompt("hello")
        spans = {s.name: s for s in exporter.get_finished_spans()}
        chat = next(s for name, s in spans.items() if name.startswith("chat "))
        turn = spans["invoke_agent a1"]
        for span in (chat, turn):
            assert span.status.status_code is StatusCode.ERROR
            assert (SECRET in everything(span)) is content
        if not content:
            brief = chat.status.description or ""
            assert brief.startswith(f"{type(echo).__name__}: ") and brief.endswith("; HTTP 400")
