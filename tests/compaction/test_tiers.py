"""Issue 29: the cheap tiers before a summary (caps at arrival, masking), the thrash guard, the
compact_context tool and the rehydration plugin."""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cmdc
import cmdc.agent
from cmdc import (
    AgentOptions,
    CompactionThrashing,
    ConfigError,
    Message,
    OffloadStore,
    RehydrateReads,
    State,
    ToolCall,
    compact_context_tool,
    open_runtime,
    tool,
)
from cmdc.compaction import CompactConfig
from cmdc.compaction.tiers import (
    CAPPED_KEY,
    MASKED_KEY,
    apply_mask,
    cap_results,
    diagnose,
    placeholder,
    plan_mask,
)
from cmdc.message import KIND_KEY
from cmdc.offload import AppendResult
from cmdc.providers import ModelRequest, ScriptedProvider
from cmdc.recall import recall_tool
from cmdc.store.file.checkpoints import CheckpointStore
from cmdc.testing import RecordingSummarizer, drain
from cmdc.tokens import estimate_message_tokens

BIG = "".join(f"line {i}: ünïcode ✓ value={i * 7919 % 10007}\n" for i in range(4_000))  # ~160 KB


def cfg(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"compact_offload_dir": str(tmp_path / "j"), **extra}


def journal(tmp_path: Path) -> OffloadStore:
    return OffloadStore(tmp_path / "j")


# -- config ------------------------------------------------------------------------------------

BAD = [
    ("tool_result_limit", 0),
    ("tool_result_limit", "8k"),
    ("tool_result_limit", True),
    ("tool_result_limits", ["read"]),
    ("tool_result_limits", {"read": 0}),
    ("tool_result_limits", {"": 10}),
    ("tool_result_preview", 4),
    ("mask_tool_results", "yes"),
    ("mask_trigger", 0.0),
    ("mask_trigger", 1.5),
    ("mask_trigger", 1),
    ("mask_keep", -1),
    ("mask_keep", 2.5),
    ("mask_at_least", 0),
    ("mask_exclude", "read_file"),
    ("mask_exclude", ["ok", 3]),
    ("compact_thrash", 3),
    ("compact_thrash", (0, 3)),
    ("compact_thrash", (3, -1)),
    ("compact_min_gain", 0),
    ("mask_typo", 1),
    ("tool_result_limt", 1),
]


@pytest.mark.parametrize(("key", "value"), BAD)
def test_bad_values_raise_config_error_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        CompactConfig.from_mapping({key: value})


def test_good_values_and_defaults() -> None:
    tiers = CompactConfig.from_mapping({}).tiers
    assert tiers.tool_result_limit == 8_000 and tiers.mask_keep == 3 and tiers.mask_tool_results
    assert (
        tiers.limit_for("x", 170_000) == 8_000 and tiers.limit_for("x", 4_000) == 1_000
    )  # a quarter of a small trigger
    given_ = CompactConfig.from_mapping(
        {"tool_result_limit": 50_000, "tool_result_limits": {"grep": None, "cat": 100}, "mask_exclude": ["todo"]}
    ).tiers
    assert given_.limit_for("x", 4_000) == 50_000  # an explicit limit is used as given
    assert given_.limit_for("grep", 4_000) is None and given_.limit_for("cat", 4_000) == 100
    assert given_.mask_exclude == frozenset({"todo"})


# -- caps at arrival -----------------------------------------------------------------------------


def calls_then(*replies: Message | str) -> ScriptedProvider:
    return ScriptedProvider(list(replies))


