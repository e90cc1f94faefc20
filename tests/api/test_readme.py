"""Every Python block of README.md and docs/*.md runs and does what its prose says.

Each block runs in a fresh interpreter from the repository root, in a temporary working
directory. Conventions (docs/contributing.md):

- a `text` block right after a Python block is its exact output, unless the comment
  `<!-- output varies: WHY -->` stands between them;
- a block that needs a network endpoint or a server it cannot start has the comment
  `<!-- not run: WHY -->` on the line before it: it is only compiled, and WHY must say what it
  needs, so a new block cannot slip through unrun. The design page's contract listing is not a
  program either: `tests/api/test_exports.py` checks its names and call forms.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_BLOCK = re.compile(
    r"^(?:<!-- not run: (?P<skip>.+?) -->\n)?```python\n(?P<code>.*?)^```\n"
    r"(?:\s*(?:<!-- output varies: (?P<varies>.+?) -->\n\s*)?```text\n(?P<out>.*?)^```)?",
    re.DOTALL | re.MULTILINE,
)
_HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)


@attrs.frozen
class Block:
    page: str  # relative to the repository root
    heading: str  # the nearest heading above it
    code: str
    skip: str | None  # why it is only compiled
    output: str | None  # its exact output, when the page shows it and it does not vary
    varies: str | None


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            headings = _HEADING.findall(text[: m.start()])
            output = m["out"] if m["out"] is not None and m["varies"] is None else None
            heading = headings[-1] if headings else ""
            found.append(Block(str(page.relative_to(ROOT)), heading, m["code"], m["skip"], output, m["varies"]))
    return found


BLOCKS = blocks()


def block(page: str, heading: str) -> Block:
    [found] = [b for b in BLOCKS if b.page == page and b.heading == heading]
    return found


def run_block(code: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_every_page_is_scanned_and_every_python_block_is_found() -> None:
    """A ```python fence the pattern missed (a typo in a marker) would go unrun."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        fences = len(re.findall(r"^```python$", text, re.MULTILINE))
        assert fences == sum(b.page == str(page.relative_to(ROOT)) for b in BLOCKS), page
    pages = {b.page for b in BLOCKS}
    assert {"README.md", "docs/agents.md", "docs/compaction.md", "docs/storage.md", "docs/mcp.md"} <= pages


def test_blocks_not_run_say_what_they_need_and_compile() -> None:
    skipped = [b for b in BLOCKS if b.skip is not None]
    assert all(b.page != "README.md" for b in skipped)  # the README's examples all run
    for b in skipped:
        assert b.skip is not None and re.match(r"needs |a contract listing|a sketch", b.skip), b
        if b.skip.startswith("a contract listing"):
            continue  # signatures written as `call(...) -> Type`: not Python, checked by test_exports
        ast.parse(b.code)  # top-level await is fine in a sketch: parsed, not compiled


# Blocks run, with their promises checked, by a test of their own below (run once, not twice).
CHECKED_BELOW = {
    ("README.md", "A compaction plugin"),
    ("docs/compaction.md", "Compacting a conversation"),
    ("docs/agents.md", "A turn loop that compacts"),
    ("docs/mcp.md", "Tools from MCP servers"),
    ("docs/tracing.md", "Tracing (OpenTelemetry)"),
}


@pytest.mark.parametrize("b", [b for b in BLOCKS if b.skip is None], ids=lambda b: f"{b.page}:{b.heading}")
def test_every_block_runs(b: Block, tmp_path: Path) -> None:
    if (b.page, b.heading) in CHECKED_BELOW:
        return
    out = run_block(b.code, tmp_path)
    assert out.returncode == 0, out.stderr
    if b.output is not None:
        assert out.stdout == b.output


def test_the_blocks_checked_below_exist() -> None:
    for page, heading in CHECKED_BELOW:
        assert block(page, heading).skip is None


