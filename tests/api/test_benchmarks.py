"""The benchmark suite runs and prints its table (tiny sizes; no timing assertions), and the
DeepAgents comparison converts conversations faithfully (skipped without deepagents)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._table import Row, render
from cmdc import ImagePart, Message, TextPart, TokenUsage, ToolCall
from cmdc.testing import conversation

ROOT = Path(__file__).resolve().parents[2]


def test_python_m_benchmarks_prints_one_table() -> None:
    # --smoke: every benchmark at tiny sizes (a few seconds); the DeepAgents part runs only
    # when deepagents is installed, else the table says how to install it.
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("cmdc benchmarks (smoke;")
    header = text.splitlines()[1]
    assert header.split() == ["benchmark", "figure", "value", "target", "result"]
    for figure in (
        "should_compact, 1,000 msgs",
        "offload #5 / #1",
        "RSS per idle agent",
        "probes in context, worst of",
        "agents page, 50 live agents, server time",
    ):
        assert figure in text
    assert "ERROR" not in text
    assert "targets met" in text or "MISSED" in text
    assert "Ray cluster benchmark: skipped in --smoke" in text
    try:
        import deepagents  # noqa: F401
    except ImportError:
        assert "pip install -e '.[compare]'" in text
    else:
        assert "vs DeepAgents" in text and "per-turn check, 1,000 msgs" in text


def test_the_ray_benchmark_says_why_it_does_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    import benchmarks.__main__ as main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert main.ray_skipped(main.QUICK) == (
        "Ray cluster benchmark: skipped, ray is not installed; to run it: pip install -e '.[ray,postgres]'"
    )
    monkeypatch.setattr(importlib.util, "find_spec", real)
    monkeypatch.delenv("CMDC_BENCH_POSTGRES_URL", raising=False)
    monkeypatch.delenv("CMDC_TEST_POSTGRES_URL", raising=False)
    if real("ray") is not None:
        assert "no PostgreSQL server" in (main.ray_skipped(main.QUICK) or "")
    # with ray and a server, `python -m benchmarks` runs bench_ray (too long for the suite)
    monkeypatch.setenv("CMDC_TEST_POSTGRES_URL", "postgresql://x@/y")
    assert (main.ray_skipped(main.FULL) is None) == (real("ray") is not None)


def test_the_store_benchmark_prints_its_virtual_agents_as_a_table(tmp_path: Path) -> None:
    """`python -m benchmarks.bench_store` prints a table (one row per store for the virtual
    agents: agents, resident bound, wall, ms per agent, peak RSS, activation p50/p99), and
    `--json` the figures themselves (tiny sizes; no timing assertions)."""
    from benchmarks import bench_store

    args = ["--records", "50", "--queries", "3", "--file-queries", "1", "--compaction", "1000"]
    args += ["--compaction-reps", "1", "--agents", "30", "--resident", "5", "--concurrency", "4"]
    cmd = [sys.executable, "-m", "benchmarks.bench_store", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CMDC_TEST_POSTGRES", "CMDC_BENCH_POSTGRES"))}
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("store "))
    assert lines[head].split("  ")[:3] == ["store", "agents", "resident ≤"]
    assert "activation p99" in lines[head] and "peak RSS" in lines[head]
    row = lines[head + 2].split()
    assert row[:3] == ["file", "30", "5"] and "MiB" in row
    assert "PostgreSQL: skipped" in out.stdout
    out = subprocess.run([*cmd, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    figures = json.loads(out.stdout)
    virtual = figures["virtual_file"]
    assert (virtual["agents"], virtual["resident_bound"]) == (30, 5) and virtual["resident_after"] <= 5
    assert virtual["deactivations"] >= 25 and len(virtual["load_after"]) == 3
    assert bench_store.virtual_row("file", virtual)[:3] == ("file", "30", "5")


def test_render_lists_misses() -> None:
    rows = [
        Row("a", "fast thing", "1 µs", "< 20 µs", True),
        Row("a", "slow thing", "40 ms", "< 30 ms", False),
        Row("b", "no target", "7"),
    ]
    text = render(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["benchmark", "figure", "value", "target", "result"]
    assert any(line.split()[-1] == "pass" and "fast thing" in line for line in lines)
    assert any(line.split()[-1] == "MISS" and "slow thing" in line for line in lines)
    assert "MISSED 1 of 2 targets:" in text
    assert "slow thing = 40 ms (target < 30 ms)" in text
    assert "all 1 targets met" in render(rows[:1])


def test_conversion_to_langchain() -> None:
    pytest.importorskip("deepagents")
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    from benchmarks import compare_deepagents as cd

    calls = (
        ToolCall(id="c1", name="read_file", arguments={"path": "a.py"}),
        ToolCall(id="c2", name="search", arguments={"query": "x", "n": 3}),
    )
    messages = [
        Message.system("be careful"),
        Message.user("do it"),
        Message.assistant("looking", tool_calls=calls, usage=TokenUsage(input_tokens=10, output_tokens=5)),
        Message.tool_result("c2", "found", is_error=False),
        Message.tool_result("c1", "no such file", is_error=True),
        Message.user((TextPart("see"), ImagePart("https://example.invalid/a.png", "image/png"))),
        Message.assistant("done"),
    ]
    lc = cd.to_langchain(messages, provider="fake")
    assert [type(m) for m in lc] == [
        SystemMessage,
        HumanMessage,
        AIMessage,
        ToolMessage,
        ToolMessage,
        HumanMessage,
        AIMessage,
    ]
    assert [m.id for m in lc] == [m.id for m in messages]
    assert lc[0].content == "be careful" and lc[1].content == "do it"
    ai = lc[2]
    assert isinstance(ai, AIMessage)
    assert [(c["id"], c["name"], c["args"]) for c in ai.tool_calls] == [
        ("c1", "read_file", {"path": "a.py"}),
        ("c2", "search", {"query": "x", "n": 3}),
    ]
    assert ai.usage_metadata is not None
    assert (ai.usage_metadata["input_tokens"], ai.usage_metadata["total_tokens"]) == (10, 15)
    assert ai.response_metadata["model_provider"] == "fake"
    results = [m for m in lc if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.content, m.status) for m in results] == [
        ("c2", "found", "success"),
        ("c1", "no such file", "error"),
    ]
    assert lc[5].content == [
        {"type": "text", "text": "see"},
        {"type": "image", "url": "https://example.invalid/a.png", "mime_type": "image/png"},
    ]
    last = lc[6]
    assert isinstance(last, AIMessage) and last.content == "done" and not last.tool_calls
    assert last.usage_metadata is None

    # A request as an agent makes it: the system prompt apart from the state's messages.
    model = cd.fake_model()
    request = cd.request_for(model, lc)
    assert request.system_message is lc[0]
    assert request.messages == lc[1:]


def test_deepagents_sees_the_same_conversation() -> None:
    pytest.importorskip("deepagents")
    from benchmarks import compare_deepagents as cd

    messages = conversation(300, seed=3)
    model = cd.fake_model()
    lc = cd.to_langchain(messages, provider=cd.provider_of(model))
    assert len(lc) == len(messages)
    # every call's results follow it, as in cmdc's conversation
    calls = {c["id"] for m in lc for c in getattr(m, "tool_calls", [])}
    from langchain_core.messages import ToolMessage

    results = {m.tool_call_id for m in lc if isinstance(m, ToolMessage)}
    assert calls == results == {c.id for m in messages for c in m.tool_calls}


def test_without_deepagents_the_table_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import __main__ as suite

    def broken(_preset: suite.Preset) -> list[Row]:
        raise RuntimeError("boom")

    monkeypatch.setattr(suite, "compaction_rows", lambda _p: [Row("compaction", "x", "1")])
    monkeypatch.setattr(suite, "runtime_rows", broken)
    monkeypatch.setattr(suite, "retention_rows", lambda _p: [Row("retention", "y", "2", "all ✓", True)])
    monkeypatch.setattr(suite, "isolation_rows", lambda _p: [Row("isolation", "z", "3")])
    monkeypatch.setattr(suite, "store_rows", lambda _p: [Row("store", "s", "4")])
    monkeypatch.setattr(suite, "deepagents_available", lambda: False)
    rows, notes = suite.collect(suite.SMOKE)
    names = list(dict.fromkeys(r.benchmark for r in rows))
    assert names[:5] == ["compaction", "runtime", "retention", "isolation", "store"] and "search" in names
    assert rows[1].ok is False and "RuntimeError: boom" in rows[1].value
    assert any("pip install -e '.[compare]'" in n for n in notes)


def test_recall_stall_prints_its_figures() -> None:
    from benchmarks import recall_stall

    lines: list[str] = []
    f = recall_stall.run(200, 1, out=lines.append)
    assert f["answered"] and f["pings"] > 0
    assert any(line.startswith("longest scheduling stall while an agent recalls:") for line in lines)


def test_the_context_economy_benchmark_prints_its_policies(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import context_economy

    context_economy.main(["--turns", "3", "--seeds", "1"])
    out = capsys.readouterr().out
    for policy in context_economy.POLICIES:
        assert f"context_economy: {policy}" in out
    assert "prefix breaks" in out and "summarizer calls" in out and "retention" in out


def test_the_floor_row_compares_a_compaction_with_a_bare_write_of_its_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import trio

    from benchmarks import bench_compaction

    row = trio.run(bench_compaction.floor_row, 300, tmp_path, 3, False)
    assert row["messages"] == 300 and row["cache"] == "warm"
    assert int(row["bytes"]) > 300 * 100  # the journal's bytes: the batch and its lines
    assert float(row["ratio"]) == float(row["cmdc_wall"]) / float(row["bare_wall"])
    assert list(tmp_path.iterdir()) == []  # each journal and bare file removed after its rep
    trio.run(bench_compaction.floor_table, (300,), 1, False)
    out = capsys.readouterr().out
    assert "bare write+fsync of the journal's bytes vs one force_compact" in out
    cells = out.splitlines()[-1].split()
    assert cells[0] == "300" and cells[2] == "warm" and cells[-3] != "nan"