async def test_a_huge_result_is_capped_journaled_first_and_read_back_by_recall(tmp_path: Path) -> None:
    @tool
    async def dump(path: str) -> str:
        """Dump a file."""
        return BIG

    call = ScriptedProvider.tool_call("dump", {"path": "big.log"}, id="c1")
    model = calls_then(call, "done")
    async with open_runtime(log_events=False) as rt:
        with rt.subscribe("a") as sub:
            agent = await rt.spawn("a", model, tools=[dump], config=cfg(tmp_path))
            assert (await agent.prompt("dump it")).text == "done"
            events = drain(sub)
        state = await agent.state()
    result = next(m for m in state.messages if m.role == "tool")
    meta = result.metadata[CAPPED_KEY]
    assert result.tool_call_id == "c1"  # the pair stays whole
    assert estimate_message_tokens(result) < 2_000 < estimate_message_tokens(Message.tool_result("c1", BIG))
    assert (
        f"journal record {meta['record']}" in result.text and "line 0:" in result.text and "line 3999:" in result.text
    )
    assert meta["bytes"] == len(BIG.encode())
    # the context that went to the model held the preview, not the result
    assert all(BIG not in m.text for m in model.requests[-1].messages)
    [record] = await journal(tmp_path).read_range("a", meta["record"], meta["record"])
    assert record.message.text == BIG and record.message.id == meta["from"]  # byte-exact
    capped = [e for e in events if e.kind == "tool_result_capped"]
    assert capped and capped[0].data["record"] == meta["record"] and capped[0].data["tool"] == "dump"

    recall = recall_tool(journal(tmp_path), "a")
    lines = await recall.run({"record": meta["record"], "line_start": 101, "line_end": 103})  # from 1
    assert "line 100:" in lines and "line 102:" in lines and "line 99:" not in lines and "line 103:" not in lines
    assert "lines 101-103 of 4000" in lines
    data = BIG.encode()
    part = await recall.run({"record": meta["record"], "byte_start": 10, "byte_end": 200})
    assert data[10:200].decode("utf-8", "ignore") in part
    long = await recall.run({"record": meta["record"], "line_start": 1})
    assert "continue with record=" in long and estimate_message_tokens(Message.user(long)) <= 2_100
    with pytest.raises(cmdc.tools.ToolArgumentsError, match="give record"):
        await recall.run({"line_start": 3})
    with pytest.raises(cmdc.tools.ToolArgumentsError, match="not both"):
        await recall.run({"record": 1, "line_start": 3, "byte_end": 9})


async def test_per_tool_limits_and_no_cap(tmp_path: Path) -> None:
    @tool
    async def small(n: int) -> str:
        """Some text."""
        return "x" * n

    script = [ScriptedProvider.tool_call("small", {"n": 4_000}, id="c1"), "ok"]
    for limits, capped in (({"small": None}, False), ({"small": 100}, True)):
        async with open_runtime(log_events=False) as rt:
            agent = await rt.spawn(
                "a", ScriptedProvider(list(script)), tools=[small], config=cfg(tmp_path, tool_result_limits=limits)
            )
            await agent.prompt("go")
            result = next(m for m in (await agent.state()).messages if m.role == "tool")
            assert (CAPPED_KEY in result.metadata) is capped


ROOT = str(Path(__file__).resolve().parents[2])
KILLER = """
import os, signal, sys, trio
import cmdc
from cmdc.offload import OffloadStore

original = OffloadStore.append

async def append(self, agent_id, messages, **kw):
    result = await original(self, agent_id, messages, **kw)
    if any(m.role == "tool" for m in messages):
        os.kill(os.getpid(), signal.SIGKILL)  # after the durable write, before the context changes
    return result

OffloadStore.append = append

@cmdc.tool
async def dump() -> str:
    "Dump."
    return open(sys.argv[2], encoding="utf-8").read()

async def main():
    from cmdc.providers import ScriptedProvider
    model = ScriptedProvider([ScriptedProvider.tool_call("dump", {}, id="c1"), "done"])
    async with cmdc.open_runtime(log_events=False, checkpoint_dir=sys.argv[1] + "/ck") as rt:
        agent = await rt.spawn("k", model, tools=[dump], config={"compact_offload_dir": sys.argv[1] + "/j"})
        await agent.prompt("go")

trio.run(main)
"""


