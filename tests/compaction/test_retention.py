"""What survives compaction: the retention probes and the session ledger, preserved user
messages, pins, finalizers, reduction, the check after compacting, clipping the tail on overflow."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.retention import TARGETS, claims_all_done, met, replay, table, unseen_decisions, worst
from benchmarks.sessions import CATEGORIES, RECALL, generate
from cmdc import (
    Compacted,
    CompactionError,
    Compactor,
    Event,
    Message,
    OffloadStore,
    ToolCall,
    open_runtime,
    tool,
)
from cmdc._clip import utf8_len
from cmdc.compaction.finalize import (
    USER_MESSAGES_KEY,
    FinalizeContext,
    default_finalize,
    default_summary,
    finalizer,
    preserve_skills,
)
from cmdc.compaction.ledger import (
    ARTIFACT,
    DECISION,
    DONE,
    ERROR,
    LEDGER_KEY,
    OPEN,
    READ_MESSAGES,
    SECTIONS,
    TASK,
    VALUE,
    Entry,
    Ledger,
    carry,
    decisions,
    error_lines,
    fit,
    merge,
    observe,
    render,
)
from cmdc.compaction.ledger import _size as ledger_size
from cmdc.errors import CompactionIncomplete
from cmdc.message import PINNED_KEY
from cmdc.providers import ScriptedProvider, SimulatedModel
from cmdc.testing import RecordingSummarizer, conversation
from tests._support.fakes import make_state, res

SECTIONS_TEXT = "## All user messages\n- (filled by cmdc)\n## Current work\nediting"
"""A summary with the sections cmdc fills in."""

CI_TURNS = 160
"""The CI seed: a 160-turn session (about 25 compactions at a 12k trigger), a few seconds."""


async def test_retention_probes_ci_seed(tmp_path: Path) -> None:
    """The seeded session through the default Compactor: every category's context level after
    every compaction is at its target (decisions too), the summary stays within its budget, the
    pending task stays pending, and (after the last compaction) the recall tool finds the
    evicted facts in its top 5."""
    scores = await replay(generate(7, CI_TURNS), Compactor(), str(tmp_path), recall_every=CI_TURNS)
    report = table("ci seed", scores)
    assert len(scores) >= 15, report
    assert met(scores) == dict.fromkeys([*TARGETS, "budget", "pending"], True), report
    # Measured on this seed: every category 100% at every compaction, the recall level 68/68;
    # the recall level depends on the search's ranking too (another part of cmdc): a margin.
    found = sum(s.recall[c][0] for s in scores for c in CATEGORIES)
    asked = sum(s.recall[c][1] for s in scores for c in CATEGORIES)
    assert asked and found / asked >= 0.9, report  # the recall level goes through the real recall tool


def test_decisions_in_phrasings_never_designed_on() -> None:
    """The decision reading on `UNSEEN_DECISIONS` (phrasings written before it was last changed,
    never used to design it): measured 479 of 800 sentences read with the choice and its reason
    (main's reading before: 424); no sentence of `UNSEEN_NON_DECISIONS` read as a decision. A
    floor below what was measured, so that the figure is watched, not tuned for."""
    found, asked, wrong, plain = unseen_decisions()
    assert asked == 800 and found >= asked // 2, (found, asked)
    assert plain == 400 and wrong == 0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_session_of_a_thousand_turns_is_generated(seed: int) -> None:
    """`generate` past 500 turns (it raised 'no unique value' once the 8 requirement values, a
    module's 22 file names or the 22 choices were used up): every recall and decision probe's
    answer is stated once."""
    session = generate(seed, 1_000)
    assert len(session.turns) == 1_000
    values = [p.needles[0] for p in session.probes if p.category in (RECALL, DECISION)]
    assert len(values) == len(set(values)) and sum(p.category == DECISION for p in session.probes) == 50


async def test_a_pending_task_stays_pending_whatever_the_summary_claims(tmp_path: Path) -> None:
    """A summarizer that says every task is done does not close one: only a tool result or the
    assistant's own message can."""
    scores = await replay(generate(3, 120), Compactor(claims_all_done), str(tmp_path), recall=False)
    kept = [s.pending_kept for s in scores if s.pending_kept is not None]
    assert len(kept) >= 5 and all(kept), table("claims all done", scores)
    assert (worst(scores, "continuation") or 0) >= TARGETS["continuation"], table("claims all done", scores)


def _todo(call_id: str, status: str) -> Message:
    items = {"todos": [{"content": "ship the docs", "status": status}]}
    return Message.assistant("", tool_calls=(ToolCall(id=call_id, name="todo_write", arguments=items),))


def test_a_task_is_done_only_on_evidence() -> None:
    opened = observe([_todo("t1", "pending"), res("t1", "ok")], [1, 2])
    ledger = merge(Ledger(), opened)
    assert [e.status for e in ledger.entries if e.kind == TASK] == [OPEN]
    # a summary saying so, a user saying so, or a user's ticked box: still open
    claims = [
        Message.user("## Pending tasks\nNone, all done.", metadata={"cmdc.kind": "summary"}),
        Message.user("- [x] ship the docs"),
    ]
    ledger = merge(ledger, observe(claims, [3, 4]))
    assert [e.status for e in ledger.entries if e.kind == TASK] == [OPEN]
    # the assistant's own ticked box, or the to-do tool marking it completed: done
    for evidence in (
        [Message.assistant("Progress:\n- [x] ship the docs")],
        [_todo("t2", "completed"), res("t2", "ok")],
    ):
        done = merge(ledger, observe(evidence, list(range(5, 5 + len(evidence)))))
        assert [e.status for e in done.entries if e.kind == TASK] == [DONE]


def test_the_ledger_reads_what_structure_gives() -> None:
    calls = (
        ToolCall(id="e", name="edit_file", arguments={"path": "src/pay.py", "old": "a", "new": "b"}),
        ToolCall(id="b", name="bash", arguments={"command": "pytest -q tests/test_pay.py"}),
    )
    messages = [
        Message.user("The invoice service must answer within 250 ms, and never call prod from tests."),
        Message.user("ok thanks"),
        Message.assistant("We went with Postgres over SQLite because we need row locks.", tool_calls=calls),
        res("e", "edited"),
        res("b", "FAILED tests/test_pay.py::test_total - ValueError: [PAY-17] bad total\n1 failed, 3 passed"),
    ]
    entries = observe(messages, [10, 11, 12, 13, 14])
    kinds = {(e.kind, e.seq) for e in entries}
    assert (VALUE, 10) in kinds and (VALUE, 11) not in kinds  # a stated value; chit-chat is not one
    assert (DECISION, 12) in kinds
    text = render(merge(Ledger(), entries))
    assert "- edited: src/pay.py" in text
    # a command's failure is on its own line, without the test runner's "FAILED x::y - "
    assert "`pytest -q tests/test_pay.py` -> failed: ValueError: [PAY-17] bad total (record 12)" in text
    assert not any(e.kind == ERROR for e in entries)  # said once, not again under Errors seen
    assert "## Open tasks" not in text  # no tasks: that section is left out
    assert all(f"## {SECTIONS[k]}" in text for k in (VALUE, DECISION, ARTIFACT))


def test_a_command_run_again_keeps_its_earlier_failure_as_an_error_seen() -> None:
    """The command's line says its newest outcome; the failure before it stays, under Errors seen
    (an error code said once is a value the model may be asked for)."""
    run = ToolCall(id="b", name="bash", arguments={"command": "pytest -q tests/test_pay.py"})
    again = ToolCall(id="c", name="bash", arguments={"command": "pytest -q tests/test_pay.py"})
    failed = [Message.assistant("", tool_calls=(run,)), res("b", "FAILED t.py::test_x - KeyError: [PAY-9] gone")]
    passed = [Message.assistant("", tool_calls=(again,)), res("c", "===== 4 passed in 0.2s =====")]
    ledger = merge(merge(Ledger(), observe(failed, [1, 2])), observe(passed, [3, 4]))
    text = render(ledger)
    assert "- ran `pytest -q tests/test_pay.py` -> 4 passed in 0.2s (record 3)" in text
    [error] = [e for e in ledger.entries if e.kind == ERROR]
    assert error.text == "`pytest -q tests/test_pay.py` failed: KeyError: [PAY-9] gone" and error.seq == 1
    # run a third time with the same outcome: nothing new
    assert merge(ledger, observe(passed, [5, 6])).entries.count(error) == 1


# Decisions as people write them (the extractor's own examples: in-sample; the benchmark's
# held-out phrasings are never used to design it), and ordinary sentences that decide nothing.
DECIDED = (
    "Let's use Postgres here \u2014 SQLite falls over with concurrent writers.",
    "I went with a dataclass instead of a dict so the fields are typed.",
    "Switching the cache to Redis because the in-process one doesn't survive restarts.",
    "OK, SQLAlchemy it is. The team already knows it.",
    "We'll keep the sync client for now; the async rewrite can wait.",
    "I'd rather not add another dependency, so I wrote the retry loop by hand.",
    "Better to fail loudly here than return a partial export.",
    "Use httpx, not requests: we need HTTP/2.",
    "Pick the token bucket; a fixed window lets bursts through at the boundary.",
    "Since the workers are stateless, we should put uploads in object storage.",
    "Given the deadline, I'll skip the migration tool and write the SQL by hand.",
    "Dropping Celery in favour of plain cron jobs, which is all we need.",
    "Prefer composition over inheritance for the handlers to keep them testable.",
    "Stick with pytest fixtures, the team knows them.",
    "No ORM for this service. The queries are simple and we want to see the SQL.",
    "We're moving the config to TOML because YAML's implicit typing bit us twice.",
    "I picked 30 seconds for the timeout as the load balancer cuts at 60.",
    "Going with UTC everywhere to avoid DST bugs.",
)
NOT_DECIDED = (
    "I'll read the config file first.",
    "Let me run the tests again.",
    "Since the last change, two tests fail.",
    "Can we use Redis for this?",
    "Should I switch to the other branch because of the conflict?",
    "I'll use grep to find the callers.",
    "This function is faster than the old one.",
    "We need to keep the test suite green.",
    "The export keeps failing because the header is missing.",
    "I moved the helper to utils.py.",
    "Picked up the new config.",
    "Use indigo-ember-71 as the queue name for the sessions jobs.",
    "The failure is in test_export: the tenant header is missing from the request.",
    "Next I'll update the docs for the header.",
    "That error comes from the validator, not the handler.",
)


@pytest.mark.parametrize("text", DECIDED)
def test_a_choice_with_its_reason_is_a_decision_in_any_phrasing(text: str) -> None:
    found = decisions(text)
    assert len(found) == 1 and text.startswith(found[0].split(". ")[0])  # the reason kept with its choice
    assert found[0].rstrip(".") in text or found[0] == text


@pytest.mark.parametrize("text", NOT_DECIDED)
def test_plans_questions_and_observations_are_not_decisions(text: str) -> None:
    assert decisions(text) == []


def test_a_reason_in_the_next_sentence_is_read_with_its_choice() -> None:
    entries = observe([Message.assistant("Reading the profile. OK, orjson it is. The stdlib one is too slow.")], [7])
    [entry] = [e for e in entries if e.kind == DECISION]
    assert "orjson it is" in entry.text and "too slow" in entry.text and entry.seq == 7


def test_an_error_said_twice_in_one_output_is_one_line() -> None:
    failed = "FAILED tests/test_b.py::test_t - billing.errors.TenantError: [E3258] tenant header missing"
    output = f"E   billing.errors.TenantError: [E3258] tenant header missing\n...\n{failed}\n1 failed"
    assert error_lines(output) == [failed]
    two = "ERROR: disk full\nWarning\nFAILED tests/test_c.py::test_u - AssertionError: 1 != 2"
    assert len(error_lines(two)) == 2  # different errors: both kept


def test_a_huge_compaction_names_what_the_ledger_did_not_read() -> None:
    """Past `READ_MESSAGES` evicted at once, the older ones are not read but named: every
    section's pointer covers their records."""
    msgs = [Message.user(f"The limit for job {i} is {i * 7} seconds.") for i in range(READ_MESSAGES + 50)]
    ledger = carry([], msgs, list(range(1, len(msgs) + 1)))
    for kind in SECTIONS:
        assert any(lo <= 1 and hi >= 50 for lo, hi in ledger.demoted[kind]), ledger.demoted
    assert any(f"job {READ_MESSAGES + 49} " in e.text for e in ledger.entries)
    assert not any("job 10 " in e.text for e in ledger.entries)
    assert "records 1-50" in render(ledger)


def test_a_huge_compaction_still_reads_the_tool_calls_it_does_not_read_whole() -> None:
    """A compaction at a large trigger evicts far more than the ledger reads whole: the to-do
    list, the files and the commands of the older part are read from its tool calls (the
    newest `OLDER_CALLS` messages that make calls), so the task stays open, the file and the
    failure stay listed; the rest of the older part is named by the pointers."""
    edit = ToolCall(id="e", name="edit_file", arguments={"path": "src/pay.py", "old": "a", "new": "b"})
    run = ToolCall(id="b", name="bash", arguments={"command": "pytest -q tests/test_pay.py"})
    old = [
        _todo("t1", "pending"),
        res("t1", "ok"),
        Message.assistant("", tool_calls=(edit, run)),
        res("e", "edited"),
        res("b", "FAILED tests/test_pay.py::test_total - ValueError: [PAY-17] bad total"),
    ]
    filler = [Message.user(f"note {i}: " + "word " * 60) for i in range(READ_MESSAGES + 50)]
    msgs = [*old, *filler]
    ledger = carry([], msgs, list(range(1, len(msgs) + 1)))
    text = render(ledger)
    assert "- [ ] ship the docs (record 1)" in text and "- edited: src/pay.py" in text
    assert "`pytest -q tests/test_pay.py` -> failed: ValueError: [PAY-17] bad total (record 3)" in text
    assert any(lo <= 1 and hi >= 50 for lo, hi in ledger.demoted[VALUE])  # the notes not read: pointed to


_entry = st.builds(
    Entry,
    kind=st.sampled_from(sorted(SECTIONS)),
    key=st.one_of(
        st.text("abcdefgh", min_size=1, max_size=6), st.text("abc", min_size=1, max_size=4).map("path:{}".format)
    ),
    text=st.text("abcdefghij klmnop\u2014", min_size=1, max_size=120),
    seq=st.integers(1, 5_000),
    rank=st.integers(0, 3),
    status=st.sampled_from(["", OPEN, DONE]),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_entry, max_size=30), min_size=1, max_size=6), st.integers(200, 4_000))
