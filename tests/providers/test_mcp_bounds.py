"""cmdc.mcp.stdio against a hostile server (tests/_support/mcp_hostile.py): a 100 MB result, processes
that try to outlive the runtime, a server that dies."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import cmdc
import cmdc.mcp
from cmdc.events import MCP_MESSAGE_CLIPPED, MCP_SERVER_GAVE_UP, MCP_SERVER_RESTART, TOOL_START
from cmdc.mcp._transport import LineReader, Oversized, Pieces, clipped_reply, head_text, reply_id
from cmdc.providers import ScriptedProvider

call = ScriptedProvider.tool_call
HOSTILE = str(Path(__file__).parents[1] / "_support" / "mcp_hostile.py")
ROOT = str(Path(__file__).resolve().parents[2])
MB = 1 << 20


def hostile(*args: str, **options: Any) -> cmdc.mcp.MCPTools:
    return cmdc.mcp.stdio(sys.executable, HOSTILE, *args, name="hostile", **options)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def marked() -> list[int]:
    """Every process on the machine whose command line holds the hostile server's marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"cmdc-hostile-mcp" in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# -- the line reader -------------------------------------------------------------------------------


def test_the_reader_joins_each_line_once_and_never_holds_more_than_the_cap() -> None:
    reader = LineReader(cap=4 * MB, keep=64 * 1024)
    chunk = b"x" * 65536
    most = 0
    for _ in range(1600):  # a 100 MB line, 64 KiB at a time
        assert reader.feed(chunk) == []
        most = max(most, reader.held)
    [line] = reader.feed(b'"}\n')
    assert isinstance(line, Oversized) and line.size == 1600 * 65536 + 2
    assert most <= 4 * MB and reader.held == 0
    assert reader.copied <= 64 * 1024  # the head, once; never the line re-joined per chunk
    assert len(line.head) == 64 * 1024 and line.tail.endswith(b'x"}')

    # lines under the cap: each one's pieces joined once, whatever the chunking
    text = b'{"jsonrpc": "2.0", "id": 1, "result": {}}'
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
    before = reader.copied
    out = [x for p in [*pieces, b"\n", b"\n".join([text, text, b""])] for x in reader.feed(p)]
    assert out == [text, text, text]
    assert reader.copied - before == len(text)  # only the chunked one needed a join

    # a long line under the cap comes as its pieces, joined by the caller in a worker thread
    reader = LineReader(cap=4 * MB, keep=1024, join_elsewhere=10)
    [long] = [x for p in [*pieces, b"\n"] for x in reader.feed(p)]
    assert isinstance(long, Pieces) and long.join() == text and reader.copied == 0


def test_an_oversized_reply_is_replaced_by_a_clipped_result_or_an_error() -> None:
    python = Oversized(
        100 * MB, b'{"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "ab\\u00e9', b""
    )
    typescript = Oversized(100 * MB, b'{"result": {"content": [{"text": "x"', b'xx"}]}, "jsonrpc": "2.0", "id": "r-8"}')
    nested = Oversized(100 * MB, b'{"result": {"id": 1, "content": [', b'{"id": 2}}}')
    assert (reply_id(python), reply_id(typescript), reply_id(nested)) == (7, "r-8", None)
    assert head_text(python.head, 1000) == "abé"
    assert head_text(b'{"text": "caf\\u00', 100) == "caf"  # a cut escape is dropped
    assert head_text('{"text": "é"'.encode()[:-2], 100) == ""  # a cut UTF-8 character too

    message = clipped_reply(python, (7, "tools/call"), 16 * MB, 4096).message
    text = message.model_dump()["result"]["content"][0]["text"]
    assert text.startswith("abé\n[clipped: the MCP server's reply to tools/call was 104,857,600 bytes")
    assert "past the cap of 16,777,216 bytes (max_message_bytes)" in text
    refused = clipped_reply(python, (7, "tools/list"), 16 * MB, 4096).message.model_dump()
    assert refused["error"]["message"].startswith("the MCP server's reply to tools/list was 104,857,600 bytes")


