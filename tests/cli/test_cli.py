"""The `cmdc` command, run in-process with real files: demo, compact, history, bad input."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from cmdc import JournalRecord, OffloadStore
from cmdc.cli import main
from cmdc.cli._demo import AgentStats, DemoOptions, LiveTable, Retention, live_lines, run_demo

HISTORY = Path(".cmdc") / "conversation_history"


# -- conversation files ------------------------------------------------------------------------


def conversation(rounds: int = 10) -> list[dict[str, Any]]:
    """An OpenAI-style conversation: system, the task, then rounds of tool calls and results."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "TASK: migrate billing to the invoice API v2 (ticket PAY-4821)."},
    ]
    for i in range(rounds):
        read = {"name": "read_file", "arguments": json.dumps({"path": f"src/mod{i}.py"})}
        test = {"name": "run_tests", "arguments": json.dumps({"target": f"tests/test_mod{i}.py"})}
        calls = [
            {"id": f"call_{i}_a", "type": "function", "function": read},
            {"id": f"call_{i}_b", "type": "function", "function": test},
        ]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}_b", "content": f"41 passed, 1 failed in mod{i}"})
        messages.append(
            {"role": "tool", "tool_call_id": f"call_{i}_a", "content": f"def handler_{i}():\n    pass\n" * 15}
        )
        messages.append({"role": "assistant", "content": f"Updated src/mod{i}.py; one test still fails."})
        user: dict[str, Any] = {
            "role": "user",
            "content": [{"type": "text", "text": f"Now fix round {i} (keyword zebra{i})."}],
        }
        if i == 3:
            user["content"].append(
                {"type": "image_url", "image_url": {"url": "https://example.com/screen.png", "detail": "low"}}
            )
            user["name"] = "dana"
        messages.append(user)
    return messages


def write_jsonl(path: Path, messages: list[Any]) -> Path:
    path.write_text("".join(json.dumps(m) + "\n" for m in messages))
    return path


def write_json(path: Path, messages: list[Any]) -> Path:
    path.write_text(json.dumps(messages, indent=2))
    return path