def test_a_ledger_entry_never_leaves_the_summary_without_a_journal_pointer(
    batches: list[list[Entry]], budget: int
) -> None:
    """Compaction after compaction (merge, fit to a budget, carried in metadata), every entry
    ever observed is either rendered whole or its record is named by its section's pointer."""
    ledger = Ledger()
    seen: list[Entry] = []
    for batch in batches:
        ledger = Ledger.from_metadata(fit(merge(ledger, batch), budget).to_metadata())
        seen.extend(batch)
        text = render(ledger)
        assert utf8_len(text) <= budget or not ledger.entries  # fitted (only pointer lines past it)
        assert ledger_size(ledger) == utf8_len(text)  # the size fit counts is the rendered one
        shown = {(e.kind, e.key) for e in ledger.entries}
        for e in seen:
            if (e.kind, e.key) in shown:
                line = next(x for x in ledger.entries if (x.kind, x.key) == (e.kind, e.key)).line()
                path, sep, _ = e.text.partition(" \u2014 ")
                grouped = e.kind == ARTIFACT and e.key.startswith("path:") and sep  # files: by action
                assert (path in text) if grouped else (line in text)
                continue
            ranges = ledger.demoted.get(e.kind, ())
            # the record of its latest mention (the ledger keeps the newest)
            latest = [x.seq for x in seen if (x.kind, x.key) == (e.kind, e.key)][-1]
            assert any(lo <= latest <= hi for lo, hi in ranges), (e, ranges)
            assert "records" in text and f"## {SECTIONS[e.kind]}" in text