# -- a 100 MB result --------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["id-first", "id-last"])
async def test_a_100_mb_result_is_clipped_and_a_neighbour_keeps_working(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, order: str
) -> None:
    """The server writes 50 MB of one line, then waits until the neighbour agent has answered
    five prompts (it could not, were the trio thread stuck re-joining the line), then the rest."""
    logged: list[Any] = []
    monkeypatch.setattr(cmdc.mcp, "logging_enabled", lambda: True)
    monkeypatch.setattr(cmdc.mcp, "log_event", logged.append)
    pause = tmp_path / "go-on"
    server = hostile(*(["--id-last"] if order == "id-last" else []))
    provider = ScriptedProvider(
        [call("huge", {"size": 100 * MB, "pause": str(pause)}), call("echo", {"text": "after"}), "done"]
    )
    async with cmdc.open_runtime(log_events=False) as rt:
        # no cap at arrival (the tiers'): this test is about the MCP reader's own clip
        agent = await rt.spawn("a1", provider, tools=[server], config={"tool_result_limit": None})
        neighbour = await rt.spawn("n1", ScriptedProvider([f"answer {i}" for i in range(5)]))

        async def neighbour_turns(sub: Any) -> None:
            async for event in sub:
                if event.kind == TOOL_START:
                    break
            for i in range(5):
                assert (await neighbour.prompt(f"q{i}")).text == f"answer {i}"
            pause.touch()

        with trio.fail_after(120), rt.subscribe("a1") as sub:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(neighbour_turns, sub)
                await agent.prompt("go")
        results = [m for m in (await agent.state()).messages if m.role == "tool"]
    clipped = results[0].content
    assert not results[0].is_error and clipped.startswith("xxxx")
    note = re.search(
        r"\n\[clipped: the MCP server's reply to tools/call was ([\d,]+) bytes, past the cap of "
        r"16,777,216 bytes \(max_message_bytes\); only its start is shown\]$",
        clipped,
    )
    assert note is not None and 100 * MB < int(note[1].replace(",", "")) < 100 * MB + 200
    assert len(clipped.encode()) <= 256 * 1024  # within max_result_bytes, the note kept
    assert results[1].content.startswith("after from")  # the server is still usable
    [event] = [e for e in logged if e.kind == MCP_MESSAGE_CLIPPED]
    assert event.data["server"] == "hostile" and event.data["cap"] == 16 * MB
    assert (
        event.data["bytes"] == int(note[1].replace(",", ""))
        and event.data["message"] == "a reply to tools/call, clipped"
    )


def test_the_message_cap_is_checked() -> None:
    with pytest.raises(cmdc.ConfigError, match="max_message_bytes"):
        hostile(max_message_bytes=10)
    with pytest.raises(cmdc.ConfigError, match="restarts"):
        hostile(restarts=3)
    with pytest.raises(cmdc.ConfigError, match=r"Restarts\.backoff"):
        cmdc.mcp.Restarts(backoff=-1)


# -- processes ------------------------------------------------------------------------------------------


async def test_no_process_a_server_started_outlives_the_runtime(tmp_path: Path) -> None:
    """The server starts a child in its process group and a grandchild that calls setsid; all
    three are gone when the runtime closes (a server that exits when its stdin closes, too)."""
    pids_file = tmp_path / "pids"
    before = marked()
    async with cmdc.open_runtime(log_events=False) as rt:
        await rt.spawn("a1", ScriptedProvider([]), tools=[hostile("--pids", str(pids_file))])
        with trio.fail_after(20):
            while not pids_file.exists():  # noqa: ASYNC110  # polled: written by another process
                await trio.sleep(0.01)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert len(pids) == 3 and all(alive(p) for p in pids)
        assert len(marked()) == len(before) + 2  # the child and the setsid grandchild
        assert os.getsid(pids[2]) != os.getsid(pids[0])  # it left the server's session
    assert not any(alive(p) for p in pids)
    assert marked() == before


