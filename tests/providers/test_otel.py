"""OpenTelemetry traces (`cmdc.otel`): the span tree of a session with tools, a forced compaction
and a delegation, with the SDK's in-memory exporter; nothing without a provider; no content
unless asked for; spans of cancelled work end with an error; a broken exporter breaks nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import cmdc
import cmdc.otel
from cmdc import ContextOverflow, Message, TokenUsage, ToolCall, open_runtime, tool
from cmdc.agent import current_chain
from cmdc.compaction import ExtractiveSummarizer
from cmdc.errors import ConfigError, TurnAborted
from cmdc.providers import ModelRequest, ScriptedProvider

ROOT = Path(__file__).resolve().parents[2]
PADDING = "\n" + " ".join(f"line {i} of a long report." for i in range(200))
SECRETS = ("SECRET-PROMPT", "SECRET-ARG", "SECRET-RESULT", "SECRET-REPLY", "SECRET-CHILD", "SECRET-SYSTEM")


def recorder() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def config(tmp_path: Path) -> dict[str, Any]:
    return {
        "compact_offload_dir": str(tmp_path / "offload"),
        "compact_keep": ("messages", 2),
        "compact_trigger": ("tokens", 100_000),
    }


@tool
async def lookup(query: str) -> str:
    """Look something up.

    Args:
        query: What to look up.
    """
    return f"SECRET-RESULT for {query}" + PADDING


def usage(i: int, o: int) -> TokenUsage:
    return TokenUsage(input_tokens=i, output_tokens=o)


class Family:
    """The lead follows its script; its temporary children (same provider) answer at once."""

    name = "family"
    model = "family-model-1"

    def __init__(self) -> None:
        self.lead = ScriptedProvider(
            [
                # turn 1: a tool call and a delegation, then the answer
                Message.assistant(
                    "",
                    tool_calls=(
                        ToolCall(id="t1", name="lookup", arguments={"query": "SECRET-ARG"}),
                        ToolCall(id="d1", name="delegate", arguments={"task": "SECRET-CHILD task: 2 + 2"}),
                    ),
                    usage=usage(100, 10),
                ),
                Message.assistant("SECRET-REPLY one", usage=usage(1_500, 5)),
                # turn 2: "too long" (a forced compaction and a retry), then the answer
                ContextOverflow("prompt too long", prompt_tokens=9_000, limit=8_000),
                Message.assistant("SECRET-REPLY two", usage=usage(50, 7)),
            ]
        )

    async def complete(self, request: ModelRequest) -> Message:
        if current_chain.get()[-1] == "lead":
            return await self.lead.complete(request)
        return Message.assistant("SECRET-REPLY child: 4", usage=usage(30, 3))


async def session(tmp_path: Path, tracing: Any) -> None:
    async with open_runtime(log_events=False, tracing=tracing) as rt:
        lead = await rt.spawn(
            "lead",
            Family(),
            instructions="SECRET-SYSTEM: you are the lead",
            tools=[lookup],
            config=config(tmp_path),
            summarizer=ExtractiveSummarizer(),
            delegation=True,
        )
        assert (await lead.prompt("SECRET-PROMPT one")).text == "SECRET-REPLY one"
        assert (await lead.prompt("SECRET-PROMPT two")).text == "SECRET-REPLY two"
        assert (await lead.state()).compactions == 1


def tree(spans: Sequence[ReadableSpan]) -> dict[int | None, list[ReadableSpan]]:
    ids = {s.context.span_id for s in spans if s.context is not None}
    out: dict[int | None, list[ReadableSpan]] = {}
    for s in sorted(spans, key=lambda s: s.start_time or 0):
        parent = s.parent.span_id if s.parent is not None else None
        assert parent is None or parent in ids, f"{s.name}: parent span missing"
        out.setdefault(parent, []).append(s)
    return out


def kids(t: dict[int | None, list[ReadableSpan]], s: ReadableSpan) -> list[ReadableSpan]:
    assert s.context is not None
    return t.get(s.context.span_id, [])


def attrs_of(s: ReadableSpan) -> dict[str, Any]:
    return dict(s.attributes or {})


async def test_session_tree_shape_and_attributes(tmp_path: Path) -> None:
    provider, exporter = recorder()
    await session(tmp_path, cmdc.otel.Tracing(tracer_provider=provider))
    spans = exporter.get_finished_spans()
    t = tree(spans)
    roots = t[None]
    assert [s.name for s in roots] == ["invoke_agent lead", "invoke_agent lead"]
    assert len({s.context.trace_id for s in roots if s.context is not None}) == 2  # a trace per turn

    # turn 1: request, two tools (the delegated child's turn under `delegate`), request
    one = roots[0]
    names = [s.name for s in kids(t, one)]
    assert names[0] == "chat family-model-1" and names[-1] == "chat family-model-1"
    assert sorted(names[1:3]) == ["execute_tool delegate", "execute_tool lookup"]
    a = attrs_of(one)
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "lead"
    assert a["gen_ai.usage.input_tokens"] == 1_600 and a["gen_ai.usage.output_tokens"] == 15  # the lead's own
    assert a["cmdc.turn.requests"] == 2 and a["cmdc.turn.tool_calls"] == 2 and a["cmdc.turn.compactions"] == 0
    assert a["gen_ai.response.finish_reasons"] == ("stop",)
    assert one.status.status_code is StatusCode.UNSET

    chat = kids(t, one)[0]
    c = attrs_of(chat)
    assert c["gen_ai.operation.name"] == "chat" and c["gen_ai.request.model"] == "family-model-1"
    assert c["gen_ai.provider.name"] == "family"
    assert c["gen_ai.usage.input_tokens"] == 100 and c["gen_ai.usage.output_tokens"] == 10
    assert c["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert chat.kind is trace.SpanKind.CLIENT

    tools = {s.name: s for s in kids(t, one)[1:3]}
    look = attrs_of(tools["execute_tool lookup"])
    assert look["gen_ai.operation.name"] == "execute_tool" and look["gen_ai.tool.name"] == "lookup"
    assert look["gen_ai.tool.call.id"] == "t1" and look["gen_ai.tool.type"] == "function"
    assert look["gen_ai.tool.description"] == "Look something up."
    assert kids(t, tools["execute_tool lookup"]) == []

    # the delegation: the child's whole turn is a child of the parent's `delegate` tool span
    delegated = kids(t, tools["execute_tool delegate"])
    assert len(delegated) == 1 and re.fullmatch(r"invoke_agent lead\.child1-[0-9a-f]{12}", delegated[0].name)
    child = delegated[0]
    assert child.context is not None and one.context is not None
    assert child.context.trace_id == one.context.trace_id
    assert [s.name for s in kids(t, child)] == ["chat family-model-1"]
    assert attrs_of(child)["gen_ai.usage.input_tokens"] == 30

    # turn 2: the overflowing request (an error), the forced compaction, the retry
    two = roots[1]
    overflow, compact, retry = kids(t, two)
    assert overflow.name == "chat family-model-1" and overflow.status.status_code is StatusCode.ERROR
    o = attrs_of(overflow)
    assert o["error.type"] == "ContextOverflow"
    assert o["cmdc.overflow.prompt_tokens"] == 9_000 and o["cmdc.overflow.limit"] == 8_000
    assert compact.name == "compact lead" and compact.status.status_code is StatusCode.UNSET
    k = attrs_of(compact)
    assert k["cmdc.compaction.reason"] == "forced" and k["cmdc.compaction.number"] == 1
    assert k["cmdc.compaction.evicted"] >= 2
    assert k["cmdc.compaction.tokens_after"] < k["cmdc.compaction.tokens_before"]
    assert k["cmdc.compaction.messages_after"] < k["cmdc.compaction.messages_before"]
    assert 1 <= k["cmdc.compaction.journal.first_seq"] <= k["cmdc.compaction.journal.last_seq"]
    assert (
        k["cmdc.compaction.journal.last_seq"] - k["cmdc.compaction.journal.first_seq"] + 1
        >= k["cmdc.compaction.evicted"]
    )
    assert k["cmdc.compaction.summarizer_attempts"] >= 1 and k["cmdc.compaction.summarizer"]
    assert k["cmdc.compaction.journal.path"].endswith("lead.jsonl")
    attempts = [e for e in compact.events if e.name == "summarizer_attempt"]  # the compactor's events
    assert attempts and dict(attempts[-1].attributes or {})["cmdc.ok"] is True
    assert len(attempts) == k["cmdc.compaction.summarizer_attempts"]
    assert retry.name == "chat family-model-1" and retry.status.status_code is StatusCode.UNSET
    assert attrs_of(two)["cmdc.turn.requests"] == 2 and attrs_of(two)["cmdc.turn.compactions"] == 1

    # every span ended, none twice, and the readable tree shows it all
    assert len(spans) == 2 + 4 + 2 + 3
    lines = cmdc.otel.span_tree(spans, agent="lead")
    assert len(lines) == len(spans)
    assert lines[0].startswith("invoke_agent lead  ")
    assert any("└─ invoke_agent lead.child1-" in ln for ln in lines)
    assert any("compact lead" in ln and "forced" in ln and "evicted" in ln for ln in lines)
    assert any("✗ ContextOverflow" in ln for ln in lines)


async def test_no_content_by_default(tmp_path: Path) -> None:
    provider, exporter = recorder()
    await session(tmp_path, cmdc.otel.Tracing(tracer_provider=provider))
    spans = exporter.get_finished_spans()
    assert spans
    for s in spans:
        assert not set(attrs_of(s)) & cmdc.otel.CONTENT_ATTRIBUTES, s.name
        text = orjson.dumps([attrs_of(s), [(e.name, dict(e.attributes or {})) for e in s.events]]).decode()
        for secret in SECRETS:
            assert secret not in text, (s.name, secret)


async def test_content_when_asked(tmp_path: Path) -> None:
    provider, exporter = recorder()
    await session(tmp_path, cmdc.otel.Tracing(tracer_provider=provider, include_content=True))
    spans = exporter.get_finished_spans()
    by_name: dict[str, list[dict[str, Any]]] = {}
    for s in sorted(spans, key=lambda s: s.start_time or 0):
        if attrs_of(s)["gen_ai.agent.name"] == "lead":
            by_name.setdefault(s.name, []).append(attrs_of(s))
    turn = by_name["invoke_agent lead"][0]
    assert orjson.loads(turn["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "SECRET-PROMPT one"}]}
    ]
    out = orjson.loads(turn["gen_ai.output.messages"])
    assert out[0]["role"] == "assistant" and out[0]["parts"][0]["content"] == "SECRET-REPLY one"
    first_chat = by_name["chat family-model-1"][0]
    assert "SECRET-SYSTEM" in orjson.loads(first_chat["gen_ai.system_instructions"])[0]["content"]
    inputs = orjson.loads(first_chat["gen_ai.input.messages"])
    assert [m["role"] for m in inputs] == ["user"]  # the system prompt is not repeated there
    calls = orjson.loads(first_chat["gen_ai.output.messages"])[0]["parts"]
    assert {p["type"] for p in calls} == {"tool_call"} and {p["name"] for p in calls} == {"lookup", "delegate"}
    look = by_name["execute_tool lookup"][0]
    assert orjson.loads(look["gen_ai.tool.call.arguments"]) == {"query": "SECRET-ARG"}
    assert look["gen_ai.tool.call.result"] == "SECRET-RESULT for SECRET-ARG" + PADDING
    assert by_name["execute_tool delegate"][0]["gen_ai.tool.call.result"] == "SECRET-REPLY child: 4"
    second_request = by_name["chat family-model-1"][1]  # after the tools: the results are in the input
    parts = [p for m in orjson.loads(second_request["gen_ai.input.messages"]) for p in m["parts"]]
    assert {"type": "tool_call_response", "id": "t1", "response": "SECRET-RESULT for SECRET-ARG" + PADDING} in parts
    summary = by_name["compact lead"][0]["cmdc.compaction.summary"]
    assert summary.startswith("[Conversation summary #1]") and "SECRET-CHILD" in summary


async def test_content_is_clipped(tmp_path: Path) -> None:
    provider, exporter = recorder()
    tracing = cmdc.otel.Tracing(tracer_provider=provider, include_content=True, max_content_chars=20)
    async with open_runtime(log_events=False, tracing=tracing) as rt:
        agent = await rt.spawn("a1", ScriptedProvider(["y" * 1_000]), config=config(tmp_path))
        await agent.prompt("x" * 1_000)
    turn = next(s for s in exporter.get_finished_spans() if s.name == "invoke_agent a1")
    (message,) = orjson.loads(attrs_of(turn)["gen_ai.input.messages"])
    assert message["parts"][0]["content"] == "x" * 20 + "…[980 more characters]"
    assert len(attrs_of(turn)["gen_ai.output.messages"]) < 200


async def test_no_provider_records_nothing(tmp_path: Path) -> None:
    provider, exporter = recorder()
    # no tracing at all
    await session(tmp_path / "a", None)
    # Tracing() on the global provider, which nobody set: a no-op, recording nothing
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    await session(tmp_path / "b", cmdc.otel.Tracing())
    assert exporter.get_finished_spans() == ()
    del provider


def test_import_cmdc_needs_no_opentelemetry() -> None:
    """`import cmdc` and a whole traced-off session never import opentelemetry."""
    code = (
        "import sys, trio, cmdc\n"
        "from cmdc.providers import ScriptedProvider\n"
        "async def main():\n"
        "    async with cmdc.open_runtime(log_events=False) as rt:\n"
        "        a = await rt.spawn('a1', ScriptedProvider(['hi']), config={'compact_offload_dir': 'o'})\n"
        "        assert (await a.prompt('hello')).text == 'hi'\n"
        "trio.run(main)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


async def test_turn_is_a_child_of_the_callers_span(tmp_path: Path) -> None:
    """A turn (and a manual compaction) is parented by the span current where it was asked for,
    though it runs in the agent's own task."""
    provider, exporter = recorder()
    tracer = provider.get_tracer("app")
    async with open_runtime(log_events=False, tracing=cmdc.otel.Tracing(tracer_provider=provider)) as rt:
        agent = await rt.spawn(
            "a1",
            ScriptedProvider(["one" + PADDING, "two" + PADDING, "three"]),
            config=config(tmp_path),
            summarizer=ExtractiveSummarizer(),
        )
        with tracer.start_as_current_span("handle request") as outer:
            await agent.prompt("first")
            await agent.prompt("second")
            outcome = await agent.compact()
        await agent.prompt("third")  # outside: a root of its own
    assert isinstance(outcome, cmdc.Compacted)
    spans = exporter.get_finished_spans()
    t = tree(spans)
    (app,) = (s for s in t[None] if s.name == "handle request")
    assert [s.name for s in kids(t, app)] == ["invoke_agent a1", "invoke_agent a1", "compact a1"]
    manual = kids(t, app)[2]
    assert attrs_of(manual)["cmdc.compaction.reason"] == "manual"
    assert [s.name for s in t[None]] == ["handle request", "invoke_agent a1"]
    assert outer.get_span_context().trace_id == kids(t, app)[0].context.trace_id


