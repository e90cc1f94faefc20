"""cmdc.mcp: tools from MCP servers, against real servers.

An in-process `MCPServer` (the SDK's FastMCP), `mcp-server-time` from PyPI (a Python child
process), and `@modelcontextprotocol/server-everything` and `server-filesystem` from npm (node
child processes, over stdio and streamable HTTP). The npm servers are installed by
`python -m tests._support.mcp_servers fetch`; without them these tests skip, unless
`CMDC_REQUIRE_MCP=1` (as in CI), which makes a missing server a failure.

Everything here runs under trio (pytest-trio): the SDK's anyio code on trio's event loop.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

import cmdc
import cmdc.mcp
from cmdc import Message
from cmdc.events import TOOL_START
from cmdc.providers import ScriptedProvider
from cmdc.tools import ToolSet
from tests._support import mcp_servers

call = ScriptedProvider.tool_call


def _required() -> bool:
    return os.environ.get("CMDC_REQUIRE_MCP", "") not in ("", "0")


@pytest.fixture
def npm_bin() -> Iterator[Any]:
    """The path of an installed npm server's bin script (skip, or fail in CI, when missing)."""
    if not mcp_servers.installed():
        how = f"the npm MCP servers are not installed: run `{mcp_servers.FETCH_COMMAND}`"
        if _required():
            pytest.fail("CMDC_REQUIRE_MCP is set but " + how)
        pytest.skip(how)
    yield lambda name: str(mcp_servers.bin_path(name))


def time_server() -> cmdc.mcp.MCPTools:
    if _required():
        import mcp_server_time  # noqa: F401  # in CI a missing package fails here, not skips
    else:
        pytest.importorskip("mcp_server_time", reason="pip install mcp-server-time (in the dev extra)")
    return cmdc.mcp.stdio(sys.executable, "-m", "mcp_server_time", "--local-timezone", "Etc/UTC", name="time")


def child_pids(marker: str) -> list[int]:
    """This process's children whose command line contains `marker`.

    Found by scanning every process's parent pid: `/proc/self/task/*/children` races with
    threads that end while it is read and is missing on kernels built without it.
    """
    me = os.getpid()
    pids: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and marker in cmdline:
            pids.append(int(entry.name))
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def eventually(condition: Callable[[], bool], seconds: float = 10) -> None:
    with trio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110  # polled: nothing to wait on
            await trio.sleep(0.01)


async def run(
    tools: Sequence[Any], script: Sequence[Any], prompt: str = "go", **options: Any
) -> tuple[list[Message], ScriptedProvider]:
    """One agent turn on a scripted model with `tools`: the tool results, and the provider."""
    provider = ScriptedProvider(list(script))
    async with cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", provider, tools=tools, **options)
        await agent.prompt(prompt)
        state = await agent.state()
    return [m for m in state.messages if m.role == "tool"], provider


# -- an in-process server (the SDK's FastMCP) ------------------------------------------------------