async def test_a_server_that_dies_takes_its_processes_with_it(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    provider = ScriptedProvider([call("die", {}), "done"])
    async with cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", provider, tools=[hostile("--pids", str(pids_file), restarts=None)])
        pids = [int(p) for p in pids_file.read_text().split()]
        await agent.prompt("go")
        with trio.fail_after(20):
            while any(alive(p) for p in pids):  # noqa: ASYNC110  # polled: other processes
                await trio.sleep(0.01)


# -- restarts ---------------------------------------------------------------------------------------------


async def test_a_dead_server_is_restarted_with_an_event(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    logged: list[Any] = []
    monkeypatch.setattr(cmdc.mcp, "logging_enabled", lambda: True)
    monkeypatch.setattr(cmdc.mcp, "log_event", logged.append)
    server = hostile("--starts", str(tmp_path / "starts"), restarts=cmdc.mcp.Restarts(backoff=0.05))
    provider = ScriptedProvider(
        [call("echo", {"text": "one"}), call("die", {}), "died", call("echo", {"text": "two"}), "ok"]
    )
    async with cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", provider, tools=[server])
        assert (await agent.prompt("go")).text == "died"
        [live] = rt._agents["a1"].toolsets
        with trio.fail_after(20):
            while live.error is not None or (tmp_path / "starts").read_text() != "2":  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert (await agent.prompt("again")).text == "ok"
        results = [m for m in (await agent.state()).messages if m.role == "tool"]
    first, died, second = results
    assert first.content.split(" from ")[0] == "one" and second.content.split(" from ")[0] == "two"
    assert first.content.split(" from ")[1] != second.content.split(" from ")[1]  # a new process
    assert died.is_error and "is not running" in died.content
    [restart] = [e for e in logged if e.kind == MCP_SERVER_RESTART]
    assert restart.data["server"] == "hostile" and restart.data["restarts"] == 1 and restart.data["delay"] == 0.05
    assert "it exited with status 3" in restart.data["error"]


async def test_a_server_that_keeps_dying_is_given_up_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    logged: list[Any] = []
    monkeypatch.setattr(cmdc.mcp, "logging_enabled", lambda: True)
    monkeypatch.setattr(cmdc.mcp, "log_event", logged.append)
    starts = tmp_path / "starts"
    policy = cmdc.mcp.Restarts(max_restarts=3, backoff=0.01, max_backoff=0.02)
    server = hostile("--starts", str(starts), "--die-after-start", "1", restarts=policy)
    provider = ScriptedProvider([call("die", {}), "died", call("echo", {"text": "x"}), "ok"])
    async with cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", provider, tools=[server])
        await agent.prompt("go")
        with trio.fail_after(30):
            while not any(e.kind == MCP_SERVER_GAVE_UP for e in logged):  # noqa: ASYNC110
                await trio.sleep(0.01)
        await agent.prompt("again")
        results = [m for m in (await agent.state()).messages if m.role == "tool"]
    assert [e.data["delay"] for e in logged if e.kind == MCP_SERVER_RESTART] == [0.01, 0.02, 0.02]
    [gave_up] = [e for e in logged if e.kind == MCP_SERVER_GAVE_UP]
    assert gave_up.data["restarts"] == 3 and "did not start" in gave_up.data["error"]
    assert starts.read_text() == "4"  # the first start and three restarts
    assert results[1].is_error and "not restarted again after 3 restarts in a row" in results[1].content


RUNTIME = """
import sys, trio, cmdc, cmdc.mcp
from cmdc.providers import ScriptedProvider

async def main():
    server = cmdc.mcp.stdio(sys.executable, sys.argv[1], "--pids", sys.argv[2], name="hostile")
    async with cmdc.open_runtime(log_events=False) as rt:
        await rt.spawn("a1", ScriptedProvider([]), tools=[server])
        print("ready", flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


async def test_a_killed_runtime_takes_its_servers_processes_with_it(tmp_path: Path) -> None:
    """The runtime's process is SIGKILLed (no clean-up of its own runs): the kernel closes the
    lifeline's write end, and the reaper ends the server, its child and its setsid grandchild."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the subreaper (PR_SET_CHILD_SUBREAPER) is Linux's")
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": ROOT}
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", RUNTIME, HOSTILE, str(pids_file)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert process.stdout is not None
        with trio.fail_after(30):
            assert (await process.stdout.receive_some(64)).startswith(b"ready")
        pids = [int(p) for p in pids_file.read_text().split()]
        assert all(alive(p) for p in pids)
    finally:
        process.kill()
        await process.wait()
    with trio.fail_after(20):
        while any(alive(p) for p in pids):  # noqa: ASYNC110  # polled: other processes
            await trio.sleep(0.01)


async def test_a_server_outlives_the_worker_thread_that_started_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """trio starts a process from a worker thread, and an idle worker thread ends (after ten
    seconds; here a fifth of one). The server must not end with it: before the lifeline, the
    reaper asked the kernel for a signal when its parent *thread* ended (PR_SET_PDEATHSIG), and
    every stdio server died ten seconds after its start."""
    import trio._core._thread_cache as thread_cache

    monkeypatch.setattr(thread_cache, "IDLE_TIMEOUT", 0.2)
    pids_file = tmp_path / "pids"
    provider = ScriptedProvider([call("echo", {"text": "still here"}), "done"])
    async with cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", provider, tools=[hostile("--pids", str(pids_file))])
        pids = [int(p) for p in pids_file.read_text().split()]
        await trio.sleep(1.5)  # every worker thread idle since the start has ended
        assert all(alive(p) for p in pids)
        await agent.prompt("go")
        [result] = [m for m in (await agent.state()).messages if m.role == "tool"]
    assert not result.is_error and "still here" in result.content
    with trio.fail_after(20):
        while any(alive(p) for p in pids):  # noqa: ASYNC110  # polled: other processes
            await trio.sleep(0.01)


async def test_a_forked_child_does_not_hold_a_servers_lifeline() -> None:
    """A child forked from cmdc's process (multiprocessing's fork) closes the lifelines' write
    ends at once: held there, they would keep the servers alive after cmdc itself died."""
    from cmdc.mcp import _transport

    async with cmdc.open_runtime(log_events=False) as rt:
        await rt.spawn("a1", ScriptedProvider([]), tools=[hostile()])
        [keep] = list(_transport._LIFELINES)
        pid = os.fork()
        if pid == 0:  # the child: its copy of the write end must be closed
            try:
                os.fstat(keep)
            except OSError:
                os._exit(0)
            os._exit(1)
        _, status = await trio.to_thread.run_sync(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        os.fstat(keep)  # the parent's own is open
    assert not _transport._LIFELINES


def test_the_stall_benchmark_prints_its_figures() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.mcp_stall", "--mb", "1", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 0, done.stderr
    header, _, row = done.stdout.splitlines()
    assert header.startswith("reader: cmdc stdio transport; idle (the machine's own noise): longest stall")
    assert row.split()[0] == "1" and 200_000 < int(row.split()[-1].replace(",", "")) <= 256 * 1024  # clipped