def test_over_budget_what_was_said_stays_longer_and_every_section_keeps_its_newest() -> None:
    """Past the budget, files go to the journal before what the user said (values rank above
    what was done to files), but the files' section keeps its newest entries within its floor
    (a small budget is not all taken by the values)."""
    names = [f"{a}{b}" for a in "bcdfghjklm" for b in "aeiou"]  # not one statement restated (that ranks 0)
    said = [Entry(VALUE, f"val:{i}", f"The {names[i]} job times out at {i * 7} s.", i, 3) for i in range(1, 41)]
    files = [Entry(ARTIFACT, f"path:src/m{i}.py", f"src/m{i}.py \u2014 edited", 100 + i, 2) for i in range(1, 41)]
    ledger = merge(Ledger(), [*said, *files])
    fitted = fit(ledger, 1_600)
    shown = {e.key for e in fitted.entries}
    assert utf8_len(render(fitted)) <= 1_600
    kept_files = [i for i in range(1, 41) if f"path:src/m{i}.py" in shown]
    kept_values = [i for i in range(1, 41) if f"val:{i}" in shown]
    assert kept_files and kept_files == list(range(41 - len(kept_files), 41))  # the newest files
    assert kept_values == list(range(41 - len(kept_values), 41)) and len(kept_values) > len(kept_files) / 2
    # without its floor the files' section would be empty: the values alone fill the budget
    assert sum(utf8_len(e.line()) + 1 for e in said) > 1_600


