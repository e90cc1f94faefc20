"""The command as a newcomer meets it: `--version`, `history | head`, an inert Markdown
transcript, BOM and `{"messages": [...]}` inputs, re-compacting a compacted file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio

import cmdc
from cmdc import Message, OffloadStore, ToolCall
from cmdc.cli import main

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def chat(rounds: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for i in range(rounds):
        messages.append({"role": "user", "content": f"User request {i}: please handle item-{i} carefully."})
        messages.append({"role": "assistant", "content": f"Done with item-{i}. " + "blah " * 30})
    return messages


def test_version_from_the_command_and_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" in project["dynamic"]
    from cmdc._version import SOURCE_VERSION

    assert cmdc.__version__ == SOURCE_VERSION  # not installed here: the source tree's own
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"cmdc {cmdc.__version__}\n"
    done = subprocess.run(
        [sys.executable, "-m", "cmdc", "--version"], capture_output=True, text=True, env=ENV, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"cmdc {cmdc.__version__}\n", "")


def test_the_distribution_is_cmdc_agents_never_pypis_cmdc(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cmdc` on PyPI is an unrelated package: the distribution is `cmdc-agents` (the import name
    and the command stay `cmdc`), the version is read from its metadata only, and the install
    hints name it, with the checkout's form beside it."""
    import importlib.metadata

    from cmdc import _version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == _version.DISTRIBUTION == "cmdc-agents"
    assert project["scripts"] == {"cmdc": "cmdc.cli:main"}
    asked: list[str] = []

    def version(name: str) -> str:
        asked.append(name)
        if name == "cmdc":
            return "2.0.0"  # the unrelated package, were it installed beside
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_version, "version", version)
    assert _version._version() == _version.SOURCE_VERSION and asked == ["cmdc-agents"]
    monkeypatch.setattr(_version, "version", lambda name: {"cmdc-agents": "9.1"}[name])
    assert _version._version() == "9.1"
    hint = _version.install_hint("ray,postgres")
    assert hint == "pip install 'cmdc-agents[ray,postgres]' (from a checkout: pip install -e '.[ray,postgres]')"
    sources = [*(ROOT / "cmdc").rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    stale = [str(p.relative_to(ROOT)) for p in sources if re.search(r"install '?cmdc\[", p.read_text("utf-8"))]
    assert stale == []


@pytest.mark.parametrize("command", ["demo", "ui"])
def test_help_that_names_an_extra_says_how_to_install_it_from_the_checkout(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # cmdc-agents is not on any package index yet: a bare "pip install 'cmdc-agents[ui]'" fails
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    hints = re.findall(r"pip install '[^']*cmdc- ?agents\[(\w+)\]'(.{0,60})", text)
    assert hints, text
    for extra, after in hints:
        assert after.startswith(f" (from a checkout: pip install -e '.[{extra}]')"), (extra, after)


@pytest.fixture
def long_journal(tmp_path: Path) -> Path:
    """A journal with enough records that its listing overflows a pipe's buffer."""
    store = OffloadStore(tmp_path)
    trio.run(store.append, "chat", [Message.user(f"message {i}: " + "words " * 12) for i in range(3_000)])
    return tmp_path


def test_history_into_a_pipe_closed_early_ends_quietly(long_journal: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmdc", "history", str(long_journal), "chat"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does
    err = proc.stderr.read()
    code = proc.wait(timeout=60)
    assert b"message 0" in first
    assert err == b""  # no "Broken pipe", no traceback
    assert code == 141


def test_history_through_head_in_a_shell(long_journal: Path) -> None:
    script = f'{sys.executable} -m cmdc history {long_journal} chat | head -2; echo "status ${{PIPESTATUS[0]}}"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=ENV, check=False)
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[-1] == "status 141"
    assert done.stderr == ""


def test_markdown_transcript_keeps_every_text_inert(tmp_path: Path) -> None:
    hostile = "# Title\n<script>alert(1)</script>\n```\n# still inside\n````"
    call = ToolCall(id="c`1<b>", name="fetch", arguments={"url": "<img src=x onerror=alert(1)>`"})
    store = OffloadStore(tmp_path)
    messages = [
        Message.user(hostile),
        Message.assistant("## not a heading", tool_calls=(call,)),
        Message.tool_result("c`1<b>", hostile, is_error=True),
    ]
    trio.run(store.append, "a", messages)
    assert main(["history", str(tmp_path), "a", "--markdown"]) == 0
    md = (tmp_path / "a.md").read_text()
    outside = _outside_code(md)
    for text in ("# Title", "<script>", "## not a heading", "# still inside", "<img", "<b>"):
        assert text not in outside, text
    assert [line for line in outside.splitlines() if line.startswith("#")] == [
        "## Compaction 0 — records 1\N{EN DASH}3",
        "### 1 · user",
        "### 2 · assistant",
        "### 3 · tool (call  , error)",
    ]
    assert md.count("<script>alert(1)</script>") == 2  # still all there, as text


def _outside_code(md: str) -> str:
    """The Markdown with fenced blocks and inline code spans removed (CommonMark's rules for
    backtick fences and spans, which is all the transcript uses)."""
    out: list[str] = []
    fence: str | None = None
    for line in md.splitlines():
        stripped = line.lstrip()
        if fence is None and stripped.startswith("```"):
            fence = stripped[: len(stripped) - len(stripped.lstrip("`"))]
            continue
        if fence is not None:
            if stripped.rstrip() == fence or (stripped.startswith(fence) and not stripped.strip("`")):
                fence = None
            continue
        out.append(_strip_spans(line))
    return "\n".join(out)


def _strip_spans(line: str) -> str:
    result, i = [], 0
    while i < len(line):
        if line[i] != "`":
            result.append(line[i])
            i += 1
            continue
        j = i
        while j < len(line) and line[j] == "`":
            j += 1
        run = line[i:j]
        end = line.find(run, j)
        while end != -1 and end + len(run) < len(line) and line[end + len(run)] == "`":
            end = line.find(run, end + len(run) + 1)
        if end == -1:
            result.append(run)
            i = j
        else:
            result.append(" ")
            i = end + len(run)
    return "".join(result)


def test_a_byte_order_mark_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, body in (
        ("bom.jsonl", "".join(json.dumps(m) + "\n" for m in chat(8))),
        ("bom.json", json.dumps(chat(8))),
    ):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + body.encode())
        assert main(["compact", str(path), "--keep", "2"]) == 0, capsys.readouterr().err
        assert "compacted" in capsys.readouterr().out


def test_an_object_with_a_messages_array_is_compacted_in_its_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "request"  # no suffix: recognized by its content
    path.write_text(json.dumps({"model": "gpt-4.1", "temperature": 0.2, "messages": chat(8)}))
    assert main(["compact", str(path), "--keep", "2"]) == 0, capsys.readouterr().err
    out = json.loads((tmp_path / "request.compacted.json").read_text())
    assert out["model"] == "gpt-4.1" and out["temperature"] == 0.2
    assert len(out["messages"]) < len(chat(8))
    assert any(m["content"].startswith("[Conversation summary #1]") for m in out["messages"])
    assert out["messages"][-2:] == chat(8)[-2:]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"messages": {"role": "user"}}', '"messages" must be an array of messages, got an object'),
        ('{"messages": [{"role": "user", "content": "hi"}, 3]}', "messages[1]: a message must be a JSON object"),
        ('{"model": "x"}', 'an object with a "messages" array'),
    ],
)
def test_bad_messages_objects(content: str, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["compact", str(path)]) == 2
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "bad.compacted.json").exists()


@pytest.mark.parametrize("annotate", [False, True])
def test_recompacting_an_output_keeps_the_carried_user_messages(
    annotate: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(m) + "\n" for m in chat(30)))
    flags = ["--annotate"] if annotate else []
    assert main(["compact", str(path), "--keep", "4", *flags]) == 0
    first = tmp_path / "chat.compacted.jsonl"
    second = tmp_path / "again.jsonl"
    assert main(["compact", str(first), "--keep", "2", "--out", str(second), *flags]) == 0, capsys.readouterr().err

    def quoted(file: Path) -> set[int]:
        lines = [json.loads(line) for line in file.read_text().splitlines()]
        summary = next(m["content"] for m in lines if m["content"].startswith("[Conversation summary #"))
        return {i for i in range(30) if f"item-{i} carefully" in summary}

    once = quoted(first)
    assert len(once) >= 20  # the first summary quotes the user messages it replaced
    assert once <= quoted(second)  # and the second carries them on


def test_compaction_cooldown_is_documented() -> None:
    for page in ("agents.md", "configuration.md"):
        assert "`compaction_cooldown`" in (ROOT / "docs" / page).read_text()
