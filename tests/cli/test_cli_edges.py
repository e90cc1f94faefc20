"""The `cmdc` command's edges (issues 26 and 24): one exit-code table in every subcommand, a
bad flag shows the subcommand's usage, `-` is standard input (or output), directories checked
before any work, non-regular input files refused at once."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cmdc.cli import EXIT_CODES, _chatfile, main


def chat(n: int = 30) -> str:
    lines = [{"role": "system", "content": "You are careful."}, {"role": "user", "content": "TASK: port the parser"}]
    for i in range(n):
        lines.append({"role": "user", "content": f"step {i}: " + "details " * 40})
        lines.append({"role": "assistant", "content": f"done {i}: " + "notes " * 40})
    return "".join(json.dumps(m) + "\n" for m in lines)


def blocked(tmp_path: Path) -> Path:
    """A directory path that cannot be made, even by root: its parent is a regular file."""
    (tmp_path / "a-file").write_text("x")
    return tmp_path / "a-file" / "journals"


def test_the_exit_code_table_is_documented() -> None:
    assert set(EXIT_CODES) == {0, 1, 2}
    import cmdc.cli

    assert cmdc.cli.__doc__ is not None and "the same in every subcommand" in cmdc.cli.__doc__


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["compact", "x.jsonl", "--bogus"], "usage: cmdc compact"),
        (["history", "dir", "agent", "--bogus", "1"], "usage: cmdc history"),
        (["demo", "--turns", "2", "--nope"], "usage: cmdc demo"),
        (["demo", "--turns", "zero"], "usage: cmdc demo"),
    ],
)
def test_a_bad_flag_prints_the_subcommands_usage(
    argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert usage in err and "usage: cmdc [-h]" not in err
    assert "unrecognized arguments" in err or "expected an integer" in err


def test_an_unusable_offload_directory_is_an_input_error_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conversation = tmp_path / "c.jsonl"
    conversation.write_text(chat())
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    for bad in (blocked(tmp_path), a_file):
        assert main(["compact", str(conversation), "--offload-dir", str(bad)]) == 2
        assert "--offload-dir" in capsys.readouterr().err
        assert main(["demo", "--agents", "1", "--turns", "2", "--offload-dir", str(bad)]) == 2
        out, err = capsys.readouterr()
        assert "journals in" not in out and "--offload-dir" in err
    assert not (tmp_path / "c.compacted.jsonl").exists()


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs sysfs")
def test_demo_on_sysfs_fails_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--offload-dir", "/sys/kernel", "--turns", "20"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "journals" not in err
    assert err.count("\n") == 1 and "cannot write in /sys/kernel" in err


def test_compact_reads_standard_input_and_writes_standard_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(chat().encode())))
    assert main(["compact", "-", "--keep", "4"]) == 0
    out, err = capsys.readouterr()
    compacted = [json.loads(line) for line in out.splitlines()]
    assert len(compacted) < 20 and compacted[-1]["content"].startswith("done 29")
    assert "compacted <stdin> (jsonl" in err and "-> -" in err
    assert (tmp_path / ".cmdc" / "conversation_history" / "stdin.jsonl").is_file()
    # and to a file
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(chat().encode())))
    assert main(["compact", "-", "--out", "out.jsonl", "--agent", "piped"]) == 0
    assert (tmp_path / "out.jsonl").is_file() and "compacted <stdin>" in capsys.readouterr().out


def test_standard_input_is_read_with_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_chatfile, "MAX_CHAT_BYTES", 1_000)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(chat().encode())))
    assert main(["compact", "-"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "more than the 1,000 bytes read" in err
    assert not (tmp_path / ".cmdc").exists()


def test_history_markdown_dash_prints_the_transcript(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conversation = tmp_path / "c.jsonl"
    conversation.write_text(chat())
    assert main(["compact", str(conversation), "--offload-dir", str(tmp_path / "j")]) == 0
    capsys.readouterr()
    assert main(["history", str(tmp_path / "j"), "c", "--markdown", "-"]) == 0
    out = capsys.readouterr().out
    assert "step 0: details" in out and out.lstrip().startswith("#")


def test_history_markdown_to_stdout_or_a_file_writes_nothing_beside_the_journal(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """Before: `--markdown -` and `--markdown OUT` wrote (or refreshed) DIR/AGENT.md as well."""
    conversation = tmp_path / "c.jsonl"
    conversation.write_text(chat())
    assert main(["compact", str(conversation), "--offload-dir", str(tmp_path / "j")]) == 0
    before = sorted(os.listdir(tmp_path / "j"))
    capsysbinary.readouterr()
    assert main(["history", str(tmp_path / "j"), "c", "--markdown", "-"]) == 0
    printed = capsysbinary.readouterr().out
    out = tmp_path / "out.md"
    assert main(["history", str(tmp_path / "j"), "c", "--markdown", str(out)]) == 0
    assert capsysbinary.readouterr().out.decode().strip() == str(out)
    assert sorted(os.listdir(tmp_path / "j")) == before  # no c.md
    assert main(["history", str(tmp_path / "j"), "c", "--markdown"]) == 0  # the one that writes DIR/AGENT.md
    written = Path(capsysbinary.readouterr().out.decode().strip())
    assert written == tmp_path / "j" / "c.md"
    assert printed == out.read_bytes() == written.read_bytes() and b"step 0: details" in printed


@pytest.mark.parametrize("kind", ["fifo", "zero", "directory"])
def test_compact_refuses_a_non_regular_file_at_once(tmp_path: Path, kind: str) -> None:
    if kind == "directory":
        # before: "cmdc compact: [Errno 21] Is a directory: 3", exit 1 (fdopen ran before the check)
        target = tmp_path / "chats"
        target.mkdir()
        expected = "chats: is a directory, not a conversation file"
    elif kind == "fifo":
        target = tmp_path / "chat.jsonl"
        os.mkfifo(target)
        expected = "is a FIFO, not a regular file"
    else:
        target = Path("/dev/zero")
        if not target.exists():
            pytest.skip("no /dev/zero")
        expected = "is a character device, not a regular file"
    # before: the FIFO hung (no writer) and /dev/zero ended in a MemoryError traceback
    done = subprocess.run(
        [sys.executable, "-m", "cmdc", "compact", str(target), "--out", str(tmp_path / "o.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and expected in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o.jsonl").exists()