async def test_the_ledger_is_carried_forward_in_the_summary_metadata(tmp_path: Path) -> None:
    """Said once early, never repeated: still in the summary after many compactions, and carried
    in the metadata, not re-parsed from text (a summarizer that writes nothing useful cannot
    lose it)."""
    said = Message.user("The staging database is called lumen-vesper-42 and it must never be dropped.")
    messages = [Message.user("the task"), said, Message.assistant("noted " + "n" * 4_000)]
    state = make_state(tmp_path, messages, compact_keep=("messages", 2))
    compactor = Compactor(RecordingSummarizer("## Current work\nnothing worth saying"))
    for i in range(8):
        state = state.append(Message.user("ok, go on"), Message.assistant(f"working on it, round {i} " + "w" * 4_000))
        result = await compactor.force_compact(state)
        assert isinstance(result, Compacted)
        state = result.state
        summary = next(m for m in state.messages if m.is_summary)
        assert "lumen-vesper-42" in summary.text
        carried = Ledger.from_metadata(summary.metadata[LEDGER_KEY])
        assert any("lumen-vesper-42" in e.text for e in carried.entries)


async def test_the_summary_says_where_the_pinned_task_is(tmp_path: Path) -> None:
    """Issue 26 item 4: the text matches the layout (the task sits before the summary)."""
    answer = "## Primary request and intent\nrestated\n## Current work\nediting"
    task = Message.user("THE TASK: build the thing")
    msgs = [task, *conversation(20, seed=1, system=False), Message.user("now"), Message.assistant("x")]
    state = make_state(tmp_path, msgs, compact_keep=("messages", 2))
    result = await Compactor(RecordingSummarizer(answer)).force_compact(state)
    assert isinstance(result, Compacted)
    order = [m.id for m in result.state.messages]
    summary = next(m for m in result.state.messages if m.is_summary)
    assert order.index(task.id) < order.index(summary.id)
    assert "kept verbatim right before this summary" in summary.text and "restated" not in summary.text
    # and when the task comes after what was evicted (an assistant message first), it says after
    msgs = [Message.assistant("hello"), *conversation(6, seed=2, system=False), task, Message.user("go")]
    state = make_state(tmp_path / "b", msgs, compact_keep=("messages", 2))
    result = await Compactor(RecordingSummarizer(answer)).force_compact(state)
    assert isinstance(result, Compacted)
    order = [m.id for m in result.state.messages]
    summary = next(m for m in result.state.messages if m.is_summary)
    assert order.index(task.id) > order.index(summary.id)
    assert "kept verbatim right after this summary" in summary.text


