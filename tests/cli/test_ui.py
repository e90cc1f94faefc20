"""The local web page (cmdc.ui) over HTTP: its guard (token, Host, Origin, read-only), what it
shows, escaping of hostile text, bounded responses, live updates; `cmdc ui` on a store.
The real-browser tests are in test_ui_browser.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

import cmdc
from cmdc import ConfigError, Message, OffloadStore, State
from cmdc.providers import ExtractiveSummarizer, ScriptedProvider, SimulatedModel
from cmdc.store import FileStore
from cmdc.tracing import UNTRACED
from cmdc.ui import serve_store
from cmdc.ui.data import AgentRow, Recorder, Watcher
from cmdc.ui.pages import agents_page

pytest.importorskip("starlette")
pytest.importorskip("hypercorn")

HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"> & "quotes"'


def client(server: Any) -> httpx.AsyncClient:
    base = f"http://127.0.0.1:{server.port}"
    return httpx.AsyncClient(base_url=base, cookies={f"cmdc-ui-{server.port}": server.token}, timeout=20)


def small_config(tmp_path: Path, trigger: int = 600) -> dict[str, Any]:
    return {
        "compact_trigger": ("tokens", trigger),
        "compact_keep": ("messages", 2),
        "compact_offload_dir": str(tmp_path),
    }


async def test_token_cookie_and_redirect(tmp_path: Path) -> None:
    async with cmdc.open_runtime(ui=True, log_events=False) as rt:
        server = rt.ui
        assert server.url.startswith(f"http://127.0.0.1:{server.port}/?token=")
        base = f"http://127.0.0.1:{server.port}"
        async with httpx.AsyncClient(base_url=base) as c:
            assert (await c.get("/")).status_code == 403  # no token
            assert (await c.get("/?token=wrong")).status_code == 403
            first = await c.get(f"/agent/x?token={server.token}&a=1")
            assert first.status_code == 303
            assert first.headers["location"] == "/agent/x?a=1"  # the token leaves the URL
            assert "HttpOnly" in first.headers["set-cookie"] and "SameSite=Strict" in first.headers["set-cookie"]
            page = await c.get("/")  # the cookie set by the first request
            assert page.status_code == 200 and "Agents" in page.text
            assert "script-src 'self'" in page.headers["content-security-policy"]
            assert page.headers["x-frame-options"] == "DENY"


async def test_host_and_origin_checked(tmp_path: Path) -> None:
    async with cmdc.open_runtime(ui=True, log_events=False) as rt, client(rt.ui) as c:
        # DNS rebinding: the page of evil.example resolved to 127.0.0.1 sends its own Host
        assert (await c.get("/", headers={"host": f"evil.example:{rt.ui.port}"})).status_code == 421
        assert (await c.get("/", headers={"origin": "http://evil.example"})).status_code == 403
        assert (await c.get("/", headers={"origin": f"http://127.0.0.1:{rt.ui.port}"})).status_code == 200
        assert (await c.get("/", headers={"host": f"localhost:{rt.ui.port}"})).status_code == 200
        # a POST must say where it comes from (a cross-site form would say another origin)
        assert (await c.post("/agent/a1/compact")).status_code == 403


async def test_read_only_unless_writable(tmp_path: Path) -> None:
    model = SimulatedModel(seed=3)
    async with cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", model, config=small_config(tmp_path, 100_000))
        for i in range(4):
            await agent.prompt(f"turn {i} " + "words " * 80)
        ro = await rt.serve_ui()
        rw = await rt.serve_ui(writable=True)
        async with client(ro) as c:
            page = (await c.get("/agent/a1")).text
            assert "compact now" not in page
            refused = await c.post("/agent/a1/compact", headers={"origin": f"http://127.0.0.1:{ro.port}"})
            assert refused.status_code == 403
        assert (await agent.state()).compactions == 0
        async with client(rw) as c:
            assert "compact now" in (await c.get("/agent/a1")).text
            done = await c.post("/agent/a1/compact", headers={"origin": f"http://127.0.0.1:{rw.port}"})
            assert done.status_code == 303
        assert (await agent.state()).compactions == 1


async def test_hostile_replies_are_text(tmp_path: Path) -> None:
    """A model reply, a tool result and a user message holding markup render as text."""

    @cmdc.tool
    async def fetch(url: str) -> str:
        """Fetch a page."""
        return HOSTILE

    replies = [
        ScriptedProvider.tool_call("fetch", {"url": HOSTILE}, text=HOSTILE),
        HOSTILE,
        HOSTILE + " again " + "padding " * 200,
    ]
    async with cmdc.open_runtime(ui=True, log_events=False) as rt:
        agent = await rt.spawn(
            "a1",
            ScriptedProvider(replies, cycle=True),
            tools=[fetch],
            config=small_config(tmp_path, 400),
            summarizer=ExtractiveSummarizer(),
        )
        await agent.prompt(HOSTILE)
        await agent.prompt("more " + HOSTILE + " words " * 150)
        assert (await agent.state()).compactions >= 1
        async with client(rt.ui) as c:
            pages = [
                (await c.get("/agent/a1")).text,
                (await c.get("/agent/a1/journal")).text,
                (await c.get("/agent/a1/journal", params={"q": "quotes"})).text,
            ]
    for page in pages:
        assert "<script>window" not in page and "<img src=x" not in page
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page
        assert "onerror=&quot;window.__pwned=2&quot;" in page
        assert page.count("<script") == 1  # only the page's own script file


class Untraced:
    """A tracer that records nothing (tracing on, as far as the runtime knows)."""

    def turn(self, *args: Any) -> Any:
        return UNTRACED

    request = tool = compaction = turn

    def event(self, event: Any) -> None:
        return None


async def test_agents_page_and_agent_page(tmp_path: Path) -> None:
    async with cmdc.open_runtime(ui=True, log_events=False, tracing=Untraced()) as rt:
        # ~500-token prompts: a trigger of 600 would be all summary budget (the thrash guard stops it)
        config = small_config(tmp_path, 1_500)
        agents = [await rt.spawn(f"w{i}", SimulatedModel(seed=i), config=config) for i in range(3)]
        for turn in range(8):
            for a in agents:
                await a.prompt(f"turn {turn}: the parser fails on nested lists " + "detail " * 60)
        await trio.sleep(0.2)  # the page's event recorder takes the bus's events in batches
        async with client(rt.ui) as c:
            home = (await c.get("/")).text
            rows = (await c.get("/api/agents")).json()
            page = (await c.get("/agent/w0")).text
    for i in range(3):
        assert f'id="a-w{i}"' in home
    by_name = {r["name"]: r for r in rows}
    assert by_name["w0"]["state"] == "idle"
    assert by_name["w0"]["trigger"] == 1_500
    assert by_name["w0"]["auto"] >= 1 and by_name["w0"]["compactions"] == by_name["w0"]["auto"]
    assert '<svg id="timeline"' in page and 'class="compaction c-auto"' in page
    assert re.search(r'href="/agent/w0/journal\?first=\d+&amp;last=\d+">replaced journal records \d+-\d+', page)
    assert 'class="badge b-summary"' in page  # the summary marked
    assert "model request" in page and "<b>turn</b>" in page  # the span tree of the last turns


async def test_states_deactivated_and_failed(tmp_path: Path) -> None:
    async with cmdc.open_runtime(ui=True, log_events=False, store=str(tmp_path / "s"), max_resident=10) as rt:
        sleeper = await rt.spawn("sleeper", SimulatedModel(seed=1), config=small_config(tmp_path))
        await sleeper.prompt("hello")
        crasher = await rt.spawn(
            "crasher", ScriptedProvider([RuntimeError("boom")]), config=small_config(tmp_path), restart="temporary"
        )
        with pytest.raises(RuntimeError, match="boom"):
            await crasher.prompt("hello")
        assert await rt.deactivate("sleeper")
        with trio.fail_after(10):
            while crasher.running:  # noqa: ASYNC110 (its task ends after the failed turn)
                await trio.sleep(0.01)
        await trio.sleep(0.2)  # the recorder's next batch
        async with client(rt.ui) as c:
            rows = {r["name"]: r for r in (await c.get("/api/agents")).json()}
            page = (await c.get("/agent/sleeper")).text  # a deactivated agent: its checkpoint
    assert rows["sleeper"]["state"] == "deactivated"
    assert rows["crasher"]["state"] == "failed"
    assert "hello" in page and "st-deactivated" in page
    assert rt.whereis("sleeper") is not None


async def test_summary_link_reads_its_range(tmp_path: Path) -> None:
    async with cmdc.open_runtime(ui=True, log_events=False) as rt:
        agent = await rt.spawn("a1", SimulatedModel(seed=1), config=small_config(tmp_path))
        for turn in range(6):
            await agent.prompt(f"turn {turn} about the cache " + "words " * 60)
        state = await agent.state()
        summary = next(m for m in state.messages if m.is_summary)
        first, last = summary.metadata["cmdc.first_seq"], summary.metadata["cmdc.last_seq"]
        async with client(rt.ui) as c:
            page = (await c.get("/agent/a1/journal", params={"first": first, "last": last})).text
            bad = await c.get("/agent/a1/journal", params={"first": "x"})
            unknown = await c.get("/agent/nobody")
            unsafe = await c.get("/agent/..%2Fetc")
    assert f"records {first}-{last}" in page
    assert page.count('class="msg record') == last - first + 1
    assert bad.status_code == 400 and unknown.status_code == 404 and unsafe.status_code == 404


async def test_huge_record_is_clipped_with_a_raw_link(tmp_path: Path) -> None:
    journal = OffloadStore(tmp_path)
    huge = "x" * 50_000_000
    await journal.append("big", [Message.user("small one"), Message.tool_result("c1", huge)], compaction=1)
    async with trio.open_nursery() as nursery:
        servers = [await nursery.start(serve_store, str(tmp_path))]
        async with client(servers[0]) as c:
            page = await c.get("/agent/big/journal")
            raw = await c.get("/agent/big/raw", params={"seq": 2, "offset": 0})
            rest = await c.get("/agent/big/raw", params={"seq": 2, "offset": 49_500_000})
        nursery.cancel_scope.cancel()
    assert page.status_code == 200 and len(page.content) < 100_000
    assert "clipped: 49,996,000 more characters" in page.text and "/agent/big/raw?seq=2" in page.text
    assert len(raw.text) == 1_000_000 and 'rel="next"' in raw.headers["link"]
    assert raw.headers["content-type"].startswith("text/plain") and raw.headers["x-content-type-options"] == "nosniff"
    assert len(rest.text) == 500_000 and "link" not in rest.headers


async def _check_store_page(store: str, tmp_path: Path) -> None:
    async with cmdc.open_runtime(store=store, log_events=False) as rt:
        agent = await rt.spawn("keeper", SimulatedModel(seed=2), config=small_config(tmp_path))
        for turn in range(6):
            await agent.prompt(f"turn {turn}: remember the flamingo token " + "words " * 60)
        compactions = (await agent.state()).compactions
    assert compactions >= 1
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_store, store)
        async with client(server) as c:
            home = (await c.get("/")).text
            page = (await c.get("/agent/keeper")).text
            found = (await c.get("/agent/keeper/journal", params={"q": "flamingo"})).text
            ranged = (await c.get("/agent/keeper/journal", params={"first": 1, "last": 3})).text
            events = await c.get("/events")
            refused = await c.post("/agent/keeper/compact", headers={"origin": f"http://127.0.0.1:{server.port}"})
        nursery.cancel_scope.cancel()
    assert 'id="a-keeper"' in home and "stored" in home
    assert "replaced journal records" in page and "c-journal" in page
    assert "match flamingo" in found and 'class="msg record' in found
    assert ranged.count('class="msg record') == 3
    assert events.status_code == 404 and refused.status_code == 403


async def test_store_page_reads_checkpoints_and_journals(tmp_path: Path) -> None:
    await _check_store_page(str(tmp_path / "store"), tmp_path)


async def test_postgres_store_page(postgres_url: str, tmp_path: Path) -> None:
    await _check_store_page(postgres_url, tmp_path)


async def test_span_trees_while_tracing_or_while_the_agents_page_is_open(tmp_path: Path) -> None:
    async with cmdc.open_runtime(ui=True, log_events=False) as rt:
        agent = await rt.spawn("a1", SimulatedModel(seed=1), config=small_config(tmp_path))
        await agent.prompt("before the page")
        async with client(rt.ui) as c:
            closed = (await c.get("/agent/a1")).text
            async with c.stream("GET", "/events", params={"agent": "a1"}) as stream:
                lines = stream.aiter_lines()
                assert await lines.__anext__() == "retry: 2000"
                await agent.prompt("while the page is open")
                async for line in lines:
                    if line.startswith("data: "):
                        break
                opened = (await c.get("/agent/a1")).text
    assert "model request" not in closed and "recorded while tracing is on" in closed
    assert opened.count("<b>turn</b>") == 1 and "model request" in opened


async def test_live_updates_stream_changed_agents(tmp_path: Path) -> None:
    async with cmdc.open_runtime(ui=True, log_events=False) as rt:
        agent = await rt.spawn("a1", SimulatedModel(seed=1), config=small_config(tmp_path))
        got: list[str] = []
        async with client(rt.ui) as c, c.stream("GET", "/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = stream.aiter_lines()
            await agent.prompt("hello " * 20)
            async for line in lines:
                if line.startswith("data: "):
                    got.append(line)
                    break
    assert '"name":"a1"' in got[0] and '"state":' in got[0]


def test_watcher_coalesces_and_is_bounded() -> None:
    """A page that does not read holds one entry per agent changed, never the events."""

    async def main() -> None:
        w = Watcher(None, limit=100)
        for _ in range(10_000):
            w.mark("a1")
        assert w.changed == {"a1"}
        everything, changed = await w.wait()
        assert not everything and changed == {"a1"}
        for i in range(1_000):
            w.mark(f"a{i}")
        assert w.everything and not w.changed  # past its limit it asks for everything, holding nothing
        one = Watcher("a5")
        one.mark("a6")
        assert not one.changed

    trio.run(main)


def test_recorder_counts_compactions_by_reason() -> None:
    from cmdc import CompactionReport
    from cmdc.events import COMPACTION_END, COMPACTION_FAILED, Event

    def report(reason: str) -> CompactionReport:
        return CompactionReport(reason, 900, 300, 20, 5, 15, "/j", 1, 15, 1, 80, "s", 1, 0.1)

    r = Recorder()
    for reason in ("auto", "auto", "forced", "manual"):
        r.record(Event(COMPACTION_END, "a", {"report": report(reason)}))
    r.record(Event(COMPACTION_FAILED, "a", {"reason": "auto", "error": "boom"}))
    log = r.logs["a"]
    assert (log.auto, log.forced, log.manual, log.failed) == (2, 1, 1, 1)
    assert [p["kind"] for p in log.points] == ["compaction"] * 4 + ["failed"]


def test_row_json_has_every_field() -> None:
    row = AgentRow("a", "idle", 1, 2, 3, 4, 5, 6, 7, 8, 9.0)
    assert row.to_json() == attrs.asdict(row)


def test_thousand_rows_render() -> None:
    rows = [AgentRow(f"agent-{i}", "idle", i * 10, 5_000, 6_000, i % 3, i % 2, 0, 0, i % 5, 1e9) for i in range(1_000)]
    page = agents_page(rows, source="x", live=True, shown=5_000)
    assert page.count("<tr id=") == 1_000


async def test_ui_option_checked() -> None:
    with pytest.raises(ConfigError, match="ui must be True or a port"):
        async with cmdc.open_runtime(ui="yes"):  # type: ignore[arg-type]
            pass
    async with cmdc.open_runtime(log_events=False) as rt:
        with pytest.raises(ConfigError, match="port must be"):
            await rt.serve_ui(port=70_000)


def test_missing_extra_is_named() -> None:
    """`import cmdc` works without the ui extra; asking for the page names the extra."""
    code = (
        "import sys; sys.modules['starlette'] = None; sys.modules['hypercorn'] = None\n"
        "import trio, cmdc\n"
        "async def main():\n"
        "    try:\n"
        "        async with cmdc.open_runtime(ui=True): pass\n"
        "    except cmdc.ConfigError as e: print('ERR', e)\n"
        "trio.run(main)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    hint = "pip install 'cmdc-agents[ui]' (from a checkout: pip install -e '.[ui]')"
    assert f"ERR the web page needs the ui extra: {hint}" in out.stdout


def test_demo_ui_prints_its_url_and_ends_at_ctrl_c(tmp_path: Path) -> None:
    """`cmdc demo --ui` prints the page's URL, serves it while its agents work, and Ctrl-C
    ends it cleanly (130, no traceback), also in the middle of its turns."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmdc", "demo", "--ui", "--plain", "--agents", "2", "--turns", "400"],
        stdout=subprocess.DEVNULL,  # never read while the page is fetched: a full pipe would block the demo
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert proc.stderr is not None
        url = ""
        for line in proc.stderr:
            if line.startswith("web page: "):
                url = line.split(": ", 1)[1].strip()
                break
        assert re.match(r"http://127\.0\.0\.1:\d+/\?token=", url)
        with httpx.Client(follow_redirects=True, timeout=20) as c:
            page = c.get(url)
        assert page.status_code == 200 and "Agents" in page.text
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "cmdc: interrupted" in err


def test_cli_ui_serves_a_store(tmp_path: Path) -> None:
    async def fill() -> None:
        store = FileStore(tmp_path)
        await store.checkpoints.save(State(agent_id="c1", messages=(Message.user("hi " + HOSTILE),)))

    trio.run(fill)
    missing = subprocess.run(
        [sys.executable, "-m", "cmdc", "ui", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "is not a directory" in missing.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "cmdc", "ui", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split("open ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and "?token=" in url
        with httpx.Client(follow_redirects=True, timeout=20) as c:
            page = c.get(url)
            assert page.status_code == 200 and 'id="a-c1"' in page.text
            agent = c.get(url.split("/?")[0] + "/agent/c1")
            assert "&lt;script&gt;" in agent.text and "<script>window" not in agent.text
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert not os.path.exists(tmp_path / "nope")
