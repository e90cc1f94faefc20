"""An honest demo: `SimulatedModel` calls tools with arguments that work, reaches the named
agents `delegate` lists, overflows like a model; `cmdc demo` counts tool failures and fails
when most do, fits 80 columns, says when the model cannot be reached, leaves no journals behind."""

from __future__ import annotations

import io
import random
import re
from pathlib import Path
from typing import Any

import pytest
import trio

import cmdc
import cmdc.cli._demo
from cmdc import Message, OffloadStore
from cmdc.cli import main
from cmdc.cli._demo import AgentStats, DemoOptions, Retention, final_table, run_demo
from cmdc.providers import ModelRequest, SimulatedModel, ToolSchema
from cmdc.providers._arguments import arguments_for
from cmdc.recall import recall_tool
from cmdc.tools import ToolArgumentsError, validate_arguments

RICH = ToolSchema(
    "deploy",
    "Deploy a service.",
    {
        "type": "object",
        "properties": {
            "service": {"type": "string", "minLength": 3, "maxLength": 12},
            "env": {"enum": ["staging", "production", "canary"]},
            "replicas": {"type": "integer", "minimum": 2, "maximum": 6, "multipleOf": 2},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "when": {"type": "string", "format": "date-time"},
            "owner": {"type": "string", "format": "email"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3, "uniqueItems": True},
            "dry_run": {"type": "boolean", "default": True},
            "note": {"type": ["string", "null"]},
            "limits": {
                "type": "object",
                "properties": {
                    "cpu": {"type": "integer", "minimum": 1, "maximum": 8},
                    "memory": {"anyOf": [{"type": "null"}, {"type": "string", "enum": ["1G", "2G"]}]},
                },
                "required": ["cpu"],
                "additionalProperties": False,
            },
            "kind": {"const": "web"},
        },
        "required": ["service", "env"],
        "additionalProperties": False,
    },
)


def test_arguments_fit_every_kind_of_schema_and_use_optional_parameters() -> None:
    seen: dict[str, set[Any]] = {}
    conversation = [Message.user("Deploy the billing service to staging please")]
    for seed in range(300):
        args = arguments_for(RICH, conversation, random.Random(seed))
        assert validate_arguments(RICH.parameters, args) == args, args
        for key, value in args.items():
            seen.setdefault(key, set()).add(repr(value))
    assert set(seen) == set(RICH.parameters["properties"])  # every parameter, optional ones too
    assert seen["env"] == {"'staging'", "'production'", "'canary'"}  # every choice of the enum
    assert seen["replicas"] == {"2", "4", "6"}
    assert len(seen["limits"]) > 1