def demo_server() -> MCPServer:
    server = MCPServer("demo")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def shout(text: str, times: int = 1) -> str:
        """Upper-case a text."""
        if times > 3:
            raise ToolError("times must be at most 3")
        if not text:
            raise ValueError("an unexpected failure")
        return " ".join([text.upper()] * times)

    @server.tool()
    def big(size: int) -> str:
        """A long text."""
        return "x" * size

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add a tool called `late` and announce the change."""

        def late() -> str:
            """A tool that came later."""
            return "late result"

        server.add_tool(late)
        await ctx.notify_tools_changed()
        return "grown"

    return server


async def test_in_process_tools_are_listed_validated_and_called() -> None:
    results, provider = await run(
        [cmdc.mcp.in_process(demo_server())],
        [
            call("add", {"a": 2, "b": 40}),
            call("shout", {"text": "hi", "times": 2}),
            call("shout", {"text": "hi", "times": 9}),  # the tool raises: the model reads why
            call("shout", {"text": ""}),  # an unexpected error: the server says only that
            call("add", {"a": "two"}),  # invalid: refused before the server sees it
            call("nope", {}),
            "done",
        ],
    )
    schemas = {s.name: s for s in provider.requests[0].tools}
    assert set(schemas) == {"add", "shout", "big", "grow"}
    assert schemas["add"].description == "Add two integers."
    add = schemas["add"].parameters
    assert add["type"] == "object" and list(add["required"]) == ["a", "b"]
    assert add["properties"]["a"]["type"] == "integer"
    assert [(r.content, r.is_error) for r in results[:2]] == [("42", False), ("HI HI", False)]
    assert results[2].is_error and "times must be at most 3" in results[2].content
    assert results[3].is_error and "Error executing tool shout" in results[3].content
    assert results[4].is_error and "invalid arguments for tool 'add'" in results[4].content
    assert 'missing required argument "b"' in results[4].content
    assert "arguments.a: expected integer" in results[4].content
    assert results[5].is_error and "unknown tool 'nope'" in results[5].content


async def test_list_changed_reaches_the_next_request() -> None:
    """A server that adds a tool and says so: the agent's next request offers it, and it runs."""
    provider = ScriptedProvider([call("grow", {}), "grown", call("late", {}), "done"])
    async with cmdc.open_runtime(log_events=False) as rt:
        ref = await rt.spawn("a1", provider, tools=[cmdc.mcp.in_process(demo_server())])
        await ref.prompt("grow")
        await eventually(lambda: "late" in rt._agents["a1"].tools)  # the re-listing runs beside the agent
        await ref.prompt("use it")
        state = await ref.state()
    assert "late" not in {s.name for s in provider.requests[0].tools}
    assert "late" in {s.name for s in provider.requests[2].tools}
    assert [m.content for m in state.messages if m.role == "tool"] == ["grown", "late result"]


async def test_tool_list_changes_are_logged_where_logging_is_on(monkeypatch: pytest.MonkeyPatch) -> None:
    logged: list[Any] = []
    monkeypatch.setattr(cmdc.mcp, "logging_enabled", lambda: True)
    monkeypatch.setattr(cmdc.mcp, "log_event", logged.append)
    async with cmdc.open_runtime(log_events=False) as rt:
        provider = ScriptedProvider([call("grow", {}), "done"])
        agent = await rt.spawn("a1", provider, tools=[cmdc.mcp.in_process(demo_server())])
        await agent.prompt("go")
        await eventually(lambda: any(e.kind == "mcp_tools_changed" for e in logged))
    [event] = [e for e in logged if e.kind == "mcp_tools_changed"]  # re-listed once
    assert event.agent_id == "mcp:demo" and event.data["tools"] == 5


async def test_a_large_result_is_clipped() -> None:
    server = cmdc.mcp.in_process(demo_server(), max_result_bytes=2000)
    results, _ = await run([server], [call("big", {"size": 100_000}), "done"])
    text = results[0].content
    assert len(text.encode()) <= 2000 and "bytes clipped of the MCP tool's result" in text
    assert text.startswith("xxx") and text.endswith("xxx")


async def test_names_are_made_safe_and_prefixed_and_collisions_refused() -> None:
    server = MCPServer("odd")

    @server.tool(name="files.read/v2")
    def read() -> str:
        return "ok"

    results, provider = await run([cmdc.mcp.in_process(server, prefix="odd_")], [call("odd_files_read_v2"), "done"])
    assert [s.name for s in provider.requests[0].tools] == ["odd_files_read_v2"]
    assert results[0].content == "ok"

    @cmdc.tool
    async def add(a: int, b: int) -> int:
        """Mine."""
        return a - b

    async with cmdc.open_runtime(log_events=False) as rt:
        with pytest.raises(cmdc.ConfigError, match=r"two tools are named 'add'.*prefix"):
            await rt.spawn("a1", ScriptedProvider([]), tools=[add, cmdc.mcp.in_process(demo_server())])
        # with a prefix both live side by side
        await rt.spawn("a2", ScriptedProvider([]), tools=[add, cmdc.mcp.in_process(demo_server(), prefix="m_")])