async def test_auto_compaction_span_only_when_due(tmp_path: Path) -> None:
    """A step under every trigger opens no compaction span; one over a trigger does."""
    provider, exporter = recorder()
    small = {**config(tmp_path), "compact_trigger": ("messages", 5)}
    async with open_runtime(log_events=False, tracing=cmdc.otel.Tracing(tracer_provider=provider)) as rt:
        agent = await rt.spawn(
            "a1",
            ScriptedProvider([f"r{i}" + PADDING for i in range(3)]),
            config=small,
            summarizer=ExtractiveSummarizer(),
        )
        for i in range(3):
            await agent.prompt(f"question {i}")
    spans = exporter.get_finished_spans()
    compactions = [s for s in spans if s.name == "compact a1"]
    assert len(compactions) == 1
    assert attrs_of(compactions[0])["cmdc.compaction.reason"] == "auto"
    assert "cmdc.compaction.tokens_after" in attrs_of(compactions[0])


async def test_cancelled_turn_ends_its_spans_with_an_error(tmp_path: Path) -> None:
    """An aborted turn: the turn's and the running tool's spans end, status error, `cancelled`."""
    provider, exporter = recorder()
    started = trio.Event()

    @tool
    async def slow() -> str:
        """Takes its time."""
        started.set()
        await trio.sleep_forever()
        return "never"

    script = ScriptedProvider([ScriptedProvider.tool_call("slow", id="s1"), "after"])
    async with open_runtime(log_events=False, tracing=cmdc.otel.Tracing(tracer_provider=provider)) as rt:
        agent = await rt.spawn("a1", script, tools=[slow], config=config(tmp_path))
        async with trio.open_nursery() as nursery:

            async def ask() -> None:
                with pytest.raises(TurnAborted):
                    await agent.prompt("go")

            nursery.start_soon(ask)
            await started.wait()
            agent.abort()
        assert (await agent.prompt("again")).text == "after"
    spans = {s.name: s for s in exporter.get_finished_spans() if s.name != "invoke_agent a1"}
    turns = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent a1"]
    assert len(turns) == 2
    aborted, ok = sorted(turns, key=lambda s: s.start_time or 0)
    for s in (aborted, spans["execute_tool slow"]):
        assert s.status.status_code is StatusCode.ERROR and s.status.description == "cancelled"
        assert attrs_of(s)["error.type"] == "cancelled"
    assert ok.status.status_code is StatusCode.UNSET


