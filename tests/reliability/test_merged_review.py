"""Found by reviewing the merged whole (issues 24, 26, 29, 31) as a user: the places where two
features meet."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import cmdc
from cmdc import OffloadStore, open_runtime, tool
from cmdc.cli import main as cli_main
from cmdc.providers import SimulatedModel


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"line {path}\n" * 3_000  # ~12k tokens: capped at arrival, masked later


async def capped_and_masked_agent(store: Path) -> cmdc.State:
    """A plain config on a 4k window: results capped at arrival, masked, one summary."""
    async with open_runtime(store=str(store), log_events=False) as rt:
        agent = await rt.spawn(
            "a1", SimulatedModel(context_window=4_000, tool_probability=1.0), tools=[read_file], recall=True
        )
        for i in range(12):
            await agent.prompt(f"turn {i}: read src/f{i}.py")
        return await agent.state()


async def test_capped_and_masked_batches_are_not_counted_as_compactions(tmp_path: Path) -> None:
    state = await capped_and_masked_agent(tmp_path)
    report = await OffloadStore(tmp_path).verify("a1")
    batches = {r.compaction for r in await OffloadStore(tmp_path).records("a1")}
    assert batches == set(range(state.compactions + 1))  # caps and masks carry the current count
    assert report.compactions == state.compactions  # the summaries, not every committed batch


def test_the_history_listing_and_verify_count_the_summaries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = trio.run(capped_and_masked_agent, tmp_path)
    assert cli_main(["history", str(tmp_path), "a1", "--verify"]) == 0
    out = capsys.readouterr().out
    assert f"from {state.compactions} compaction(s)" in out


async def test_a_postgresql_journal_counts_the_summaries_too(postgres_url: str) -> None:
    async with open_runtime(store=postgres_url, log_events=False) as rt:
        agent = await rt.spawn(
            "a1", SimulatedModel(context_window=4_000, tool_probability=1.0), tools=[read_file], recall=True
        )
        for i in range(12):
            await agent.prompt(f"turn {i}: read src/f{i}.py")
        state = await agent.state()
        assert rt.store is not None
        records = await rt.store.records("a1")
        report = await rt.store.verify("a1")
    assert {r.compaction for r in records} == set(range(state.compactions + 1))
    assert report.compactions == state.compactions


async def test_the_pages_timeline_shows_only_the_summaries_as_compactions(tmp_path: Path) -> None:
    from cmdc.ui.data import journal_points

    state = await capped_and_masked_agent(tmp_path)
    store = OffloadStore(tmp_path)
    points = await journal_points(store, "a1")
    assert [p["compaction"] for p in points] == list(range(1, state.compactions + 1))  # no "compaction #0"
    summary = next(m for m in state.messages if m.is_summary)
    first, last = points[-1]["first_seq"], points[-1]["last_seq"]
    assert f"(records {first}-{last})" in summary.text  # the range the summary names, no later caps


USER_PROGRAM = """
import cmdc
import cmdc.mcp
from mcp.server.mcpserver import MCPServer
from cmdc.providers import ScriptedProvider


async def main() -> None:
    clock = cmdc.mcp.stdio("python", "-m", "mcp_server_time")
    notes = cmdc.mcp.in_process(MCPServer("notes"))
    async with cmdc.open_runtime(log_events=False) as rt:
        await rt.spawn("a1", ScriptedProvider(["ok"]), tools=[clock, notes])
        await rt.spawn("a2", ScriptedProvider(["ok"]), tools=[notes])
"""


def test_the_readme_mcp_program_passes_mypy_strict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's MCP block failed `mypy --strict`: ToolSource declared `name` a settable
    attribute, which the frozen MCPTools does not have."""
    pytest.importorskip("mcp")
    api = pytest.importorskip("mypy.api")
    monkeypatch.setenv("MYPYPATH", str(Path(cmdc.__file__).parents[1]))  # this checkout's cmdc
    program = tmp_path / "user.py"
    program.write_text(USER_PROGRAM)
    out, err, status = api.run(["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(program)])
    assert status == 0, out + err


async def test_a_web_page_on_a_port_in_use_is_a_config_error() -> None:
    pytest.importorskip("hypercorn")
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    busy = listener.getsockname()[1]
    with listener:
        with pytest.raises(cmdc.ConfigError, match=rf"cannot listen on 127\.0\.0\.1:{busy}"):
            async with open_runtime(ui=busy, log_events=False):
                pass
        async with open_runtime(log_events=False) as rt:
            with pytest.raises(cmdc.ConfigError, match=r"cannot listen on no-such-host\.invalid"):
                await rt.serve_ui(host="no-such-host.invalid")
            assert (await rt.serve_ui()).port != busy  # the runtime still serves a page


def test_cmdc_ui_on_a_port_in_use_exits_1_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("hypercorn")
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        assert cli_main(["ui", str(tmp_path), "--port", str(busy)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{busy}" in err and "Traceback" not in err and len(err.splitlines()) == 1