def read_output(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".json":
        data: list[dict[str, Any]] = json.loads(path.read_text())
        return data
    return [json.loads(line) for line in path.read_text().splitlines()]


def records(directory: Path, agent: str) -> list[JournalRecord]:
    """The journal's records (read in a trio run of their own: `main` runs its own)."""
    return trio.run(OffloadStore(directory).records, agent)


def files_under(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


# -- demo --------------------------------------------------------------------------------------


def _total_row(out: str) -> list[str]:
    row = next(line for line in out.splitlines() if line.startswith("total"))
    return row.split()


def test_demo_end_to_end_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--agents", "2", "--turns", "20", "--window", "3000", "--latency", "0"]
    code = main([*argv, "--offload-dir", str(tmp_path / "journals")])
    out, err = capsys.readouterr()
    assert code == 0, out
    assert "agent-1" in out and "agent-2" in out
    # total  24/24  comp  forced  before→after  journal  tools  ✓  ✓ n/n  ✓ n/n
    total = _total_row(out)
    assert total[1] == "40/40"
    compactions, forced = int(total[2]), int(total[3])
    assert compactions > 0 and forced > 0
    assert compactions > forced  # automatic ones too
    assert "(automatic)" in err and "(forced after an overflow)" in err  # progress: plain lines on stderr
    assert "(automatic)" not in out
    assert total[7] == "100%"  # every tool call worked (after "NN KB")
    assert re.search(r"^\d+ tool calls, all worked$", out, re.M)
    header = re.search(r"^agent +turns +comp +forced", out, re.M)
    assert header is not None
    table = out[header.start() :]
    assert "✗" not in table
    assert table.count("✓") == 3 * 3  # task, user messages, pins; two agents and the total
    journals = sorted(p.name for p in (tmp_path / "journals").glob("*.jsonl"))
    assert journals == ["agent-1.jsonl", "agent-2.jsonl"]


def test_demo_turn_lines_every_ten_turns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--agents", "1", "--turns", "10", "--latency", "0", "--offload-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, out
    assert "agent-1: turn 10/10:" in err


async def test_demo_live_display_redraws_in_place(tmp_path: Path) -> None:
    buf = io.StringIO()
    options = DemoOptions(agents=1, turns=6, window=3_000, latency=0.0, display="live", offload_dir=tmp_path)
    code, stats = await run_demo(options, out=io.StringIO(), progress=buf)
    text = buf.getvalue()
    assert code == 0, text
    assert "\x1b[2K" in text and re.search(r"\x1b\[\d+A", text)  # clear-line, cursor-up
    assert text.count("\x1b[?25l") == 1 and text.endswith("\n\x1b[?25h")  # the cursor shown again
    assert stats[0].turns == 6
    assert "agent-1: compaction #" not in text.split("\x1b[?25h")[0].replace("  agent-1: compaction #", "")


def test_live_table_redraw() -> None:
    buf = io.StringIO()
    table = LiveTable(buf, width=60)
    options = DemoOptions(agents=2, turns=10)
    stats = [AgentStats("agent-1", turns=3, tokens=2_000), AgentStats("agent-2", turns=5, tokens=5_900)]
    lines = live_lines(stats, options, ["agent-1: compaction #1 (automatic): " + "x" * 100])
    table.draw(lines)
    first = buf.getvalue()
    assert first.startswith("\x1b[?25l") and "\x1b[A" not in first
    visible = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", line) for line in first.split("\n")]
    assert all(len(line) < 60 for line in visible)  # clipped: no line wraps
    table.draw(lines[:-1])  # a shorter block: the leftover line is cleared
    second = buf.getvalue()[len(first) :]
    assert second.startswith(f"\x1b[{len(lines)}A")
    assert second.count("\x1b[2K") == len(lines)
    table.close()
    assert buf.getvalue().endswith("\x1b[?25h")
    assert "3/10" in lines[1] and "5/10" in lines[2] and "8/20" in lines[3]


def test_demo_real_provider_without_key(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    assert main(["demo", "--provider", "openai", "--model", "gpt-4.1-mini"]) == 2
    assert "OPENAI_API_KEY" in capsys.readouterr().err
    assert main(["demo", "--provider", "anthropic", "--model", "claude-sonnet-4-5"]) == 2
    assert "ANTHROPIC_API_KEY" in capsys.readouterr().err
    assert main(["demo", "--provider", "anthropic"]) == 2
    assert "--model" in capsys.readouterr().err


def test_demo_real_provider_without_http_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import cmdc.providers

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.delattr(cmdc.providers, "OpenAIProvider", raising=False)  # not cached yet
    monkeypatch.setitem(sys.modules, "cmdc.providers.openai", None)  # as if httpx were missing
    assert main(["demo", "--provider", "openai", "--model", "m"]) == 2
    assert "cmdc-agents[http]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--agents", "0"],
        ["demo", "--window", "500"],
        ["demo", "--model", "x"],
        ["demo", "--provider", "nope"],
        ["compact"],
        ["history", "dir"],
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "demo" in err and "compact" in err and "history" in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "compact" in capsys.readouterr().out


def test_python_dash_m_cmdc() -> None:
    done = subprocess.run([sys.executable, "-m", "cmdc", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "history" in done.stdout
    done = subprocess.run([sys.executable, "-m", "cmdc"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage" in done.stderr


# -- compact -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_compact_file(fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    original = conversation()
    writer = write_jsonl if fmt == "jsonl" else write_json
    path = writer(tmp_path / f"chat.{fmt}", original)
    assert main(["compact", str(path), "--keep", "6"]) == 0
    out = capsys.readouterr().out
    compacted = tmp_path / f"chat.compacted.{fmt}"
    assert f"-> {compacted}" in out and "evicted:" in out and "records 1-" in out
    result = read_output(compacted)
    assert len(result) < len(original)
    assert result[0] == original[0]  # the system message, as it was
    assert result[1] == original[1]  # the task, pinned, in its place: before the summary
    summary = result[2]
    assert summary["role"] == "user" and summary["content"].startswith("[Conversation summary #1]")
    assert set(summary) == {"role", "content"}  # nothing an OpenAI-style consumer would refuse
    assert result[-6:] == original[-6:]  # the kept tail, exactly as it was
    # every tool result still follows its call
    calls: set[str] = set()
    for m in result:
        calls.update(c["id"] for c in m.get("tool_calls", ()))
        if m["role"] == "tool":
            assert m["tool_call_id"] in calls
    # the journal holds the evicted messages, in order
    journal_dir = tmp_path / HISTORY
    evicted = [r.message for r in records(journal_dir, "chat")]
    kept = len(result) - 1  # all but the summary came from the file
    assert len(evicted) == len(original) - kept
    assert [m.role for m in evicted] == [m["role"] for m in original[2 : 2 + len(evicted)]]
    assert evicted[0].tool_calls[0].arguments == {"path": "src/mod0.py"}
    image_user = next(m for m in evicted if m.role == "user" and "round 3" in m.text)
    assert image_user.metadata["openai.message"]["name"] == "dana"  # nothing lost in the journal
    assert str(journal_dir / "chat.jsonl") in summary["content"]  # the summary names the journal
    # the preserved user messages are quoted in the summary
    assert "Now fix round 0 (keyword zebra0)." in summary["content"]


def test_compact_options_and_recompaction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "My Chat!.jsonl", conversation())
    out = tmp_path / "small.jsonl"
    journals = tmp_path / "journals"
    argv = ["compact", str(path), "--out", str(out), "--offload-dir", str(journals), "--keep", "4"]
    assert main([*argv, "--annotate", "--instruction", "focus on the tests"]) == 0
    capsys.readouterr()
    first = read_output(out)
    assert first[2]["cmdc"]["kind"] == "summary" and first[2]["cmdc"]["compaction"] == 1
    assert (journals / "My_Chat.jsonl").exists()  # the file's stem, made a safe agent id
    # compact the compacted file again: the old summary is folded in, not quoted as a user message
    more = first + conversation(3)[2:]
    again = write_json(tmp_path / "again.json", more)
    assert main(["compact", str(again), "--agent", "My_Chat", "--offload-dir", str(journals), "--keep", "4"]) == 0
    assert "compaction #2" in capsys.readouterr().out
    second = read_output(tmp_path / "again.compacted.json")
    summaries = [m for m in second if str(m["content"]).startswith("[Conversation summary")]
    assert len(summaries) == 1 and summaries[0]["content"].startswith("[Conversation summary #2]")
    journal = records(journals, "My_Chat")
    assert [r.seq for r in journal] == list(range(1, len(journal) + 1))
    assert any(r.message.is_summary for r in journal)  # the first summary, journaled


def test_compact_nothing_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "short.jsonl", conversation(0))
    before = files_under(tmp_path)
    assert main(["compact", str(path)]) == 0
    assert "nothing to compact" in capsys.readouterr().out
    assert files_under(tmp_path) == before


def test_compact_model_summarizer_needs_model_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    path = write_jsonl(tmp_path / "chat.jsonl", conversation())
    before = files_under(tmp_path)
    assert main(["compact", str(path), "--summarizer", "anthropic"]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["compact", str(path), "--summarizer", "anthropic", "--model", "claude-x"]) == 2
    assert "ANTHROPIC_API_KEY" in capsys.readouterr().err
    assert main(["compact", str(path), "--model", "claude-x"]) == 2  # --model without a model summarizer
    assert files_under(tmp_path) == before


# -- bad input: an error naming the file, the line or element, the problem; nothing written ------

TASK = {"role": "user", "content": "do it"}


def call(arguments: str = "{}", call_id: str = "c1") -> dict[str, Any]:
    function = {"name": "f", "arguments": arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def result(call_id: str, text: str = "x") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


CALL = call()

# (case, the messages (a str is written as it is), the index of the bad one, the problem)
BAD: list[tuple[str, list[Any], int, str]] = [
    ("not json", [TASK, '{"role": "user", "content": "hi"'], 1, "not valid JSON"),
    ("not an object", [TASK, [1, 2]], 1, "must be a JSON object, got an array"),
    ("a string", [TASK, '"hello"'], 1, "must be a JSON object, got a string"),
    ("unknown role", [TASK, {"role": "bot", "content": "hi"}], 1, "unknown role 'bot'"),
    ("no role", [TASK, {"content": "hi"}], 1, 'no "role"'),
    ("orphan tool result", [TASK, CALL, result("c9")], 2, "'c9' matches no tool call"),
    ("result twice", [TASK, CALL, result("c1"), result("c1", "y")], 3, "already has a result"),
    ("result before call", [TASK, result("c1"), CALL], 1, "matches no tool call"),
    ("bad arguments", [TASK, call("{oops")], 1, "arguments is not valid JSON"),
    ("arguments not an object", [TASK, call("[1]")], 1, "must encode a JSON object"),
    ("user without content", [TASK, {"role": "user"}], 1, 'needs "content"'),
    ("assistant without anything", [TASK, {"role": "assistant", "content": None}], 1, '"content" or "tool_calls"'),
    ("tool without call id", [TASK, CALL, {"role": "tool", "content": "x"}], 2, '"tool_call_id"'),
    ("content of a wrong type", [TASK, {"role": "user", "content": 42}], 1, "got a number"),
    ("unknown part", [TASK, {"role": "user", "content": [{"type": "audio"}]}], 1, "unsupported part type 'audio'"),
    ("duplicate call id", [TASK, CALL, result("c1"), CALL], 3, "already used"),
]


def _write_bad(path: Path, items: list[Any], fmt: str) -> None:
    if fmt == "jsonl":
        path.write_text("".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items))
    else:  # a JSON array: raw strings are only used for JSONL-level damage
        elements = [item if isinstance(item, str) else json.dumps(item) for item in items]
        path.write_text("[\n" + ",\n".join(elements) + "\n]\n")


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
@pytest.mark.parametrize(("case", "items", "bad", "problem"), BAD, ids=[c[0] for c in BAD])
def test_bad_input(
    case: str, items: list[Any], bad: int, problem: str, fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if fmt == "json" and case == "not json":
        problem = "not valid JSON"  # the whole array fails to parse: where, by line and column
    path = tmp_path / f"bad.{fmt}"
    _write_bad(path, items, fmt)
    before = files_under(tmp_path)
    assert main(["compact", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err
    assert problem in err
    if fmt == "jsonl":
        assert f"{path}:{bad + 1}:" in err  # 1-based line number
    elif case != "not json":
        assert f"element [{bad}]" in err  # 0-based index in the array
    else:
        assert re.search(r"at line \d+ column \d+", err)
    assert files_under(tmp_path) == before  # no output file, no journal directory


def test_jsonl_line_numbers_count_blank_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gaps.jsonl"
    path.write_text(json.dumps(TASK) + "\n\n\n" + '{"role": "wizard", "content": "x"}\n')
    assert main(["compact", str(path)]) == 2
    assert f"{path}:4: unknown role 'wizard'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"messages": []}', "holds no messages"),
        ("[]", "holds no messages"),
        ("", "holds no messages"),
    ],
)
def test_bad_file_shape(content: str, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "shape.json"
    path.write_text(content)
    assert main(["compact", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and problem in err
    assert files_under(tmp_path) == {Path("shape.json")}


def test_compact_missing_file_and_hostile_agent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.jsonl"
    assert main(["compact", str(missing)]) == 2
    assert f"{missing}: no such file" in capsys.readouterr().err
    path = write_jsonl(tmp_path / "chat.jsonl", conversation())
    for agent in ("../x", ".hidden", "a/b", ""):
        assert main(["compact", str(path), "--agent", agent]) == 2
        assert "agent id" in capsys.readouterr().err
    assert main(["compact", str(path), "--out", str(tmp_path / "no" / "such" / "dir.jsonl")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert files_under(tmp_path) == {Path("chat.jsonl")}


# -- history -----------------------------------------------------------------------------------


@pytest.fixture
def journal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = write_jsonl(tmp_path / "chat.jsonl", conversation())
    assert main(["compact", str(path)]) == 0
    capsys.readouterr()
    return tmp_path / HISTORY


def test_history_listing(journal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", str(journal), "chat"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.match(r"\s+1\s+#1\s+assistant\s+-> read_file\(path='src/mod0.py'\)", lines[0])
    assert re.match(r"\s+2\s+#1\s+tool\[call_0_b\]\s+41 passed, 1 failed in mod0", lines[1])
    assert "records from 1 compaction(s)" in lines[-1]
    count = int(lines[-1].split()[0])
    assert len(lines) == count + 1
    assert main(["history", str(journal), "chat", "--limit", "3"]) == 0
    limited = capsys.readouterr().out.splitlines()
    assert len(limited) == 4 and limited[:3] == lines[count - 3 : count]


def test_history_search(journal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", str(journal), "chat", "--search", "zebra2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "user" in out[0] and "Now fix round 2 (keyword zebra2)." in out[0]
    assert main(["history", str(journal), "chat", "--search", "no-such-word-anywhere"]) == 0
    assert "no records match" in capsys.readouterr().out
    assert main(["history", str(journal), "chat", "--search", "passed", "--limit", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_history_range(journal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", str(journal), "chat", "--range", "2", "3"]) == 0
    out = capsys.readouterr().out
    assert "record 2 · compaction 1 · tool[call_0_b]" in out and "record 3 ·" in out and "record 4" not in out
    assert out.count("def handler_0():") == 15  # in full
    assert main(["history", str(journal), "chat", "--range", "500", "600"]) == 0
    assert "no records in 500-600" in capsys.readouterr().out
    assert main(["history", str(journal), "chat", "--range", "3", "2"]) == 2
    assert "FIRST must not be after LAST" in capsys.readouterr().err


def test_history_markdown(journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", str(journal), "chat", "--markdown"]) == 0
    md = Path(capsys.readouterr().out.strip())
    assert md == journal / "chat.md"
    text = md.read_text()
    assert text.startswith("## Compaction 1") and "zebra0" in text
    out = tmp_path / "transcript.md"
    assert main(["history", str(journal), "chat", "--markdown", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_text() == text


def test_history_warns_of_a_journal_cut_mid_line(journal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", str(journal), "chat"]) == 0
    assert capsys.readouterr().err == ""  # a whole journal: no warning
    path = journal / "chat.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[: data.index(b"\n", len(data) // 2) + 1 + 40])  # cut 40 bytes into a line
    # before: the listing just ended early (or said "0 records"), exit 0, nothing about the cut
    assert main(["history", str(journal), "chat"]) == 0
    captured = capsys.readouterr()
    assert "records from" in captured.out
    assert captured.err.count("\n") == 1 and "ends in an incomplete line" in captured.err
    assert f"cmdc history {journal} chat --verify" in captured.err
    assert main(["history", str(journal), "chat", "--verify"]) == 1  # --verify reports it itself
    captured = capsys.readouterr()
    assert "torn: 40 bytes after the last complete line" in captured.out and captured.err == ""


def test_history_errors(journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", str(journal), "../chat"]) == 2
    assert "agent id '../chat' is not allowed" in capsys.readouterr().err
    assert main(["history", str(journal), "other"]) == 2
    assert "no journal for agent 'other'; journals there: chat" in capsys.readouterr().err
    (journal / "odd.jsonl").mkdir()  # before: "no journal for agent 'odd'; journals there: chat, odd"
    assert main(["history", str(journal), "odd"]) == 2
    assert "odd.jsonl: not a regular file, so not a journal" in capsys.readouterr().err
    assert main(["history", str(journal), "other"]) == 2
    assert "journals there: chat\n" in capsys.readouterr().err  # the directory is not listed
    assert main(["history", str(tmp_path / "missing"), "chat"]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["history", str(journal / "chat.jsonl"), "chat"]) == 2  # a file, not a directory
    assert "not a directory" in capsys.readouterr().err
    # a damaged journal: the damaged record is skipped and counted, the rest is read
    path = journal / "chat.jsonl"
    lines = path.read_bytes().split(b"\n")
    assert b"passed" in lines[2]
    lines[2] = lines[2].replace(b"passed", b"PASSED")
    path.write_bytes(b"\n".join(lines))
    assert main(["history", str(journal), "chat"]) == 0
    out, err = capsys.readouterr()
    assert "1 damaged line(s)" in err and "--verify" in err
    assert "records from 1 compaction(s)" in out
    # --verify lists the damaged line itself: no warning that points at --verify (it printed one)
    assert main(["history", str(journal), "chat", "--verify"]) == 1
    out, err = capsys.readouterr()
    assert "damaged: line 3" in out and err == ""


def test_compact_pins_and_developer_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    messages = conversation()
    messages[0] = {"role": "developer", "content": "Be brief."}
    pin = {"role": "user", "content": "PIN: the staging database is db-stg-07.", "cmdc": {"pinned": True}}
    messages.insert(5, pin)
    path = write_jsonl(tmp_path / "pins.jsonl", messages)
    assert main(["compact", str(path), "--keep", "2"]) == 0
    capsys.readouterr()
    result = read_output(tmp_path / "pins.compacted.jsonl")
    assert result[0] == {"role": "developer", "content": "Be brief."}  # pinned as a system message, as it was
    assert pin in result  # a pinned message stays, verbatim
    assert result[-2:] == messages[-2:]


@pytest.mark.parametrize("command", ["history", "ui"])
def test_a_store_url_of_another_scheme_is_named_as_typed(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # before: "http:/host/x: no such directory" (the URL folded into a path)
    argv = [command, "http://host/x", *(["a1"] if command == "history" else [])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "'http://host/x' is not a store: give a directory or a postgresql:// URL" in err
    assert "http:/host" not in err


def test_demo_refuses_a_ui_port_without_ui(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # before: the demo ran to its end (exit 0) and no page was ever served on the port asked for
    assert main(["demo", "--ui-port", "8080", "--offload-dir", str(tmp_path / "j")]) == 2
    assert capsys.readouterr().err == "cmdc demo: error: --ui-port goes with --ui\n"
    assert not (tmp_path / "j").exists()


def test_demo_exits_1_when_a_retention_check_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import cmdc.cli._demo

    monkeypatch.setattr(cmdc.cli._demo, "check_retention", lambda *a: Retention(task=False, users=(1, 2), pins=(0, 0)))
    code = main(["demo", "--agents", "1", "--turns", "3", "--latency", "0", "--offload-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "✗ 1/2" in out and "a retention check failed" in out