async def test_user_messages_are_carried_forward_newest_first_within_budget(tmp_path: Path) -> None:
    compactor = Compactor(RecordingSummarizer(SECTIONS_TEXT), user_message_budget=160, pin_task=False)
    msgs = [Message.user(f"user message number {i} " + "x" * 200) for i in range(6)] + [Message.assistant("a")]
    first = await compactor.force_compact(make_state(tmp_path, msgs, compact_keep=("messages", 1)))
    assert isinstance(first, Compacted)
    summary = first.state.messages[0]
    kept = summary.metadata[USER_MESSAGES_KEY]
    assert kept[-1].startswith("user message number 5")  # newest first within the budget
    assert [int(k.split()[3]) for k in kept] == list(range(6 - len(kept), 6))  # newest first, no gap
    # The evicted part is small: the ledger and the user messages share what it leaves (the
    # compaction stays a contraction) and nothing is clipped out of the summary's middle.
    assert first.report.fallback is None, first.report
    users_section = summary.text.split("## All user messages", 1)[1].split("\n## ", 1)[0]
    assert all(f"user message number {i}" not in users_section for i in range(6 - len(kept)))
    # (the ledger carries the rest, as values the user stated, whole or as a pointer to their records)
    ledger_section = summary.text.split("## Requirements and values stated", 1)[1].split("\n## ", 1)[0]
    pointed = [
        (int(lo), int(hi or lo)) for lo, hi in re.findall(r"(\d+)(?:-(\d+))?", ledger_section.split("records", 1)[-1])
    ]
    for i in range(6 - len(kept)):  # message i is journal record i + 1
        shown = f"user message number {i}" in ledger_section
        assert shown or any(lo <= i + 1 <= hi for lo, hi in pointed), (i, ledger_section)
    # at the second compaction, the earlier ones come from the previous summary, not lost
    more = first.state.append(Message.user("a later question"), Message.assistant("b"))
    second = await Compactor(
        RecordingSummarizer(SECTIONS_TEXT), user_message_budget=1_000, pin_task=False
    ).force_compact(more.evolve(config={**more.config, "compact_keep": ("messages", 1)}))
    assert isinstance(second, Compacted)
    carried = second.state.messages[0].metadata[USER_MESSAGES_KEY]
    assert carried[-1] == "a later question"
    # each earlier one is carried verbatim, or (the evicted part being small, the user messages'
    # room is too) by the ledger, which holds them as values with their journal records
    ledger = Ledger.from_metadata(second.state.messages[0].metadata[LEDGER_KEY])
    for text in kept:
        assert text in carried or any(e.text[:40] == text[:40] for e in ledger.entries) or ledger.demoted