def test_readme_compaction_plugin(tmp_path: Path) -> None:
    """README, 'A compaction plugin': both hooks run, the context shrinks, the journal is where
    the prose says and `cmdc history` lists it."""
    out = run_block(block("README.md", "A compaction plugin").code, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert re.fullmatch(r"compacting \d+ messages \(auto\)", lines[0])
    m = re.fullmatch(r"(\d+) -> (\d+) tokens, \d+ messages left", lines[1])
    assert m is not None and int(m[2]) < int(m[1])
    assert lines[-1] == "1 compaction(s)"
    assert (tmp_path / ".cmdc" / "a1.jsonl").is_file()
    listed = subprocess.run(
        [sys.executable, "-m", "cmdc", "history", ".cmdc", "a1"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )
    assert listed.returncode == 0 and "records from 1 compaction(s)" in listed.stdout, listed


def test_compacting_a_conversation(tmp_path: Path) -> None:
    """compaction.md, 'Compacting a conversation': the state is over its trigger, so it compacts,
    moves the evicted messages to the journal and prints the summary message."""
    out = run_block(block("docs/compaction.md", "Compacting a conversation").code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "no compaction" not in out.stdout
    match = re.search(r"^(\d+) message\(s\) moved to (\S+)$", out.stdout, re.MULTILINE)
    assert match is not None, out.stdout
    assert int(match[1]) >= 2 and match[2].endswith("a1.jsonl")
    assert "[Conversation summary #1]" in out.stdout


def test_agents_example_compacts_and_keeps_serving(tmp_path: Path) -> None:
    """agents.md: 50 turns on a 4,000-token window; the Audit plugin prints each compaction,
    which always shrinks the context, and the last line shows the reply and the count."""
    out = run_block(block("docs/agents.md", "A turn loop that compacts").code, tmp_path)
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
    """mcp.md: a child-process server and an in-process one, both called."""
    pytest.importorskip("mcp_server_time", reason="pip install mcp-server-time (in the dev extra)")
    [b] = [b for b in BLOCKS if b.page == "docs/mcp.md"]
    out = run_block(b.code, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "offered: ['convert_time', 'get_current_time', 'word_count']"
    assert '"timezone": "Asia/Tokyo"' in lines[1] and lines[2] == "4"
    assert out.stderr == ""  # quiet: the server's stderr is kept for error messages, not printed


def test_traces_example_prints_the_span_tree(tmp_path: Path) -> None:
    """tracing.md: the reply, then the turn's span with its request, tool call and request
    under it, as the block after it shows (durations and token counts vary)."""
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra and the SDK (both in dev)")
    [b] = [b for b in BLOCKS if b.page == "docs/tracing.md"]
    assert b.varies is not None
    out = run_block(b.code, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "18 °C and cloudy."
    assert re.fullmatch(r"invoke_agent assistant  \S+ m?s  2 requests, 1 tool call  in \d+ out \d+ tokens", lines[1])
    assert lines[2].startswith("├─ chat scripted ") and lines[2].endswith("finish tool_calls")
    assert lines[3].startswith("├─ execute_tool weather ") and lines[3].endswith("call call_1")
    assert lines[4].startswith("└─ chat scripted ") and lines[4].endswith("finish stop")
    assert len(lines) == 5 and out.stderr == ""


def test_configuration_page_names_every_option() -> None:
    """configuration.md's tables name every field of the option classes and every config key."""
    from cmdc import AgentOptions
    from cmdc.compaction import CompactorOptions
    from cmdc.compaction.config import KNOWN_KEYS
    from cmdc.providers import HTTPSettings

    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    named = {name for ln in rows for name in re.findall(r"`(\w+)`", ln.split("|")[1])}
    fields = {f.name for cls in (CompactorOptions, AgentOptions, HTTPSettings) for f in attrs.fields(cls)}
    assert fields | KNOWN_KEYS <= named, sorted((fields | KNOWN_KEYS) - named)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_resolve() -> None:
    """Every relative link of the README and docs/ names a file that exists (or one another
    page owns and is due: journal, retention and search), and a heading of it when it names one."""
    due = {"docs/journal.md", "docs/retention.md", "docs/search.md"}
    for page in PAGES:
        for target, anchor in re.findall(r"\]\(([^)#:]*?)(?:#([^)]*))?\)", page.read_text(encoding="utf-8")):
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                assert str(path.relative_to(ROOT)) in due, (page.name, target)
                continue
            if anchor and path.suffix == ".md":
                anchors = {_anchor(h) for h in _HEADING.findall(path.read_text(encoding="utf-8"))}
                assert anchor in anchors, (page.name, target, anchor)


def test_files_and_modules_the_pages_name_exist() -> None:
    """A test file, script or benchmark a page names (`tests/test_x.py`, `python -m
    benchmarks.x`) exists: moving one without its page is caught here."""
    missing = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        # a path that opens a code span (`tests/x.py`, `tests/x.py::test_y`), not one inside a query
        for path in re.findall(r"`((?:tests|benchmarks|scripts|cmdc)/[\w./-]+\.(?:py|sh|jinja))", text):
            if not (ROOT / path).is_file():
                missing.append((page.name, path))
        for module in re.findall(r"python -m ((?:benchmarks|tests)(?:\.\w+)*)", text):
            where = ROOT.joinpath(*module.split("."))
            if not (where.with_suffix(".py").is_file() or (where / "__main__.py").is_file()):
                missing.append((page.name, module))
    assert not missing, missing


def test_tests_the_pages_cite_exist() -> None:
    """A test a page cites (`tests/x.py::test_y`, or `::test_z` after it on the same line) is
    defined in that file: a test moved to another file or renamed without its page is caught."""
    missing = []
    for page in PAGES:
        for line in page.read_text(encoding="utf-8").splitlines():
            current: str | None = None
            for path, name in re.findall(r"`(tests/[\w/]+\.py)?::(\w+)", line):
                current = path or current
                if current is None:
                    continue  # a bare `::name` whose file a row above names
                where = ROOT / current
                if not where.is_file() or not re.search(rf"def {name}\b", where.read_text(encoding="utf-8")):
                    missing.append((page.name, f"{current}::{name}"))
    assert not missing, missing


def _resolves(dotted: str) -> bool:
    """Whether `dotted` (`cmdc.store.Store`) names a module or an attribute of one."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_names_the_pages_use_exist() -> None:
    """A `cmdc.x.y` a page names is a module or an attribute (`cmdc.store.Store`), or else a
    string cmdc itself uses: a metadata key, span attribute or logger name (`cmdc.stop_reason`)."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "cmdc").rglob("*.py"))
    unknown = []
    for page in PAGES:
        for dotted in set(re.findall(r"`(cmdc(?:\.[A-Za-z_]\w*)+)", page.read_text(encoding="utf-8"))):
            if not _resolves(dotted) and f'"{dotted}' not in source:
                unknown.append((page.name, dotted))
    assert not unknown, unknown