def test_hostile_configuration_is_refused() -> None:
    with pytest.raises(cmdc.ConfigError):
        cmdc.mcp.stdio("")
    with pytest.raises(cmdc.ConfigError):
        cmdc.mcp.stdio("node", 3)  # type: ignore[arg-type]
    with pytest.raises(cmdc.ConfigError):
        cmdc.mcp.http("file:///etc/passwd")
    with pytest.raises(cmdc.ConfigError):
        cmdc.mcp.in_process(object())  # type: ignore[arg-type]
    with pytest.raises(cmdc.ConfigError, match="prefix"):
        cmdc.mcp.stdio("node", prefix="a b")
    with pytest.raises(cmdc.ConfigError, match="timeout"):
        cmdc.mcp.stdio("node", timeout=0)
    with pytest.raises(cmdc.ConfigError, match="connect_timeout"):
        cmdc.mcp.stdio("node", connect_timeout=float("nan"))


async def test_hostile_listing_is_bounded() -> None:
    """Absurd names, a huge schema, a huge description: made safe, dropped or clipped."""
    server = MCPServer("hostile")

    @server.tool(name="x" * 100, description="d" * 100_000)
    def long_name() -> str:
        return "ok"

    def wide(**kwargs: Any) -> str:
        return "never"

    server.add_tool(long_name, name="a" * 30)
    async with cmdc.open_runtime(log_events=False) as rt:
        await rt.spawn("a1", ScriptedProvider([]), tools=[cmdc.mcp.in_process(server)])
        tools = rt._agents["a1"].tools
    assert sorted(len(n) for n in tools) == [30, 64]
    assert all(len(t.description.encode()) <= cmdc.mcp.MAX_DESCRIPTION_BYTES for t in tools.values())


# -- servers as child processes ---------------------------------------------------------------------


async def test_time_server_from_pypi() -> None:
    results, provider = await run(
        [time_server()],
        [
            call("get_current_time", {"timezone": "Europe/London"}),
            call("convert_time", {"source_timezone": "Etc/UTC"}),
            "x",
        ],
    )
    assert {"get_current_time", "convert_time"} <= {s.name for s in provider.requests[0].tools}
    assert not results[0].is_error and '"timezone": "Europe/London"' in results[0].content
    # a missing argument is caught by the schema the server published
    assert results[1].is_error and 'missing required argument "time"' in results[1].content


async def test_everything_server(npm_bin: Any) -> None:
    results, provider = await run(
        [cmdc.mcp.stdio(npm_bin("mcp-server-everything"))],
        [
            call("echo", {"message": "hello"}),
            call("get-sum", {"a": 2, "b": 3.5}),
            call("get-tiny-image", {}),
            call("get-sum", {"a": "2"}),
            "done",
        ],
    )
    offered = {s.name: s for s in provider.requests[0].tools}
    assert {"echo", "get-sum", "get-tiny-image", "trigger-long-running-operation"} <= set(offered)
    assert offered["get-sum"].parameters["properties"]["a"]["type"] == "number"
    assert results[0].content == "Echo: hello"
    assert results[1].content == "The sum of 2 and 3.5 is 5.5."
    image = results[2].content
    assert "[image: image/png" in image and "not shown]" in image and len(image) < 500  # no base64 pasted
    assert results[3].is_error and "arguments.a: expected number" in results[3].content


async def test_a_real_servers_list_changed_is_followed(npm_bin: Any) -> None:
    """server-everything registers more tools once the client is initialized and sends
    `notifications/tools/list_changed` (the handshake-era path): the listing is fetched again."""
    async with cmdc.open_runtime(log_events=False) as rt:
        await rt.spawn("a1", ScriptedProvider([]), tools=[cmdc.mcp.stdio(npm_bin("mcp-server-everything"))])
        [live] = rt._agents["a1"].toolsets
        await eventually(lambda: live.version >= 2)
        assert "simulate-research-query" in rt._agents["a1"].tools