async def test_a_kill_between_the_journal_write_and_the_context_change_loses_nothing(tmp_path: Path) -> None:
    text = "payload ✓ " * 20_000
    env = {**os.environ, "PYTHONPATH": ROOT}
    payload = tmp_path / "payload.txt"
    payload.write_text(text, encoding="utf-8")
    done = await trio.run_process(
        [sys.executable, "-c", KILLER, str(tmp_path), str(payload)],
        env=env,
        check=False,
        capture_stdout=True,
        capture_stderr=True,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    records = await journal(tmp_path).records("k")
    assert [r.message.text for r in records if r.message.role == "tool"] == [text]
    # the checkpoint never saw the step: the turn is lost, the result is not
    assert not any(
        m.role == "tool" for m in (await CheckpointStore(tmp_path / "ck").load("k") or State(agent_id="k")).messages
    )


# -- masking -------------------------------------------------------------------------------------


def chatty(n: int, size: int = 8_000) -> tuple[Any, list[Message]]:
    """A read tool, a todo tool (excluded) and a script of `n` tool rounds, then "done"."""

    @tool
    async def read_file(path: str) -> str:
        """Read a file."""
        return f"# {path}\n" + ("content of " + path + " ") * (size // (12 + len(path)))

    @tool
    async def todo(item: str) -> str:
        """Note a task."""
        return f"noted {item} " + "." * 3_000

    script: list[Message] = []
    for i in range(n):
        name, args = ("todo", {"item": f"t{i}"}) if i % 5 == 0 else ("read_file", {"path": f"src/m{i}.py"})
        script.append(ScriptedProvider.tool_call(name, args, id=f"c{i}"))
    return (read_file, todo), script


class Recording(ScriptedProvider):
    pass


async def test_masking_replaces_old_results_in_one_batch_and_spares_a_summary(tmp_path: Path) -> None:
    tools, script = chatty(24)
    model = ScriptedProvider([*script, "done"])
    config = cfg(tmp_path, compact_trigger=("tokens", 30_000), mask_exclude=["todo"], mask_at_least=3_000)
    async with open_runtime(log_events=False) as rt:
        with rt.subscribe("m") as sub:
            agent = await rt.spawn("m", model, tools=list(tools), config=config)
            await agent.prompt("read everything")
            events = drain(sub)
        state = await agent.state()
    assert state.compactions == 0  # masking kept the context under the trigger: no summary
    masked = [m for m in state.messages if MASKED_KEY in m.metadata]
    assert masked and all("\n" not in m.text for m in masked)
    tool_results = [m for m in state.messages if m.role == "tool"]
    assert all(MASKED_KEY not in m.metadata for m in tool_results[-3:])  # the newest three stay
    calls = {c.id: c for m in state.messages for c in m.tool_calls}
    assert all(calls[m.tool_call_id].name != "todo" for m in masked)  # never the excluded tool
    store = journal(tmp_path)
    originals = {f"c{i}": await tools[0 if i % 5 else 1].run(calls[f"c{i}"].arguments) for i in range(24)}
    for m in masked:
        record = m.metadata[MASKED_KEY]["record"]
        assert f"recall(record={record})" in m.text and calls[m.tool_call_id].arguments["path"] in m.text
        [r] = await store.read_range("m", record, record)
        assert r.message.text == originals[m.tool_call_id or ""]  # byte-exact
    batches = [e for e in events if e.kind == "tool_results_masked"]
    assert batches and all(e.data["freed"] >= 3_000 for e in batches)
    # cache-friendly: between maskings, each request extends the previous one
    breaks = sum(
        1
        for a, b in zip(model.requests, model.requests[1:], strict=False)
        if [m.text for m in b.messages[: len(a.messages)]] != [m.text for m in a.messages]
    )
    assert breaks == len(batches)


def test_placeholders_are_byte_stable() -> None:
    call = ToolCall(id="c1", name="grep", arguments={"pattern": "TODO  x", "paths": ["a", "b"]})
    m = Message.tool_result("c1", "hit\n" * 500)
    one, two = placeholder(m, call, 17), placeholder(Message.tool_result("c1", "hit\n" * 500), call, 17)
    assert one.text == two.text and one.to_json().split(b'"id"')[0] == two.to_json().split(b'"id"')[0]
    assert one.text == '[masked grep(paths=["a","b"], pattern=TODO x): 2000 bytes; recall(record=17)]'


async def test_a_small_batch_is_not_worth_a_cache_break(tmp_path: Path) -> None:
    tools, script = chatty(8, size=800)
    config = cfg(tmp_path, compact_trigger=("tokens", 4_000), mask_at_least=50_000)
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("s", ScriptedProvider([*script, "done"]), tools=list(tools), config=config)
        await agent.prompt("go")
        state = await agent.state()
    assert not any(MASKED_KEY in m.metadata for m in state.messages)


class FakeStore:
    """An in-memory journal: append numbers records and keeps the messages."""

    def __init__(self) -> None:
        self.records: dict[int, Message] = {}

    async def append(self, agent_id: str, messages: Sequence[Message], **_: Any) -> AppendResult:
        first = len(self.records) + 1
        for i, m in enumerate(messages):
            self.records[first + i] = m
        seqs = tuple(range(first, first + len(messages)))
        return AppendResult(Path("/j"), first, first + len(messages) - 1, len(messages), "j0", None, (), seqs)


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    messages = [Message.system("sys"), Message.user("task")]
    n = 0
    for _ in range(draw(st.integers(1, 12))):
        k = draw(st.integers(1, 3))
        calls = [
            ToolCall(id=f"c{n + j}", name=draw(st.sampled_from(["read", "grep", "todo"])), arguments={"p": f"f{n + j}"})
            for j in range(k)
        ]
        n += k
        messages.append(Message.assistant("", tool_calls=calls))
        answered = calls if draw(st.booleans()) or _ < 11 else calls[: draw(st.integers(0, k))]
        for c in answered:
            size = draw(st.sampled_from([10, 300, 5_000, 40_000]))
            messages.append(Message.tool_result(c.id, "r" * size, is_error=draw(st.booleans())))
        if draw(st.booleans()):
            messages.append(Message.user("more"))
    return messages


def pairs(messages: Sequence[Message]) -> list[tuple[str, ...]]:
    return [(m.role, m.tool_call_id or "", *(c.id for c in m.tool_calls)) for m in messages]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversations(), st.integers(0, 4), st.sampled_from([None, 50, 2_000]))
def test_masking_and_caps_never_split_a_tool_pair(messages: list[Message], keep: int, limit: int | None) -> None:
    async def run() -> None:
        store = FakeStore()
        state = State(agent_id="h", messages=messages, config={"mask_keep": keep, "tool_result_limit": limit})
        config = CompactConfig.from_mapping(state.config)
        # caps, on the results of the last assistant message
        last = max(i for i, m in enumerate(messages) if m.tool_calls)
        results = [m for m in messages[last + 1 :] if m.role == "tool"]
        calls = {c.id: c for c in messages[last].tool_calls}
        capped, _, done = await cap_results(store, state, config, calls, results, estimate_message_tokens)
        assert pairs(capped) == pairs(results)
        for m in capped:
            if CAPPED_KEY in m.metadata:
                original = next(r for r in results if r.tool_call_id == m.tool_call_id)
                assert store.records[m.metadata[CAPPED_KEY]["record"]].text == original.text
        assert len(done) == sum(CAPPED_KEY in m.metadata for m in capped)
        # masking
        plan = plan_mask(state, config, estimate_message_tokens)
        masked, records = await apply_mask(store, state, plan)
        assert pairs(masked.messages) == pairs(state.messages)
        tool_at = [i for i, m in enumerate(messages) if m.role == "tool"]
        last_reply = max(i for i, m in enumerate(messages) if m.role == "assistant")
        unseen = {i for i in tool_at if i > last_reply}  # the model has not read them yet
        assert not set(plan.indices) & (set(tool_at[len(tool_at) - keep :] if keep else ()) | unseen)
        for i, record in zip(plan.indices, records, strict=True):
            assert store.records[record].text == messages[i].text
            assert masked.messages[i].metadata[MASKED_KEY]["record"] == record

    trio.run(run)


# -- the thrash guard ----------------------------------------------------------------------------


def looping(size: int) -> tuple[Any, ScriptedProvider]:
    @tool
    async def fetch(i: int) -> str:
        """Fetch."""
        return f"item {i} " + "z" * size

    def step(request: ModelRequest) -> Message:
        n = sum(len(m.tool_calls) for m in request.messages)
        return Message.assistant(
            "", tool_calls=[ToolCall(id=f"f{n}-{j}", name="fetch", arguments={"i": n + j}) for j in range(3)]
        )

    return fetch, ScriptedProvider([step], cycle=True)


FAST = AgentOptions(compaction_cooldown=1e-6, max_steps=60)


@pytest.mark.parametrize(
    ("case", "culprit"),
    [("pins", "pins"), ("kept", "kept"), ("message", "message")],
)
async def test_the_thrash_guard_fires_on_each_pathological_configuration(
    tmp_path: Path, case: str, culprit: str
) -> None:
    base = cfg(tmp_path, compact_trigger=("tokens", 4_000), mask_tool_results=False, tool_result_limit=None)
    instructions, question, size = "be brief", "go", 200
    if case == "pins":
        instructions = "rules " * 3_000  # ~4,500 tokens of system prompt: over the trigger alone
    elif case == "kept":
        size = 7_200  # each reply's three results (~1,800 tokens each) are kept whole, over the trigger
    else:
        question = "input " * 5_000  # the question, kept for the turn, is over the trigger
    fetch, model = looping(size)
    async with open_runtime(log_events=False) as rt:
        with rt.subscribe("t") as sub:
            agent = await rt.spawn("t", model, tools=[fetch], instructions=instructions, config=base, options=FAST)
            with pytest.raises(CompactionThrashing) as info:
                await agent.prompt(question)
            events = drain(sub)
        assert info.value.culprit == culprit, str(info.value)
        assert "too big" in str(info.value).lower() or "takes" in str(info.value)
        thrash = [e for e in events if e.kind == "compaction_thrash"]
        assert len(thrash) == 1 and thrash[0].data["culprit"] == culprit
        starts = [e for e in events if e.kind == "compaction_start"]
        assert len(starts) <= 3 * 3  # bounded: never a spin (at most three compactions of three passes)
        assert (await agent.state()).messages  # the agent still serves
        assert isinstance(info.value, cmdc.CompactionError)


def test_the_diagnosis_names_the_summary_budget() -> None:
    state = State(agent_id="d", messages=[Message.system("s"), Message.user("q" * 400), Message.assistant("a" * 400)])
    config = CompactConfig.from_mapping({"compact_trigger": ("tokens", 2_000), "compact_keep": ("messages", 1)})
    culprit, advice, figures = diagnose(state, config, estimate_message_tokens, 1_500, None)
    assert culprit == "summary" and "summary_budget" in advice and figures["summary_budget"] == 1_500


async def test_the_thrash_guard_never_fires_on_the_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    from cmdc.cli._demo import DemoOptions, run_demo

    fired: list[object] = []

    def spy(*args: Any) -> Any:
        fired.append(args)
        raise AssertionError("the thrash guard fired")

    monkeypatch.setattr(cmdc.agent, "diagnose", spy)
    code, _ = await run_demo(
        DemoOptions(agents=3, turns=40, latency=0.0, display="plain"), io.StringIO(), io.StringIO()
    )
    assert not fired and code == 0


# -- compact_context and rehydration ----------------------------------------------------------


async def test_compact_context_runs_only_with_enough_gain_and_passes_the_reason(tmp_path: Path) -> None:
    seen: list[str] = []

    async def summarizer(messages: Sequence[Message], instruction: str) -> str:
        seen.append(instruction)
        return "summary"

    tools, script = chatty(6, size=6_000)
    ask = ScriptedProvider.tool_call("compact_context", {"reason": "subtask A done; keep the file list"}, id="cc")
    early = ScriptedProvider.tool_call("compact_context", {"reason": "too early"}, id="c0x")
    model = ScriptedProvider([early, *script, ask, "done"])
    config = cfg(tmp_path, compact_min_gain=2_000, mask_tool_results=False)
    async with open_runtime(log_events=False) as rt:
        with rt.subscribe("c") as sub:
            agent = await rt.spawn(
                "c", model, tools=[*tools, compact_context_tool()], config=config, summarizer=summarizer
            )
            await agent.prompt("work")
            events = drain(sub)
        state = await agent.state()
    asked = [e for e in events if e.kind == "compaction_requested"]
    assert [e.data["accepted"] for e in asked] == [False, True]
    assert "Not compacted" in model.requests[1].messages[-1].text
    assert "Compaction scheduled" in model.requests[-1].messages[-1].text
    assert state.compactions == 1 and len(seen) == 1 and "subtask A done; keep the file list" in seen[0]
    start = next(e for e in events if e.kind == "compaction_start")
    assert start.data["reason"] == "requested"


async def test_rehydration_reinjects_the_newest_reads_within_budget(tmp_path: Path) -> None:
    tools, script = chatty(12, size=3_000)
    config = cfg(tmp_path, compact_trigger=("tokens", 8_000), compact_keep=("messages", 2), mask_tool_results=False)
    plugin = RehydrateReads(["read_*"], max_files=2, file_tokens=400, total_tokens=2_000)
    async with open_runtime(log_events=False) as rt:
        model = ScriptedProvider([*script, "done"])
        agent = await rt.spawn(
            "r", model, tools=list(tools), plugins=[plugin], config=config, summarizer=RecordingSummarizer("summary")
        )
        await agent.prompt("go")
        state = await agent.state()
    assert state.compactions >= 1
    notes = [m for m in state.messages if m.metadata.get(KIND_KEY) == "rehydrated"]
    assert len(notes) == 1
    note = notes[0]
    assert note.text.count("### read_file(") == 2 and estimate_message_tokens(note) <= 1_000  # trigger / 8
    summary = next(i for i, m in enumerate(state.messages) if m.is_summary)
    assert state.messages[summary + 1] is note  # right after the summary
    assert "todo" not in note.text
    with pytest.raises(ConfigError, match="max_files"):
        RehydrateReads(max_files=0)


async def test_mcp_results_are_capped_too(tmp_path: Path) -> None:
    import cmdc.mcp
    from tests.providers.test_mcp import demo_server

    model = ScriptedProvider([ScriptedProvider.tool_call("big", {"size": 100_000}, id="b1"), "done"])
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("mcp", model, tools=[cmdc.mcp.in_process(demo_server())], config=cfg(tmp_path))
        await agent.prompt("go")
        state = await agent.state()
    result = next(m for m in state.messages if m.role == "tool")
    record = result.metadata[CAPPED_KEY]["record"]
    [r] = await journal(tmp_path).read_range("mcp", record, record)
    assert r.message.text == "x" * 100_000 and len(result.text) < 6_000


async def test_an_overflow_masks_before_it_forces_a_compaction(tmp_path: Path) -> None:
    tools, script = chatty(6, size=8_000)
    overflow = cmdc.ContextOverflow("prompt is too long", prompt_tokens=13_000, limit=12_000)
    model = ScriptedProvider([*script, overflow, "done"])
    summarizer = RecordingSummarizer("summary")
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("o", model, tools=list(tools), config=cfg(tmp_path), summarizer=summarizer)
        assert (await agent.prompt("go")).text == "done"
        state = await agent.state()
    assert state.compactions == 0 and not summarizer.calls  # no summary: masking was enough
    assert sum(MASKED_KEY in m.metadata for m in state.messages) == 3  # all but the newest three
    assert len(model.requests[-1].messages) == len(model.requests[-2].messages)  # the same request, masked


def test_rehydration_options_are_checked() -> None:
    for kwargs, name in (
        ({"max_files": 0}, "max_files"),
        ({"file_tokens": 2}, "file_tokens"),
        ({"total_tokens": "lots"}, "total_tokens"),
        ({"patterns": [""]}, "patterns"),
        ({"patterns": []}, "patterns"),
    ):
        with pytest.raises(ConfigError, match=name):
            RehydrateReads(**kwargs)


async def test_results_the_model_has_not_read_are_never_masked(tmp_path: Path) -> None:
    tools, _ = chatty(0, size=3_000)
    calls = [ToolCall(id=f"p{i}", name="read_file", arguments={"path": f"src/p{i}.py"}) for i in range(20)]
    model = ScriptedProvider([Message.assistant("", tool_calls=calls), "read them all"])
    config = cfg(tmp_path, compact_trigger=("tokens", 40_000), mask_at_least=100)
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("u", model, tools=list(tools), config=config)
        await agent.prompt("read twenty files")
    seen = [m for m in model.requests[1].messages if m.role == "tool"]
    assert len(seen) == 20 and not any(MASKED_KEY in m.metadata for m in seen)  # over the soft threshold, all read
