"""Every Python block of README.md runs and does what its prose says.

Blocks are found in order; each runs in a fresh interpreter from the repository root, in a
temporary working directory. A block that needs a network service it cannot reach offline is
only compiled, and the test says which one it is, so a new block cannot slip through unrun.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[str]:
    return _BLOCK.findall(README.read_text(encoding="utf-8"))


def _heading_of(index: int) -> str:
    """The README heading above the `index`-th Python block."""
    text = README.read_text(encoding="utf-8")
    start = [m.start() for m in _BLOCK.finditer(text)][index]
    headings = re.findall(r"^## (.+)$", text[:start], re.MULTILINE)
    return headings[-1] if headings else ""


def run_block(code: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


# Blocks that talk to real model endpoints (keys, servers): compiled only.
NETWORK = {"Real model providers", "Running on a Ray cluster"}  # tests/cluster/test_ray.py runs them
TRACES = "Traces (OpenTelemetry)"  # needs the otel extra and the SDK (both in dev): run


def test_readme_blocks_are_all_accounted_for() -> None:
    headings = [_heading_of(i) for i in range(len(python_blocks()))]
    assert headings[:2] == ["Compacting a conversation", "Agents"]
    offline = {"Compacting a conversation", "Agents", "Storage", TRACES, "Tools from MCP servers", "The web page"}
    assert set(headings) <= offline | NETWORK, headings


def test_network_blocks_compile() -> None:
    for i, code in enumerate(python_blocks()):
        if _heading_of(i) in NETWORK:
            compile(code, f"README.md block {i}", "exec")


def test_first_example_compacts(tmp_path: Path) -> None:
    """'Compacting a conversation': the state is over its trigger, so it compacts, moves the
    evicted messages to the journal and prints the summary message."""
    code = python_blocks()[0]
    out = run_block(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "no compaction" not in out.stdout
    match = re.search(r"^(\d+) message\(s\) moved to (\S+)$", out.stdout, re.MULTILINE)
    assert match is not None, out.stdout
    assert int(match[1]) >= 2 and match[2].endswith("a1.jsonl")
    assert "[Conversation summary #1]" in out.stdout


def test_agents_example_compacts_and_keeps_serving(tmp_path: Path) -> None:
    """'Agents': 50 turns on a 4,000-token window; the Audit plugin prints each compaction,
    which always shrinks the context, and the last line shows the reply and the count."""
    code = python_blocks()[1]
    out = run_block(code, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    compacting = [ln for ln in lines if ln.startswith("compacting ")]
    shrinks = [re.fullmatch(r"(\d+) -> (\d+) tokens", ln) for ln in lines if " -> " in ln and ln.endswith("tokens")]
    assert compacting and shrinks
    for m in shrinks:
        assert m is not None and int(m[2]) < int(m[1])
    compactions = int(lines[-1].rsplit(" ", 1)[1])
    assert compactions >= 1
    # "past the trigger ... ("auto"); past the window ... ("forced")": both happen
    assert any(ln.endswith("(auto)") for ln in compacting) and any(ln.endswith("(forced)") for ln in compacting)
    # the simulated model's tool calls work: a path from the request, recall reading the journal
    tools = [ln for ln in lines if ln.startswith("tool ")]
    assert len(tools) >= 20 and all(ln.endswith(": ok") for ln in tools), tools
    assert {"tool read_file: ok", "tool recall: ok"} <= set(tools)
    assert out.stderr == ""  # a library is quiet: only the program's own prints, on stdout


def test_mcp_example_calls_both_servers(tmp_path: Path) -> None:
    """'Tools from MCP servers': a child-process server and an in-process one, both called."""
    pytest.importorskip("mcp_server_time", reason="pip install mcp-server-time (in the dev extra)")
    [index] = [i for i in range(len(python_blocks())) if _heading_of(i) == "Tools from MCP servers"]
    out = run_block(python_blocks()[index], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "offered: ['convert_time', 'get_current_time', 'word_count']"
    assert '"timezone": "Asia/Tokyo"' in lines[1] and lines[2] == "4"
    assert out.stderr == ""  # quiet: the server's stderr is kept for error messages, not printed


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_every_offline_block_runs(index: int, tmp_path: Path) -> None:
    if _heading_of(index) in NETWORK:
        pytest.skip("needs a model endpoint; compiled by test_network_blocks_compile")
    if index < 2:
        return  # run, with their promises checked, by the two tests above
    out = run_block(python_blocks()[index], tmp_path)
    assert out.returncode == 0, out.stderr


def test_traces_example_prints_the_span_tree(tmp_path: Path) -> None:
    """'Traces (OpenTelemetry)': the reply, then the turn's span with its request, tool call and
    request under it, as the block after it shows."""
    (index,) = [i for i in range(len(python_blocks())) if _heading_of(i) == TRACES]
    out = run_block(python_blocks()[index], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "18 °C and cloudy."
    assert re.fullmatch(r"invoke_agent assistant  \S+ m?s  2 requests, 1 tool call  in \d+ out \d+ tokens", lines[1])
    assert lines[2].startswith("├─ chat scripted ") and lines[2].endswith("finish tool_calls")
    assert lines[3].startswith("├─ execute_tool weather ") and lines[3].endswith("call call_1")
    assert lines[4].startswith("└─ chat scripted ") and lines[4].endswith("finish stop")
    assert len(lines) == 5 and out.stderr == ""