async def test_user_message_filter_and_scratchpad(tmp_path: Path) -> None:
    answer = "<analysis>thinking out loud</analysis>\n## All user messages\n- paraphrased\n## Next step\nship"
    compactor = Compactor(
        RecordingSummarizer(answer), user_message_filter=lambda m: "secret" not in m.text, pin_task=False
    )
    msgs = [
        Message.user("keep this"),
        Message.assistant("a long answer " * 60),  # what the summary compresses
        Message.user("a secret token"),
        Message.user("last"),
        Message.assistant("a"),
    ]
    result = await compactor.force_compact(make_state(tmp_path, msgs, compact_keep=("messages", 1)))
    assert isinstance(result, Compacted)
    text = result.state.messages[0].text
    assert "thinking out loud" not in text and "paraphrased" not in text
    assert "- keep this" in text and "- last" in text and "secret" not in text and "## Next step" in text


async def test_the_task_stays_verbatim_and_pins_have_a_budget(tmp_path: Path) -> None:
    task = Message.user("THE TASK: build the thing")
    pins = [Message.user(f"pinned fact {i} " + "p" * 400, metadata={PINNED_KEY: True}) for i in range(3)]
    msgs = [task, *[m for p in pins for m in (p, Message.assistant("ok"))], Message.user("now"), Message.assistant("x")]
    events: list[Event] = []
    compactor = Compactor(RecordingSummarizer(SECTIONS_TEXT), pin_budget=150, on_event=events.append)
    result = await compactor.force_compact(make_state(tmp_path, msgs, compact_keep=("messages", 1)))
    assert isinstance(result, Compacted)
    ids = {m.id for m in result.state.messages}
    assert task.id in ids  # the task survives verbatim
    assert pins[0].id not in ids and pins[1].id not in ids and pins[2].id in ids  # oldest pins go first
    over = [e for e in events if e.kind == "pins_over_budget"]
    assert over and over[0].data["unpinned"] == (pins[0].id, pins[1].id)
    offloaded = {m.id for m in await OffloadStore(tmp_path).read("a1")}
    assert {pins[0].id, pins[1].id} <= offloaded  # summarized, never silently dropped