async def test_filesystem_server(npm_bin: Any, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the key is 42\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("secret")
    results, _ = await run(
        [cmdc.mcp.stdio(npm_bin("mcp-server-filesystem"), str(tmp_path), name="fs", prefix="fs_")],
        [
            call("fs_read_text_file", {"path": str(tmp_path / "notes.txt")}),
            call("fs_write_file", {"path": str(tmp_path / "out.txt"), "content": "written"}),
            call("fs_list_directory", {"path": str(tmp_path)}),
            call("fs_read_text_file", {"path": str(outside)}),
            "done",
        ],
    )
    assert results[0].content == "the key is 42\n"
    assert not results[1].is_error and (tmp_path / "out.txt").read_text() == "written"
    assert "[FILE] notes.txt" in results[2].content and "[FILE] out.txt" in results[2].content
    assert results[3].is_error and "secret" not in results[3].content and "denied" in results[3].content.lower()


async def test_server_processes_end_with_the_runtime(npm_bin: Any) -> None:
    """Started with the runtime (once, shared by two agents), gone when it closes: no orphans."""
    everything = cmdc.mcp.stdio(npm_bin("mcp-server-everything"))
    async with cmdc.open_runtime(log_events=False) as rt:
        await rt.spawn("a1", ScriptedProvider(["x"]), tools=[everything, time_server()])
        await rt.spawn("a2", ScriptedProvider(["x"]), tools=[everything])
        pids = child_pids("mcp-server-everything") + child_pids("mcp_server_time")
        assert len(pids) == 2 and all(alive(p) for p in pids)
    assert not any(alive(p) for p in pids)
    assert child_pids("mcp-server-everything") == child_pids("mcp_server_time") == []


async def test_a_cancelled_runtime_still_stops_its_servers(npm_bin: Any) -> None:
    """The runtime's block is cancelled while a call is in the server's hands: the server is
    still stopped and reaped."""
    everything = cmdc.mcp.stdio(npm_bin("mcp-server-everything"))
    provider = ScriptedProvider([call("trigger-long-running-operation", {"duration": 30, "steps": 30}), "done"])
    pids: list[int] = []
    with trio.CancelScope() as scope:
        async with cmdc.open_runtime(log_events=False) as rt:
            agent = await rt.spawn("a1", provider, tools=[everything])
            pids = child_pids("mcp-server-everything")

            async def cancel_mid_call(sub: Any) -> None:
                async for event in sub:
                    if event.kind == TOOL_START:
                        await trio.sleep(0.3)
                        scope.cancel()

            with rt.subscribe("a1") as sub:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel_mid_call, sub)
                    await agent.prompt("go")
    assert scope.cancelled_caught
    assert len(pids) == 1 and not alive(pids[0])


async def test_server_killed_mid_call_gives_a_readable_error(npm_bin: Any) -> None:
    """The server dies while a call is in flight: that call and the next are errors the model
    reads, the agent keeps serving, and its other tools still work (not restarted here: see
    tests/providers/test_mcp_bounds.py for restarts)."""
    everything = cmdc.mcp.stdio(npm_bin("mcp-server-everything"), restarts=None)
    provider = ScriptedProvider(
        [
            call("trigger-long-running-operation", {"duration": 30, "steps": 30}),
            call("echo", {"message": "again?"}),
            call("get_current_time", {"timezone": "Etc/UTC"}),
            "still here",
            "and on",
        ]
    )
    async with cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", provider, tools=[everything, time_server()])
        [pid] = child_pids("mcp-server-everything")

        async def killer(sub: Any) -> None:
            async for event in sub:
                if event.kind == TOOL_START:
                    await trio.sleep(0.5)  # the call is in the server's hands
                    os.kill(pid, signal.SIGKILL)
                    return

        with rt.subscribe("a1") as sub, trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(killer, sub)
                reply = await agent.prompt("go")
        assert reply.text == "still here"
        state = await agent.state()
        results = [m for m in state.messages if m.role == "tool"]
        gone = "MCPServerError: MCP server 'mcp-server-everything' is not running: its connection closed"
        assert results[0].is_error and gone in results[0].content
        assert results[1].is_error and gone in results[1].content
        assert "Starting default (STDIO) server" in results[1].content  # the end of its stderr
        assert not results[2].is_error and "Etc/UTC" in results[2].content
        assert (await agent.prompt("and now?")).text == "and on"