async def test_tool_error_result_marks_its_span(tmp_path: Path) -> None:
    provider, exporter = recorder()

    @tool
    async def broken() -> str:
        """Always fails."""
        raise RuntimeError("disk on fire")

    script = ScriptedProvider([ScriptedProvider.tool_call("broken"), ScriptedProvider.tool_call("nope"), "done"])
    async with open_runtime(log_events=False, tracing=cmdc.otel.Tracing(tracer_provider=provider)) as rt:
        agent = await rt.spawn("a1", script, tools=[broken], config=config(tmp_path))
        assert (await agent.prompt("go")).text == "done"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    for name in ("execute_tool broken", "execute_tool nope"):
        assert attrs_of(spans[name])["error.type"] == "tool_error"
        assert spans[name].status.status_code is StatusCode.ERROR
    assert "gen_ai.tool.description" not in attrs_of(spans["execute_tool nope"])  # no such tool
    assert spans["invoke_agent a1"].status.status_code is StatusCode.UNSET


class Exploding(SpanProcessor):
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("processor down")

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("processor down")


async def test_a_broken_span_processor_breaks_nothing(tmp_path: Path) -> None:
    provider = TracerProvider()
    provider.add_span_processor(Exploding())
    await session(tmp_path, cmdc.otel.Tracing(tracer_provider=provider, include_content=True))