async def test_finalizers(tmp_path: Path) -> None:
    @tool
    async def skill(name: str) -> str:
        """Load a skill."""
        return f"SKILL {name}"

    skill_calls = [
        m
        for i in range(7)
        for m in (
            Message.assistant("", tool_calls=(ToolCall(id=f"s{i}", name="skill", arguments={"name": f"k{i}"}),)),
            Message.tool_result(f"s{i}", f"skill body {i} " + "b" * (30_000 if i == 6 else 100)),
        )
    ]
    msgs = [Message.user("task"), *skill_calls, Message.user("go on"), Message.assistant("x")]
    custom = finalizer(default_summary, preserve_skills(max_skills=5, max_tokens=5_000, max_total=25_000))
    result = await Compactor(RecordingSummarizer(SECTIONS_TEXT), finalize=custom, pin_task=False).force_compact(
        make_state(tmp_path, msgs, compact_keep=("messages", 1))
    )
    assert isinstance(result, Compacted)
    summary, *skills, last = result.state.messages
    assert summary.is_summary and last.text == "x"
    assert [s.metadata["cmdc.skill_call"] for s in skills] == ["s2", "s3", "s4", "s5", "s6"]  # 5, newest first
    assert all(len(s.text) < 5_000 * 4 + 200 for s in skills)  # each clipped to its budget

    seen: list[FinalizeContext] = []

    async def wrap(ctx: FinalizeContext) -> list[Message]:
        seen.append(ctx)
        return [*default_finalize(ctx), Message.user("and a reminder")]  # the default, reused

    result = await Compactor(RecordingSummarizer(SECTIONS_TEXT), finalize=wrap, pin_task=False).force_compact(
        make_state(tmp_path / "b", msgs, compact_keep=("messages", 1))
    )
    assert isinstance(result, Compacted)
    assert result.state.messages[0].is_summary and result.state.messages[1].text == "and a reminder"
    assert seen[0].compaction == 1 and seen[0].offload_path.endswith("a1.jsonl")

    def broken(ctx: FinalizeContext) -> list[Message]:
        raise ValueError("bad finalizer")

    state = make_state(tmp_path / "c", msgs, compact_keep=("messages", 1))
    with pytest.raises(CompactionError, match="bad finalizer"):
        await Compactor(RecordingSummarizer(SECTIONS_TEXT), finalize=broken).force_compact(state)