async def test_a_slow_call_times_out_and_the_server_stays_usable(npm_bin: Any) -> None:
    results, _ = await run(
        [cmdc.mcp.stdio(npm_bin("mcp-server-everything"))],
        [
            call("trigger-long-running-operation", {"duration": 20, "steps": 20}),
            call("echo", {"message": "after"}),
            "done",
        ],
        tool_timeout=0.5,
    )
    assert results[0].is_error and "timed out after 0.5 s" in results[0].content
    assert results[1].content == "Echo: after"


async def test_a_server_that_cannot_start_fails_the_spawn(tmp_path: Path) -> None:
    crash = tmp_path / "crash.py"
    crash.write_text("import sys\nprint('no config file given', file=sys.stderr)\nsys.exit(3)\n")
    silent = tmp_path / "silent.py"
    silent.write_text("import time\ntime.sleep(60)\n")
    async with cmdc.open_runtime(log_events=False) as rt:
        with pytest.raises(cmdc.mcp.MCPServerError, match=r"did not start.*no config file given"):
            await rt.spawn("a1", ScriptedProvider([]), tools=[cmdc.mcp.stdio(sys.executable, str(crash))])
        with pytest.raises(cmdc.mcp.MCPServerError, match="did not start"):
            await rt.spawn("a2", ScriptedProvider([]), tools=[cmdc.mcp.stdio(str(tmp_path / "missing"))])
        with pytest.raises(cmdc.mcp.MCPServerError, match=r"no answer within 1\.0 s"):
            slow = cmdc.mcp.stdio(sys.executable, str(silent), connect_timeout=1.0)
            await rt.spawn("a3", ScriptedProvider([]), tools=[slow])
        assert rt.agents == []
        # the runtime is unharmed: a good agent still starts
        await rt.spawn("ok", ScriptedProvider([]), tools=[cmdc.mcp.in_process(demo_server())])
    assert child_pids(str(silent)) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_streamable_http(npm_bin: Any) -> None:
    port = _free_port()
    process = await trio.lowlevel.open_process(
        [npm_bin("mcp-server-everything"), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(20):
            while True:
                try:
                    await trio.open_tcp_stream("127.0.0.1", port)
                    break
                except OSError:
                    await trio.sleep(0.05)
        results, _ = await run(
            [cmdc.mcp.http(f"http://127.0.0.1:{port}/mcp", headers={"X-Test": "1"})],
            [call("echo", {"message": "over http"}), "done"],
        )
        assert results[0].content == "Echo: over http"
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


async def test_tool_set_changes_are_seen_without_rebuilding_every_request() -> None:
    """The agent's view is rebuilt when a tool set's version moves, not per request."""
    async with cmdc.open_runtime(log_events=False) as rt:
        await rt.spawn("a1", ScriptedProvider([]), tools=[cmdc.mcp.in_process(demo_server())])
        agent = rt._agents["a1"]
        first = agent.tools
        assert agent.tools is first
        [live] = agent.toolsets
        assert isinstance(live, ToolSet)
        live.replace([t for t in live.tools.values() if t.name != "big"])
        assert "big" not in agent.tools and "big" not in {s.name for s in agent.tool_schemas}