async def test_hostile_options() -> None:
    with pytest.raises(ConfigError, match="tracer_provider"):
        cmdc.otel.Tracing(tracer_provider="http://collector")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="include_content"):
        cmdc.otel.Tracing(include_content="yes")  # type: ignore[arg-type]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError, match="max_content_chars"):
            cmdc.otel.Tracing(max_content_chars=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="tracing"):
        async with open_runtime(tracing=object()):  # type: ignore[arg-type]
            pass


async def test_failed_summarizer_attempts_are_span_events(tmp_path: Path) -> None:
    """A summarizer that fails once, then answers: two attempt events on the compaction span;
    the failure's text only with include_content."""
    for content in (False, True):
        provider, exporter = recorder()
        calls = 0

        async def flaky(messages: Sequence[Message], instruction: str) -> str:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("SECRET-ERROR from the summarizer")
            return "the summary"

        tracing = cmdc.otel.Tracing(tracer_provider=provider, include_content=content)
        async with open_runtime(log_events=False, tracing=tracing) as rt:
            agent = await rt.spawn(
                "a1", ScriptedProvider(["one" + PADDING, "two" + PADDING]), config=config(tmp_path), summarizer=flaky
            )
            await agent.prompt("first")
            await agent.prompt("second")
            assert isinstance(await agent.compact(), cmdc.Compacted)
        (compact,) = [s for s in exporter.get_finished_spans() if s.name == "compact a1"]
        events = [dict(e.attributes or {}) for e in compact.events if e.name == "summarizer_attempt"]
        assert [e["cmdc.ok"] for e in events] == [False, True]
        assert ("SECRET-ERROR" in str(events[0].get("cmdc.error"))) is content
        assert attrs_of(compact)["cmdc.compaction.summarizer_attempts"] == 2


