"""A library is quiet: nothing on stdout or stderr unless the application asked for logs; every
event kind is a constant with one payload shape, logged at its level where logging is set up."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import structlog
import trio

import cmdc
from cmdc import events
from cmdc.events import FIELDS, LEVELS, Event, log_event
from cmdc.message import Message
from cmdc.providers import ModelRequest, OpenAIProvider, SimulatedModel
from cmdc.testing import drain

ROOT = Path(__file__).resolve().parents[2]

# A program like the README's: tools, a plugin, compactions and overflows, its own prints.
PROGRAM = """
import sys, trio, cmdc
from cmdc.providers import SimulatedModel
{setup}

@cmdc.tool
async def read_file(path: str) -> str:
    \"\"\"Read a file.\"\"\"
    return "def login(): ..."

async def main() -> None:
    async with cmdc.open_runtime() as rt:
        agent = await rt.spawn("a1", SimulatedModel(context_window=4_000), tools=[read_file], recall=True,
                               config={{"compact_trigger": ("tokens", 3_000),
                                        "compact_offload_dir": sys.argv[1]}})
        for turn in range(30):
            await agent.prompt(f"step {{turn}}: read auth.py " + "details " * 60)
        print("compactions:", (await agent.state()).compactions)

trio.run(main)
"""


@pytest.fixture(autouse=True)
def structlog_unconfigured() -> Iterator[None]:
    """As in a fresh process: other tests (`capture_logs`) leave structlog configured."""
    was_configured, config = structlog.is_configured(), structlog.get_config()
    structlog.reset_defaults()
    yield
    if was_configured:
        structlog.configure(**config)


def run_program(tmp_path: Path, setup: str = "") -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM.format(setup=setup)))
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "journal")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
        check=False,
    )


def test_a_program_that_configured_nothing_sees_only_its_own_output(tmp_path: Path) -> None:
    done = run_program(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("compactions: "), done.stdout
    assert int(lines[0].split()[1]) >= 1  # it did compact: there were events to log
    assert done.stderr == ""


def test_stdlib_logging_configured_by_the_application_gets_the_events_on_stderr(tmp_path: Path) -> None:
    done = run_program(tmp_path, "import logging\nlogging.basicConfig(level=logging.INFO)")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1  # stdout stays the program's own
    assert "INFO:cmdc:compaction_end agent=a1" in done.stderr
    assert "turn_start" not in done.stderr  # DEBUG, below the configured level


def test_structlog_configured_by_the_application_gets_the_events(tmp_path: Path) -> None:
    setup = (
        "import structlog\n"
        "structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr),"
        " processors=[structlog.processors.KeyValueRenderer(key_order=['event', 'agent'])])"
    )
    done = run_program(tmp_path, setup)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1
    assert "event='compaction_end' agent='a1'" in done.stderr
    assert "event='turn_start' agent='a1'" in done.stderr


def test_log_events_false_keeps_even_configured_logging_quiet(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    async def main() -> None:
        async with cmdc.open_runtime(log_events=False) as rt:  # its journal in tmp_path, not .cmdc/ here
            agent = await rt.spawn("a1", SimulatedModel(), config={"compact_offload_dir": str(tmp_path)})
            await agent.prompt("hello")

    with caplog.at_level(logging.DEBUG, logger="cmdc"):
        trio.run(main)
    assert [r for r in caplog.records if r.name.startswith("cmdc")] == []


def test_levels_follow_the_kind(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="cmdc"):
        log_event(Event(events.TURN_START, "a1", {"messages": 1, "tokens": 2}))  # DEBUG: filtered
        log_event(Event(events.COMPACTION_FAILED, "a1", {"reason": "auto", "error": "boom"}))
        log_event(Event("custom_kind", "a1", {"x": 1}))
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert records == [
        (logging.WARNING, "compaction_failed agent=a1 reason='auto' error='boom'"),
        (logging.INFO, "custom_kind agent=a1 x=1"),
    ]
    assert caplog.records[0].cmdc_event.kind == events.COMPACTION_FAILED


def test_http_retries_are_logged_not_printed(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import httpx, trio
        from cmdc.message import Message
        from cmdc.providers import ModelRequest, OpenAIProvider
        replies = [httpx.Response(503, json={"error": {"message": "busy"}}),
                   httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "hi"},
                                              "finish_reason": "stop"}],
                                             "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                       "total_tokens": 2}})]
        client = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: replies.pop(0)))
        provider = OpenAIProvider("m", api_key="k", client=client)
        async def main():
            reply = await provider.complete(ModelRequest([Message.user("go")]))
            assert reply.text == "hi" and not replies
        trio.run(main)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")


async def test_http_retries_go_to_the_cmdc_providers_logger(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.abc.Clock
) -> None:
    replies = [
        httpx.Response(503, json={"error": {"message": "busy"}}),
        httpx.Response(
            200,
            json={
                "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        ),
    ]
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: replies.pop(0)))
    with caplog.at_level(logging.WARNING, logger="cmdc"):
        reply = await OpenAIProvider("m", api_key="k", client=client).complete(ModelRequest([Message.user("go")]))
    assert reply.text == "hi"
    [record] = [r for r in caplog.records if r.name == "cmdc.providers"]
    assert record.levelno == logging.WARNING and "retry 1 of 4" in record.getMessage()


def test_every_kind_is_a_constant_with_a_level_and_a_shape() -> None:
    kinds = {v for k, v in vars(events).items() if k.isupper() and isinstance(v, str)}
    assert kinds == set(FIELDS) == set(LEVELS)


def test_no_event_is_emitted_with_a_bare_string_kind() -> None:
    for path in sorted((ROOT / "cmdc").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("_emit", "_log", "Event"):  # the kind is the first or second argument
                for arg in node.args[:2]:
                    bare = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                    assert not bare, f"{path.name}:{node.lineno}: a bare event kind"


def test_an_event_always_carries_its_kinds_keys() -> None:
    event = Event(events.TURN_END, "a1", {"aborted": True, "reason": "aborted"})
    assert dict(event.data) == {"steps": None, "duration": None, "usage": None, "aborted": True, "reason": "aborted"}
    assert dict(Event(events.RETRY, "a1", {"after": "overflow", "forced": 1}).data) == {
        "after": "overflow",
        "forced": 1,
        "clipped": False,
    }
    assert dict(Event("custom", "a1", {"x": 1}).data) == {"x": 1}  # unknown kinds are left alone


async def test_a_whole_run_emits_every_kind_in_its_one_shape(tmp_path: Path) -> None:
    seen: dict[str, set[frozenset[str]]] = {}

    @cmdc.tool
    async def read_file(path: str) -> str:
        """Read a file."""
        return "x " * 100

    async with cmdc.open_runtime(log_events=False) as rt:
        with rt.subscribe(buffer=100_000) as sub:
            agent = await rt.spawn(
                "a1",
                SimulatedModel(context_window=3_000, tool_probability=0.9),
                tools=[read_file],
                recall=True,
                max_output_tokens=700,
                config={
                    "compact_trigger": ("tokens", 2_400),
                    "compact_keep": ("messages", 2),
                    "compact_offload_dir": str(tmp_path),
                },
            )
            for turn in range(25):
                await agent.prompt(f"step {turn}: " + "details " * 40)
            for event in drain(sub):
                seen.setdefault(event.kind, set()).add(frozenset(event.data))
    for kind, shapes in seen.items():
        assert shapes == {frozenset(FIELDS[kind])}, kind
    assert {events.TURN_START, events.TOOL_END, events.COMPACTION_END, events.OVERFLOW, events.RETRY} <= set(seen)


def test_the_docs_document_every_kind_and_its_fields() -> None:
    readme = (ROOT / "docs" / "events.md").read_text()
    for kind, keys in FIELDS.items():
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{kind}` |")), None)
        assert row is not None, kind
        assert all(f"`{k}`" in row for k in keys), (kind, row)