def test_string_arguments_come_from_the_conversation() -> None:
    read = ToolSchema(
        "read_file",
        "Read a file.",
        {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    )
    search = ToolSchema(
        "search",
        "Search.",
        {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    )
    conversation = [
        Message.user("Look at docs/intro.md first"),
        Message.assistant("ok"),
        Message.user("Now fix src/billing/invoice.py: totals are off"),
    ]
    for seed in range(20):
        rng = random.Random(seed)
        assert arguments_for(read, conversation, rng) == {"path": "src/billing/invoice.py"}
        words = arguments_for(search, conversation, rng)["query"].split()
        assert words and all(w in "Now fix src/billing/invoice.py: totals are off" for w in words)


async def test_recall_calls_are_valid_and_read_what_the_summary_names(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    await store.append("a1", [Message.user(f"old message {i} about invoices") for i in range(12)])
    tool = recall_tool(store, "a1")
    summary = Message.user(
        "[Conversation summary #1] 12 earlier messages were moved out of the context into the journal "
        f"{tmp_path}/a1.jsonl (records 1-12). ...",
        metadata={"cmdc.kind": "summary"},
    )
    conversation = [summary, Message.user("what did we say about invoices?")]
    forms = set()
    for seed in range(40):
        args = arguments_for(tool.schema, conversation, random.Random(seed))
        forms.add(tuple(sorted(args)))
        result = await tool.run(args)  # raises ToolArgumentsError on arguments recall refuses
        assert "records" in result.lower() or "match" in result.lower()
        if "first" in args:
            assert 1 <= args["first"] <= args["last"] <= 12
    assert forms == {("query",), ("first", "last")}
    with pytest.raises(ToolArgumentsError):
        await tool.run({"query": "x", "first": 1})  # what a naive filler of every parameter would do


async def test_delegation_reaches_the_named_agents_delegate_lists(tmp_path: Path) -> None:
    async with cmdc.open_runtime(log_events=False) as rt:
        critic = await rt.spawn(  # its journal in tmp_path too, not .cmdc/ in the working directory
            "critic", SimulatedModel(tool_probability=0.0), accepts="a1", config={"compact_offload_dir": str(tmp_path)}
        )
        writer = await rt.spawn(
            "a1",
            SimulatedModel(tool_probability=1.0, max_tool_rounds=1, seed=5),
            delegation=["critic"],
            config={"compact_offload_dir": str(tmp_path)},
        )
        schema = next(t for t in rt._slots["a1"].tools if t.name == "delegate").parameters
        assert list(schema["properties"]["agent"]["enum"]) == ["critic", None]
        assert "You may delegate to: critic." in schema["properties"]["agent"]["description"]
        for turn in range(5):
            await writer.prompt(f"step {turn}: review the plan")
        state = await writer.state()
        calls = [c for m in state.messages for c in m.tool_calls]
        assert calls and all(c.name == "delegate" and c.to_dict()["arguments"]["agent"] == "critic" for c in calls)
        results = [m for m in state.messages if m.role == "tool"]
        assert results and not any(m.is_error for m in results)
        assert len((await critic.state()).messages) >= 2 * len(calls)  # the critic did answer


async def test_a_pattern_grant_is_described_not_enumerated(tmp_path: Path) -> None:
    async with cmdc.open_runtime(log_events=False) as rt:
        await rt.spawn("a1", SimulatedModel(), delegation=["worker-*"], config={"compact_offload_dir": str(tmp_path)})
        agent = next(t for t in rt._slots["a1"].tools if t.name == "delegate").parameters["properties"]["agent"]
        assert "enum" not in agent and "You may delegate to: worker-*." in agent["description"]


@pytest.mark.parametrize(("window", "budget"), [(None, 2_000), (4_000, 250), (1_000, 200), (1_000_000, 2_000)])
async def test_recall_answers_fit_the_window(window: int | None, budget: int, tmp_path: Path) -> None:
    from cmdc.runtime.runtime import recall_budget

    assert recall_budget(window) == budget
    async with cmdc.open_runtime(log_events=False) as rt:
        config: dict[str, Any] = {"compact_offload_dir": str(tmp_path)}
        if window is not None:
            config["context_window"] = window
        await rt.spawn("a1", SimulatedModel(context_window=8_000), recall=True, config=config)
        recall = next(t for t in rt._slots["a1"].tools if t.name == "recall")
        await OffloadStore(tmp_path).append("a1", [Message.user("invoice " * 5_000)])
        answer = await recall.run({"query": "invoice"})
        assert len(answer.encode()) <= 4 * (budget if window is not None else recall_budget(8_000))


async def test_the_model_overflows_past_its_window() -> None:
    model = SimulatedModel(context_window=500)
    with pytest.raises(cmdc.ContextOverflow) as info:
        await model.complete(ModelRequest([Message.user("word " * 600)]))
    assert info.value.limit == 500 and (info.value.prompt_tokens or 0) > 500
    with pytest.raises(cmdc.ContextOverflow):  # fits alone, not with the reply's room
        await model.complete(ModelRequest([Message.user("word " * 300)], max_output_tokens=300))


# -- the demo -----------------------------------------------------------------------------------


def test_the_final_table_fits_80_columns() -> None:
    options = DemoOptions()
    stats = []
    for i in range(options.agents):
        s = AgentStats(f"agent-{i + 1}", turns=options.turns, tool_calls=999, tool_failed=1, journal_bytes=999_999)
        s.retention = Retention(task=True, users=(120, 120), pins=(2, 2), users_sent=200)
        stats.append(s)
    lines = final_table(stats, options)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)


def test_demo_fails_when_most_tool_calls_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = cmdc.cli._demo.make_tools

    def broken(window: int) -> list[cmdc.Tool]:
        async def read_file(path: str) -> str:
            """Read a file."""
            raise FileNotFoundError(path)

        async def run_tests(target: str) -> str:
            """Run tests."""
            raise RuntimeError("no test runner")

        assert real(window)  # the real ones exist; these replace them
        return [cmdc.tool(read_file), cmdc.tool(run_tests)]

    monkeypatch.setattr(cmdc.cli._demo, "make_tools", broken)
    code = main(["demo", "--agents", "1", "--turns", "8", "--latency", "0", "--offload-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert re.search(r"^\d+ of \d+ tool calls failed; one: agent-1: tool '(read_file|run_tests)' failed", out, re.M)
    assert "most tool calls failed" in out


async def test_unreachable_endpoint_is_reported_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    httpx = pytest.importorskip("httpx")
    from cmdc.providers import OpenAIProvider

    def refuse(request: Any) -> Any:
        raise httpx.ConnectError("connection refused", request=request)

    monkeypatch.setattr(
        cmdc.cli._demo,
        "real_provider",
        lambda kind, model: OpenAIProvider(
            model or "m", api_key="k", max_retries=0, client=httpx.AsyncClient(transport=httpx.MockTransport(refuse))
        ),
    )
    out = io.StringIO()
    options = DemoOptions(agents=2, turns=3, latency=0.0, provider="openai", model="m", display="plain")
    code, _ = await run_demo(options, out=out, progress=io.StringIO())
    text = out.getvalue()
    assert code == 1
    assert "no turn was answered: the model could not be used" in text
    assert "ConnectionFailed" in text
    assert "retention check failed" not in text
    assert "retention not checked for 2 agent(s)" in text


async def test_demo_journals_are_removed_unless_a_directory_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    options = DemoOptions(agents=1, turns=4, latency=0.0, display="plain")
    out = io.StringIO()
    code, _ = await run_demo(options, out=out, progress=io.StringIO())
    assert code == 0, out.getvalue()
    assert not any(tmp_path.iterdir())  # noqa: ASYNC240 - the temporary journals are gone
    assert "journals removed (keep them with --offload-dir DIR)" in out.getvalue()
    kept = tmp_path / "kept"
    code, _ = await run_demo(
        DemoOptions(agents=1, turns=12, window=3_000, latency=0.0, display="plain", offload_dir=kept),
        out=io.StringIO(),
        progress=io.StringIO(),
    )
    assert code == 0 and (kept / "agent-1.jsonl").exists()  # compacted, journaled, kept


def test_demo_journals_are_removed_after_an_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)

    async def interrupted() -> None:
        with trio.move_on_after(0.3):
            await run_demo(DemoOptions(agents=2, turns=200, display="plain"), io.StringIO(), io.StringIO())

    trio.run(interrupted)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["closing a provider", "removing the journals"])
def test_demo_journals_are_removed_after_a_second_interrupt(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C twice: the second one lands while the first unwinds. Before, it could skip the
    removal, and the temporary directory stayed with every journal in it."""
    import shutil
    import signal
    import tempfile

    import cmdc.cli._demo as demo

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    async def first_interrupt(*args: object) -> None:
        raise KeyboardInterrupt  # the first Ctrl-C, in the middle of the turns

    class Closing(SimulatedModel):
        async def aclose(self) -> None:
            raise KeyboardInterrupt  # the second Ctrl-C, while the provider closes

    remove = shutil.rmtree

    def interrupted_rmtree(path: Path, ignore_errors: bool = False) -> None:
        signal.raise_signal(signal.SIGINT)  # the second Ctrl-C, a real signal, during the removal
        remove(path, ignore_errors)

    monkeypatch.setattr(demo, "_run", first_interrupt)
    if where == "closing a provider":
        monkeypatch.setattr(demo, "make_provider", lambda options, index: Closing())
    else:
        monkeypatch.setattr(demo.shutil, "rmtree", interrupted_rmtree)
    with pytest.raises(KeyboardInterrupt):
        trio.run(run_demo, DemoOptions(agents=1, display="plain"), io.StringIO(), io.StringIO())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("when", ["starting", "journaling"])
def test_a_sigterm_ends_the_demo_as_a_ctrl_c_does(tmp_path: Path, when: str) -> None:
    """`timeout cmdc demo` (a SIGTERM): the demo stops, removes its temporary journals, says so and
    exits 143; SIGTERM's default ended the process at once and left them in the temp directory,
    and so it still did while the agents started (the directory made, no turn yet)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = [sys.executable, "-m", "cmdc", "demo", "--agents", "2", "--turns", "100000", "--plain"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        pattern = "cmdc-demo-*" if when == "starting" else "cmdc-demo-*/*.jsonl"
        while not any(tmp_path.glob(pattern)) and time.monotonic() < deadline:
            time.sleep(0.01 if when == "starting" else 0.05)  # its directory made / journaled to
        assert any(tmp_path.glob(pattern)), f"no {pattern}"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert err.rstrip().endswith("terminated") and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