# -- cmdc demo --trace ----------------------------------------------------------------------------


def test_demo_trace_prints_one_agents_span_tree(capsys: pytest.CaptureFixture[str]) -> None:
    from cmdc.cli import main

    argv = ["demo", "--trace", "--agents", "2", "--turns", "12", "--window", "3000", "--latency", "0", "--plain"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    start = out.index("trace of agent-1: 12 turns, ")
    tree_lines = out[start:].split("\n\n", 1)[0].splitlines()[1:]
    assert sum(1 for ln in tree_lines if ln.startswith("invoke_agent agent-1  ")) == 12
    assert all(ln.startswith(("invoke_agent agent-1", "├─ ", "└─ ")) for ln in tree_lines)
    assert "agent-2" not in "\n".join(tree_lines)  # one agent's session
    assert any(ln.startswith("├─ chat simulated ") and "finish tool_calls" in ln for ln in tree_lines)
    assert any("execute_tool read_file" in ln and "call sim_" in ln for ln in tree_lines)
    compactions = [ln for ln in tree_lines if "compact agent-1" in ln]
    assert compactions and all(
        re.search(r"-> [\d,]+ tokens, \d+ evicted to journal #\d+-\d+", ln) for ln in compactions
    )
    assert re.search(r"\d+(\.\d+)? (ms|s)  ", tree_lines[0])  # durations
    assert out.index("trace of agent-1") < out.index("agent      turns")  # before the final table


def test_demo_trace_without_the_sdk(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from cmdc.cli import main

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if it were not installed
    assert main(["demo", "--trace", "--agents", "1", "--turns", "1"]) == 2
    assert "opentelemetry-sdk" in capsys.readouterr().err


def test_bench_otel_prints_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_otel", "--turns", "3", "--runs", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("cost per turn")
    labels = ("off (no tracing=)", "no-op provider", "SDK, in-memory exporter", "SDK + include_content")
    for label, line in zip(labels, lines[1:], strict=True):
        assert line.strip().startswith(label) and "µs" in line


def test_cmdc_otel_on_first_use_and_without_the_extra() -> None:
    """`cmdc.otel` works after a plain `import cmdc`; without opentelemetry it says which extra."""
    code = "import cmdc\nassert 'cmdc.otel' not in __import__('sys').modules\nprint(cmdc.otel.Tracing.__name__)\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "Tracing\n", out.stderr
    blocked = "import sys\nsys.modules['opentelemetry'] = None\nimport cmdc\ncmdc.otel\n"
    out = subprocess.run([sys.executable, "-c", blocked], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "pip install 'cmdc-agents[otel]'" in out.stderr
    with pytest.raises(AttributeError, match="no_such_thing"):
        cmdc.no_such_thing  # type: ignore[attr-defined]  # noqa: B018
