"""The built-in recall tool: evicted history read back from the offload journal."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import cmdc
from cmdc import Compacted, ConfigError, Message, OffloadStore, State, ToolCall, open_runtime, tool
from cmdc.providers import ScriptedProvider
from cmdc.recall import recall_tool
from cmdc.tokens import estimate_text_tokens
from cmdc.tools import ToolArgumentsError

ROUNDS = 6


TASK = "Task: keep track of the deploy codes I give you, batch by batch."


def fact(i: int) -> str:
    return f"the deploy code for batch {i} is ZX-100{i}"


async def compacted_session(tmp_path: Path, agent_id: str = "a1") -> tuple[State, list[Message]]:
    """A task, then six compactions; round i says fact i, and compaction i evicts it. Returns the
    final state and the summary message each compaction produced."""
    config = {"compact_offload_dir": str(tmp_path / "journal"), "compact_keep": ("messages", 2)}
    compactor = cmdc.Compactor()
    state = State(agent_id=agent_id, config=config).append(Message.user(TASK))
    summaries: list[Message] = []
    for i in range(1, ROUNDS + 1):
        state = state.append(
            Message.user(fact(i)),
            Message.assistant(f"Noted: batch {i} ships with that code." + " I checked the release notes." * 12),
            Message.user(f"round {i}: carry on"),
            Message.assistant(f"carrying on with round {i}"),
        )
        outcome = await compactor.force_compact(state)
        assert isinstance(outcome, Compacted)
        state = outcome.state
        summaries.append(next(m for m in state.messages if m.is_summary))
    assert state.compactions == ROUNDS
    return state, summaries


def store_of(state: State) -> OffloadStore:
    return OffloadStore(cmdc.Compactor().compact_config(state).offload_dir)


# -- finding a fact evicted five compactions earlier -----------------------------------------------


async def test_search_finds_fact_evicted_five_compactions_earlier(tmp_path: Path) -> None:
    state, _ = await compacted_session(tmp_path)
    assert not any("ZX-1001" in m.text and not m.is_summary for m in state.messages)  # evicted
    recall = recall_tool(store_of(state), "a1")
    out = await recall.run({"query": "deploy code batch 1"})
    assert re.match(r'\d+ records match "deploy code batch 1", best match first', out)
    # The original message, not only a summary's copy, and it comes first.
    first_block = out.split("\n\n")[1]
    assert re.fullmatch(rf"\[record \d+ · compaction 1 · user\]\n{fact(1)}", first_block)
    assert estimate_text_tokens(out) <= 2_000
    # Original messages before earlier summaries (which only paraphrase records in the journal).
    kinds = re.findall(r"^\[record \d+ · compaction \d+ · user( \(an earlier conversation summary\))?", out, re.M)
    assert kinds and kinds == sorted(kinds)


async def test_a_fact_only_in_an_earlier_summary_is_found(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    summary = Message.user("the budget is 7 pounds", metadata={"cmdc.kind": "summary"})
    await store.append("a1", [Message.user("unrelated"), summary], compaction=2)
    out = await recall_tool(store, "a1").run({"query": "budget"})
    assert "[record 2 · compaction 2 · user (an earlier conversation summary)]\nthe budget is 7 pounds" in out


async def test_range_read_from_the_first_summary_metadata(tmp_path: Path) -> None:
    state, summaries = await compacted_session(tmp_path)
    meta = summaries[0].metadata
    assert meta["cmdc.compaction"] == 1
    assert meta["cmdc.offload_path"] == str(store_of(state).path_for("a1"))
    recall = recall_tool(store_of(state), "a1")
    out = await recall.run({"first": meta["cmdc.first_seq"], "last": meta["cmdc.last_seq"]})
    assert re.search(rf"^\[record \d+ · compaction 1 · user\]\n{fact(1)}$", out, re.M)
    assert "ZX-1002" not in out  # only that range
    assert "not shown" not in out
    # The summary names the same range in its text.
    assert f"records {meta['cmdc.first_seq']}-{meta['cmdc.last_seq']}" in summaries[0].text


async def test_range_defaults_and_headers(tmp_path: Path) -> None:
    state, _ = await compacted_session(tmp_path)
    recall = recall_tool(store_of(state), "a1")
    out = await recall.run({"first": 1})  # last defaults to first + 20
    assert "Records 1-21 of the journal" in out
    seqs = [int(s) for s in re.findall(r"^\[record (\d+) ", out, re.M)]
    assert seqs == sorted(seqs) and seqs[0] == 1 and seqs[-1] <= 21
    # An evicted earlier summary is marked as one.
    assert "· user (an earlier conversation summary)]" in out
    out = await recall.run({"last": 3})  # first defaults to 20 before last
    assert "Records 1-3 of the journal" in out
    out = await recall.run({"first": 10_000})
    assert out.startswith("No records in 10000-10020: the journal holds records 1-")


async def test_tool_calls_and_results_are_labelled(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    call = ToolCall(id="c7", name="read_file", arguments={"path": "src/app.py"})
    await store.append(
        "a1",
        [
            Message.assistant("", tool_calls=(call,)),
            Message.tool_result("c7", "def main(): return 42"),
            Message.tool_result("c8", "boom", is_error=True),
        ],
        compaction=3,
    )
    out = await recall_tool(store, "a1").run({"first": 1, "last": 3})
    assert '[record 1 · compaction 3 · assistant -> read_file]\n-> call read_file (id c7) {"path":"src/app.py"}' in out
    assert "[record 2 · compaction 3 · tool (call c7)]\ndef main(): return 42" in out
    assert "[record 3 · compaction 3 · tool (call c8, error)]\nboom" in out
    # Tool-call arguments are searchable too.
    assert "record 1 " in await recall_tool(store, "a1").run({"query": "app.py"})


async def test_a_call_found_by_its_command_shows_its_outcome_the_newest_run_first(tmp_path: Path) -> None:
    """'what came of pytest tests/test_pay.py?': the command was run three times; the search
    shows the newest run first, with its result's outcome line (the result holds no word of the
    command), and the older identical runs after every other hit."""
    store = OffloadStore(tmp_path)
    runs = []
    for i, (tally, error) in enumerate([("1 failed, 3 passed", False), ("4 passed", False), ("boom", True)]):
        call = ToolCall(id=f"r{i}", name="bash", arguments={"command": "pytest -q tests/test_pay.py"})
        text = (
            f"FAILED tests/test_pay.py::test_t - KeyError\n===== {tally} in 0.{i}s =====" if not error else "boom\nmore"
        )
        runs += [
            Message.assistant("Running the tests.", tool_calls=(call,)),
            Message.tool_result(f"r{i}", text, is_error=error),
        ]
    other = ToolCall(id="x", name="bash", arguments={"command": "pytest -q tests/test_api.py"})
    await store.append("a1", [*runs[:4], Message.assistant("", tool_calls=(other,)), *runs[4:]], compaction=1)
    out = await recall_tool(store, "a1").run({"query": "result of pytest -q tests/test_pay.py", "limit": 2})
    blocks = out.split("\n\n")
    assert blocks[1].startswith("[record 6 · compaction 1 · assistant -> bash]")  # the newest run, first
    assert blocks[1].endswith('{"command":"pytest -q tests/test_pay.py"}\n<- bash result (error), record 7: boom')
    assert blocks[2].startswith("[record 5 ")  # another command, then the older identical runs
    not_shown = re.search(r"records ([\d, ]+)\.", blocks[-1])
    assert not_shown is not None and [int(x) for x in not_shown.group(1).split(", ")][-2:] == [1, 3]
    out = await recall_tool(store, "a1").run({"first": 1, "last": 2})
    assert "<- bash result" not in out  # a read by range shows the records as they are
    assert "===== 1 failed, 3 passed in 0.0s =====" in out


# -- the budget ---------------------------------------------------------------------------------------


async def test_huge_record_is_cut_with_a_marker(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    small = "alpha first " + "s" * 1_600
    big = "alpha " + "x" * 7_200  # about 1,800 tokens: fits alone in the 2,000-token budget
    await store.append("a1", [Message.user(small), Message.user(big), Message.user("alpha last")])
    recall = recall_tool(store, "a1")
    out = await recall.run({"first": 1, "last": 3})
    assert estimate_text_tokens(out) <= 2_000
    assert f"[record 1 · compaction 0 · user]\n{small}\n\n" in out
    m = re.search(r"\[\.\.\. (\d+) more characters; read record 2 alone to see it all\]", out)
    assert m is not None
    head = out.split("[record 2 · compaction 0 · user]\n", 1)[1].split("\n[... ", 1)[0]
    assert big.startswith(head) and len(head) + int(m[1]) == len(big)
    assert "[1 more records in 1-3 not shown" in out and "Continue with first=3, last=3." in out
    # Continuing gets the rest.
    assert "alpha last" in await recall.run({"first": 3, "last": 3})
    # Alone, with a budget that holds it, it is whole.
    whole = await recall.run({"first": 2, "last": 2})
    assert big in whole and "more characters" not in whole


async def test_record_larger_than_the_budget_points_to_the_journal(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    await store.append("a1", [Message.user("é" * 20_000)])  # multi-byte text
    out = await recall_tool(store, "a1", budget_tokens=300).run({"first": 1})
    assert estimate_text_tokens(out) <= 300
    assert "more characters; the record is larger than the recall budget" in out
    assert f"in the journal {store.path_for('a1')}, record 1]" in out


async def test_no_room_for_a_cut_record_leaves_it_out(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    await store.append("a1", [Message.user("beta " + "y" * 3_000), Message.user("beta " + "z" * 3_000)])
    out = await recall_tool(store, "a1", budget_tokens=850).run({"first": 1, "last": 2})
    assert estimate_text_tokens(out) <= 850
    assert "more characters" not in out  # too little room left to be worth cutting
    assert "[1 more records in 1-2 not shown: the output budget (850 tokens) is used up." in out


async def test_large_search_hits_show_the_lines_holding_the_words(tmp_path: Path) -> None:
    """A hit larger than its share of the output shows the lines holding the query's words (the
    most distinct words first), so every one of the best hits is shown; the note says how to
    read the record whole."""
    store = OffloadStore(tmp_path)
    log = "\n".join(f"line {i}: nothing to see" for i in range(400))
    texts = [log.replace("line 7:", "line 7: beta E4127 failed") for _ in range(5)]
    texts[2] = texts[2].replace("line 300:", "line 300: beta only")
    await store.append("a1", [Message.tool_result(f"c{i}", t) for i, t in enumerate(texts)])
    out = await recall_tool(store, "a1", budget_tokens=600).run({"query": "beta E4127", "limit": 5})
    assert estimate_text_tokens(out) <= 600
    assert len(re.findall(r"^\[record \d+ ", out, re.M)) == 5  # all five, each by its lines
    assert out.count("line 7: beta E4127 failed") == 5 and "line 300: beta only" in out
    assert "line 8:" not in out  # a line without the words is left out
    assert "[… lines of record 3 holding the words searched; read it with first=3]" in out
    assert "line 300: beta only" in await recall_tool(store, "a1", budget_tokens=20_000).run({"first": 3})


async def test_many_hits_report_how_many_were_left_out(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    await store.append("a1", [Message.user(f"gamma note {i}: " + "w" * 300) for i in range(1, 41)])
    recall = recall_tool(store, "a1", budget_tokens=400)
    out = await recall.run({"query": "gamma", "limit": 50})
    assert estimate_text_tokens(out) <= 400
    assert out.startswith('40 records match "gamma", best match first:')
    shown = len(re.findall(r"^\[record \d+ ", out, re.M))
    m = re.search(r"\[(\d+) more matching records not shown \(the output budget is used up\): records ([\d, ]+)", out)
    assert m is not None and shown >= 1 and shown + int(m[1]) == 40
    assert f"Read one with first={shown + 1}, last={shown + 1}" in out
    # The limit also leaves records out, and says so.
    out = await recall_tool(store, "a1", budget_tokens=20_000).run({"query": "gamma", "limit": 5})
    assert "(showing at most limit=5)" in out
    assert "[35 more matching records not shown (limit=5): records 6, 7," in out and "and 25 more" in out
    # A range larger than the budget says how to continue.
    out = await recall.run({"first": 1, "last": 40})
    n = len(re.findall(r"^\[record \d+ ", out, re.M))
    assert f"[{40 - n} more records in 1-40 not shown" in out and f"Continue with first={n + 1}, last=40." in out


async def test_budget_holds_for_every_budget(tmp_path: Path) -> None:
    state, _ = await compacted_session(tmp_path)
    for budget in (200, 257, 400, 999, 3_000):
        recall = recall_tool(store_of(state), "a1", budget_tokens=budget)
        for args in ({"query": "deploy code batch 1", "limit": 50}, {"first": 1, "last": 100}):
            out = await recall.run(args)
            assert estimate_text_tokens(out) <= budget, (budget, args)
            assert "ZX-100" in out


# -- nothing to find -----------------------------------------------------------------------------------


async def test_empty_or_missing_journal(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path / "none")
    recall = recall_tool(store, "a1")
    for args in ({"query": "anything"}, {"first": 1}):
        out = await recall.run(args)
        assert "nothing has been offloaded yet" in out.lower()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a1.jsonl").write_bytes(b"")
    empty = recall_tool(OffloadStore(tmp_path / "empty"), "a1")
    assert "Nothing has been offloaded yet" in await empty.run({"first": 2})


async def test_search_without_hits_suggests_other_words(tmp_path: Path) -> None:
    state, _ = await compacted_session(tmp_path)
    out = await recall_tool(store_of(state), "a1").run({"query": "kubernetes helm"})
    assert out.startswith('No records match "kubernetes helm" in the journal')
    assert "Try other words" in out and "first, last" in out


# -- arguments -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "give query (words to search for) or first"),
        ({"query": "x", "first": 1}, "not both"),
        ({"query": "x", "last": 4}, "not both"),
        ({"query": "  ?! "}, "has no words to search for"),
        ({"first": 0}, "first must be a record number, 1 or more; got 0"),
        ({"last": -2}, "last must be a record number, 1 or more; got -2"),
        ({"first": 9, "last": 3}, "first (9) must not be greater than last (3)"),
        ({"query": "x", "limit": 0}, "limit must be between 1 and 50, got 0"),
        ({"query": "x", "limit": 51}, "limit must be between 1 and 50, got 51"),
        ({"first": "one"}, "arguments.first: expected integer or null"),
        ({"first": True}, "arguments.first: expected integer or null"),
        ({"query": "x", "page": 2}, 'unknown argument "page"'),
        # hostile values: typed errors, never a TypeError or ValueError from deeper down
        ({"query": "\ud800"}, "query is not valid text: it holds a lone surrogate (U+D800) at position 0"),
        ({"query": "deploy \udfff code"}, "lone surrogate (U+DFFF) at position 7"),
        ({"query": "deploy\x00code"}, "query is not valid text: it holds a NUL character at position 6"),
        ({"first": 2**63}, "first must be a record number, at most 9223372036854775807; got a 64-bit number"),
        ({"first": 1, "last": 10**5000}, "last must be a record number, at most 9223372036854775807; got a 16610-bit"),
        ({"first": -(10**5000)}, "first must be a record number, 1 or more; got a 16610-bit number"),
        ({"query": "x", "limit": 10**5000}, "limit must be between 1 and 50, got a 16610-bit number"),
    ],
)
async def test_bad_arguments_give_clear_errors(tmp_path: Path, args: dict[str, Any], message: str) -> None:
    store = OffloadStore(tmp_path)
    await store.append("a1", [Message.user("hello")])
    recall = recall_tool(store, "a1")
    with pytest.raises(ToolArgumentsError, match=re.escape(message)) as info:
        await recall.run(args)
    assert "invalid arguments for tool 'recall'" in str(info.value)


def test_construction_is_checked(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    with pytest.raises(ConfigError, match="budget_tokens must be an integer >= 200"):
        recall_tool(store, "a1", budget_tokens=10)
    with pytest.raises(ConfigError, match="budget_tokens"):
        recall_tool(store, "a1", budget_tokens=True)
    with pytest.raises(ConfigError):
        recall_tool(store, "../etc")
    with pytest.raises(ConfigError, match="tool name"):
        recall_tool(store, "a1", name="re call")
    t = recall_tool(store, "a1", name="history")
    assert t.name == "history"
    assert "summary" in t.description and "exact detail" in t.description
    assert set(t.parameters["properties"]) == {
        "query", "first", "last", "limit", "record", "line_start", "line_end", "byte_start", "byte_end"
    }  # fmt: skip
    assert not t.parameters["required"]


# -- an agent with recall=True ---------------------------------------------------------------------------


async def test_agent_with_recall_reads_back_an_evicted_fact(tmp_path: Path) -> None:
    provider = ScriptedProvider(
        [
            *[f"noted {i}" for i in range(1, 9)],
            ScriptedProvider.tool_call("recall", {"query": "deploy code batch 1"}, id="r1"),
            "The deploy code for batch 1 is ZX-1001.",
        ]
    )
    config = {
        "compact_trigger": ("messages", 6),
        "compact_keep": ("messages", 2),
        "compact_offload_dir": str(tmp_path / "journal"),
    }
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", provider, config=config, summarizer=cmdc.ExtractiveSummarizer(), recall=True)
        await agent.prompt(TASK)
        for i in range(2, 9):
            await agent.prompt(fact(i - 1) if i <= 4 else f"step {i}: keep going")
        state = await agent.state()
        assert state.compactions >= 2
        assert not any(m.text == fact(1) for m in state.messages)  # evicted
        reply = await agent.prompt("What was the deploy code for batch 1?")
        assert reply.text == "The deploy code for batch 1 is ZX-1001."
        request = provider.requests[-1]
        assert any(s.name == "recall" for s in request.tools)
        result = next(m for m in request.messages if m.role == "tool" and m.tool_call_id == "r1")
        assert not result.is_error
        assert f"· user]\n{fact(1)}" in result.text
        await agent.stop()


async def test_recall_is_off_by_default_and_clashes_are_refused(tmp_path: Path) -> None:
    @tool
    async def recall(query: str) -> str:
        """My own recall."""
        return query

    config = {"compact_offload_dir": str(tmp_path)}
    async with open_runtime(log_events=False) as rt:
        provider = ScriptedProvider(["hi"])
        plain = await rt.spawn("p1", provider, config=config)
        await plain.prompt("hello")
        assert provider.requests[-1].tools == ()
        provider = ScriptedProvider(["hi"])
        mine = await rt.spawn("p2", provider, tools=[recall], config=config)
        await mine.prompt("hello")
        assert [s.description for s in provider.requests[-1].tools] == ["My own recall."]
        with pytest.raises(ConfigError, match="recall"):
            await rt.spawn("p3", ScriptedProvider(["hi"]), tools=[recall], config=config, recall=True)
        assert rt.whereis("p3") is None


async def test_agent_recall_errors_become_error_results(tmp_path: Path) -> None:
    provider = ScriptedProvider([ScriptedProvider.tool_call("recall", {}, id="bad"), "sorry"])
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a2", provider, config={"compact_offload_dir": str(tmp_path)}, recall=True)
        await agent.prompt("look it up")
        result = next(m for m in provider.requests[-1].messages if m.role == "tool")
        assert result.is_error and "give query (words to search for) or first" in result.text


# -- a huge record ------------------------------------------------------------------------------


def _huge_text(mb: int) -> str:
    """About `mb` MB of text whose JSON holds escapes throughout (newlines, quotes, backslashes,
    tabs) and multi-byte characters at both ends, with a needle at the very end."""
    line = "." * 990 + ' "q" \\ \t\n'
    body = line * (mb * 1024 * 1024 // len(line))
    return "intro: the big tool output begins é ü 😀 " + body + " ß ü needle77 at the end"


async def test_a_50_mb_record_is_found_by_recall_with_its_head_shown(tmp_path: Path) -> None:
    """Recall reads a 50 MB record's head and counts the rest, never building its whole text."""
    big = _huge_text(50)
    store = OffloadStore(tmp_path)
    await store.append("a1", [Message.user("small one"), Message.tool_result("c1", big), Message.user("after")])
    recall = recall_tool(store, "a1")
    marker = re.compile(
        r"\n\[\.\.\. (\d+) more characters; the record is larger than the recall budget: the whole text is in "
        rf"the journal {re.escape(str(store.path_for('a1')))}, record 2\]"
    )
    found = await recall.run({"query": "needle77"})
    assert found.startswith("1 records match")
    for out in [found, await recall.run({"first": 2, "last": 2})]:
        assert estimate_text_tokens(out) <= 2_000
        head = out.split("[record 2 · compaction 0 · tool (call c1)]\n", 1)[1]
        m = marker.search(head)
        assert m is not None
        head = head[: m.start()]
        assert head.startswith("intro: the big tool output begins é ü 😀 ....") and big.startswith(head)
        assert len(head) + int(m[1]) == len(big)  # the count is of the whole text


async def test_a_common_word_counts_its_hits_up_to_a_bound(tmp_path: Path) -> None:
    """A search reads a bounded number of hits (a common word in a long journal decodes a few
    dozen records, not all of them): past the bound the count says "+"."""
    store = OffloadStore(tmp_path)
    await store.append("a1", [Message.user(f"delta note {i}") for i in range(150)])
    out = await recall_tool(store, "a1").run({"query": "delta", "limit": 3})
    assert out.startswith('100+ records match "delta", best match first (showing at most limit=3):')
    assert "[97+ more matching records not shown (limit=3): records 4, 5," in out
    assert (await recall_tool(store, "a1").run({"query": "note 149"})).startswith("100+ records match")