async def test_large_tool_results_are_clipped_for_the_summarizer_only(tmp_path: Path) -> None:
    big = "z" * 40_000
    msgs = [
        Message.user("u"),
        Message.assistant("", tool_calls=(ToolCall(id="w", name="write_file", arguments={"body": big}),)),
        res("w", big),
        Message.user("next"),
        Message.assistant("done"),
    ]
    summarizer = RecordingSummarizer(SECTIONS_TEXT)
    result = await Compactor(summarizer, reduce_tokens=500).force_compact(
        make_state(tmp_path, msgs, compact_keep=("messages", 1))
    )
    assert isinstance(result, Compacted)
    seen = {m.id: m for m in summarizer.calls[0][0]}
    assert "more bytes clipped" in seen[msgs[2].id].text and len(seen[msgs[2].id].text) < 3_000
    assert "more bytes clipped" in seen[msgs[1].id].tool_calls[0].arguments["body"]
    journal = {m.id: m for m in await OffloadStore(tmp_path).read("a1")}
    assert journal[msgs[2].id].text == big and journal[msgs[1].id].tool_calls[0].arguments["body"] == big


async def test_the_check_after_compacting_ends(tmp_path: Path) -> None:
    msgs = [m for i in range(120) for m in (Message.user(f"q{i} " + "y" * 400), Message.assistant("a"))]
    config = {"compact_trigger": ("tokens", 2_000), "compact_keep": ("messages", 160)}
    summarizer = RecordingSummarizer(SECTIONS_TEXT)
    with pytest.raises(CompactionIncomplete) as info:
        await Compactor(summarizer, pin_task=False).maybe_compact(make_state(tmp_path, msgs, **config))
    assert len(summarizer.calls) == 3  # the first pass and at most two more
    assert info.value.report.passes == 3 and info.value.state.compactions == 3
    assert "still over" in str(info.value)
    # a keep rule that is only a little too generous: the second pass is enough
    ok = await Compactor(RecordingSummarizer(SECTIONS_TEXT), pin_task=False).maybe_compact(
        make_state(tmp_path / "b", msgs, compact_trigger=("tokens", 8_000), compact_keep=("messages", 160))
    )
    assert isinstance(ok, Compacted) and ok.report.passes == 2
    # the first pass evicts 80, the second 81: the first summary and 80 more
    assert ok.report.messages_before == 240 and ok.report.evicted == 80 + 81
    assert ok.report.messages_after == 1 + 80 and ok.state.compactions == 2


async def test_every_summarizer_input_after_the_first_holds_the_previous_summary(tmp_path: Path) -> None:
    summarizer = RecordingSummarizer(SECTIONS_TEXT)
    compactor = Compactor(summarizer)
    state = make_state(tmp_path, conversation(30), compact_keep=("messages", 4))
    for round_no in range(4):
        result = await compactor.force_compact(state)
        assert isinstance(result, Compacted)
        state = result.state.append(*conversation(20, seed=round_no + 1, system=False))
    for messages, _ in summarizer.calls[1:]:
        assert messages[0].is_summary


async def test_an_agent_clips_a_huge_tail_and_retries_once(tmp_path: Path) -> None:
    @tool
    async def dump() -> str:
        """Return a huge log."""
        return "log line\n" * 20_000

    async def plan(request: Any) -> Message:
        last = request.messages[-1]
        if last.role == "user":
            return Message.assistant("", tool_calls=(ToolCall(id="d1", name="dump"),))
        return Message.assistant(f"the log was {len(last.text)} characters")

    model = SimulatedModel(context_window=8_000)

    class Sized(ScriptedProvider):
        async def complete(self, request: Any) -> Message:  # a window like a real model's
            if model.prompt_tokens(request) > 8_000:
                return await model.complete(request)  # raises ContextOverflow with the figures
            return await super().complete(request)

    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn(
            "clip",
            Sized([plan], cycle=True),
            tools=[dump],
            config={"compact_offload_dir": str(tmp_path), "tool_result_limit": None},
        )
        reply = await agent.prompt("dump the log")
        assert reply.text.startswith("the log was") and int(reply.text.split()[-2]) < 20_000
        state = await agent.state()
        result = next(m for m in state.messages if m.role == "tool")
        assert "clipped to fit the context" in result.text and result.metadata["cmdc.clipped_from"]
        full = {m.id: m for m in await OffloadStore(tmp_path).read("clip")}
        assert full[result.metadata["cmdc.clipped_from"]].text == "log line\n" * 20_000
