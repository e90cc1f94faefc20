"""The ledger's carry without a pass over every evicted message: records numbered in order are
a range (read from its ends), the summaries are found from the state's index, the older calls
are read in place. Each gives what the plain forms give."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmdc import Message, State, ToolCall
from cmdc._clip import clip_line
from cmdc.compaction import finalize, ledger
from cmdc.compaction.compactor import _evicted_summaries
from cmdc.compaction.finalize import FinalizeContext, default_finalize, replace_section, with_ledger
from cmdc.compaction.ledger import ARTIFACT, LEDGER_KEY, Entry, Ledger, carry, merge, render
from cmdc.compaction.summary import strip_scratchpad, summary_message
from tests.compaction.test_ledger_cues import conversations


def _summary(n: int, first: int, entries: list[Entry]) -> Message:
    made = summary_message(f"summary {n}", compaction=n, evicted=3, offload_path="j", first_seq=first, last_seq=first)
    return made.evolve(metadata={**made.metadata, LEDGER_KEY: Ledger(tuple(entries)).to_metadata()})


_EARLIER = [
    Entry(ARTIFACT, "path:src/a.py", "src/a.py \u2014 read, edited", 3, 2),
    Entry(ledger.VALUE, "val:port 8080", "port 8080", 2, 3),
    Entry(ledger.TASK, "task:ship", "ship", 1, 2, ledger.OPEN),
]


@st.composite
def evictions(draw: st.DrawFn) -> tuple[list[Message], list[int]]:
    """Evicted messages with summaries among them (where compactions put them, or anywhere)."""
    messages = draw(conversations())[1:]
    summaries = [_summary(k + 1, 10 * k + 1, _EARLIER[: k + 1]) for k in range(draw(st.integers(0, 3)))]
    for s in summaries:
        at = 0 if draw(st.booleans()) else draw(st.integers(0, len(messages)))
        messages.insert(at, s)
    return messages, [i for i, m in enumerate(messages) if m.is_summary]


@settings(max_examples=300, deadline=None)
@given(evictions(), st.integers(1, 10**6), st.integers(0, 8))
def test_carry_over_a_range_with_known_summaries_is_carry_over_a_list(
    eviction: tuple[list[Message], list[int]], first: int, read: int
) -> None:
    messages, positions = eviction
    seqs = range(first, first + len(messages))
    summaries = [messages[i] for i in positions]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ledger, "READ_MESSAGES", read)  # the older part (pointer, older calls) too
        plain = carry(summaries, messages, list(seqs))
        assert carry(summaries, messages, seqs, positions=positions) == plain
        assert carry(summaries, messages, seqs) == plain
        assert render(carry(summaries, messages, seqs, positions=positions)) == render(plain)


@settings(max_examples=500, deadline=None)
@given(st.integers(-3, 50), st.integers(0, 40), st.integers(0, 40), st.sets(st.integers(0, 45)))
def test_the_ends_of_a_range_are_the_ends_of_its_list(first: int, n: int, start: int, skip: set[int]) -> None:
    seqs = range(first, first + n)
    start = min(start, n)
    skip = {i for i in skip if i < start}  # (the caller's: positions among the unread)
    assert ledger._unread_ends(seqs, start, skip) == ledger._unread_ends(list(seqs), start, skip)


def test_the_older_calls_read_in_place_are_those_of_the_slice() -> None:
    messages: list[Message] = []
    for i in range(30):
        call = ToolCall(f"c{i}", "edit_file" if i % 3 else "read_file", {"path": f"src/m{i % 4}.py"})
        messages += [Message.assistant("", tool_calls=(call,)), Message.tool_result(call.id, "ok", is_error=i == 7)]
    seqs = list(range(100, 100 + len(messages)))
    for end in (0, 1, 2, 15, 16, 41, len(messages)):
        assert ledger._older_calls(messages, seqs, end) == ledger._older_calls(messages[:end], seqs[:end])


def test_the_evicted_summaries_are_found_without_reading_past_them() -> None:
    """Looked for only until as many are found as the state holds; a summary kept (not
    evicted) makes the look go on, and a state without summaries is not looked at."""
    s1, s2 = _summary(1, 1, _EARLIER[:1]), _summary(2, 4, _EARLIER)
    rest = [Message.user(f"u{i}") for i in range(6)]
    state = State(agent_id="a", messages=[Message.system("sys"), s1, s2, *rest])
    evicted = _Counted((s1, s2, *rest[:4]))
    assert _evicted_summaries(state, evicted) == ([s1, s2], [0, 1]) and evicted.read == 2
    kept = _Counted((s2, *rest[:4]))
    assert _evicted_summaries(state, kept) == ([s2], [0]) and kept.read == 5  # s1 kept: to the end
    plain = State(agent_id="a", messages=rest)
    unread = _Counted(tuple(rest))
    assert _evicted_summaries(plain, unread) == ([], []) and unread.read == 0


class _Counted(tuple[Message, ...]):
    """Evicted messages that count how many were read."""

    read = 0

    def __iter__(self) -> Iterator[Message]:
        for m in super().__iter__():
            self.read += 1
            yield m


def test_a_file_entry_carried_twice_keeps_its_actions_once() -> None:
    """Two summaries carrying the same file line (a retried pass, a summary restored twice): the
    line is the same, not its actions listed twice."""
    entry = Entry(ARTIFACT, "path:src/a.py", "src/a.py \u2014 read, edited", 3, 2)
    merged = merge(merge(Ledger(), [entry]), [entry._replace(seq=9)])
    assert [(e.text, e.seq) for e in merged.entries] == [("src/a.py \u2014 read, edited", 9)]


def test_a_file_line_that_failed_twice_the_same_way_is_merged_as_before() -> None:
    """The same failed line seen again goes through the merge as before (clipped to the line's
    bytes, its whitespace collapsed): only a line of several actions is not given them twice."""
    path = "deep/" * 45 + "f.py"  # a long path: its failed line is over the line's 200 bytes
    messages: list[Message] = []
    for i in range(2):
        call = ToolCall(f"c{i}", "edit_file", {"path": path})
        failed = Message.tool_result(call.id, "Error: no", is_error=True)
        messages += [Message.assistant("", tool_calls=(call,)), failed]
    (line,) = [e.text for e in carry([], messages, [1, 2, 3, 4]).entries if e.kind == ARTIFACT]
    assert line == clip_line(f"{path} \u2014 edited (failed: Error: no)", 200)
    assert len(line.encode()) <= 200
    spaced = Entry(ARTIFACT, "path:a  b.py", "a  b.py \u2014 edited (failed: x)", 3, 2)
    once = merge(merge(Ledger(), [spaced]), [spaced._replace(seq=9)]).entries
    assert [(e.text, e.seq) for e in once] == [("a b.py \u2014 edited (failed: x)", 9)]
    several = Entry(ARTIFACT, "path:src/a.py", "src/a.py \u2014 read, edited (failed: x)", 3, 2)
    once = merge(merge(Ledger(), [several]), [several._replace(seq=9)]).entries
    assert [(e.text, e.seq) for e in once] == [("src/a.py \u2014 read, edited (failed: x)", 9)]


def _reference_finalize_text(summary: str, led: Ledger, users: list[str], task: bool) -> str:
    """The summary as it was made before the user messages went in as a marker: their section
    put in, the task section replaced, then the ledger (after the first section), over it all."""
    body = "\n".join(f"- {' '.join(t.split())}" for t in users) if users else "(none)"
    text = replace_section(strip_scratchpad(summary), finalize.USER_MESSAGES_HEADING, body)
    if task and finalize._has_section(text, finalize.TASK_HEADING):
        text = replace_section(text, finalize.TASK_HEADING, finalize.task_reference(True))
    return with_ledger(text, led)


def _context(answer: str, users: list[str], led: Ledger, tmp_path: Path, task: bool) -> FinalizeContext:
    """A finalizer's context: the summarizer's `answer`, `users` evicted, the ledger `led`."""
    return FinalizeContext(
        summary=answer,
        evicted=tuple(Message.user(u) for u in users),
        state=None,
        compaction=1,
        offload_path=str(tmp_path / "j"),
        first_seq=1,
        last_seq=2,
        user_message_budget=1_000,
        task_id="t" if task else None,
        task_before=True,
        ledger=led,
    )


_ANSWERS = [
    "",
    "plain words, no sections",
    "## Primary request and intent\nbuild it",
    "## Primary request and intent\nbuild it\n\n## Next steps\n- test",
    "## All user messages\n- stale\n\n## Primary request and intent\nx",
    "## Primary request and intent\nx\n\n## Files and commands\n- the model's own list\n\n## Notes\nn",
    "<scratchpad>thinking</scratchpad>\n## Summary\nok\n### Detail\nd\n## Errors seen\n- e",
    "intro line\n## Decisions and reasons\n- d\n## Next steps\ngo",
]


@pytest.mark.parametrize("answer", _ANSWERS)
@pytest.mark.parametrize("task", [False, True])
def test_the_summary_reads_as_before_the_ledger_went_in_first(answer: str, task: bool, tmp_path: Path) -> None:
    """The same lines in the same order (a blank line may differ where a section of the answer
    under a ledger heading was taken out)."""
    led = Ledger(tuple(_EARLIER))
    users = ["keep port 8080", "use   Kafka\nplease"]
    made = default_finalize(_context(answer, users, led, tmp_path, task))[0]
    expected = summary_message(
        _reference_finalize_text(answer, led, users, task),
        compaction=1,
        evicted=2,
        offload_path=str(tmp_path / "j"),
        first_seq=1,
        last_seq=2,
    )
    assert [x for x in made.text.splitlines() if x.strip()] == [x for x in expected.text.splitlines() if x.strip()]


_ODD_PATHS = ["a\u2028## All user messages\u2028b.py", "c\rd.py", "e\x0b# All user messages"]


@pytest.mark.parametrize(
    "answer",
    [
        *_ANSWERS,
        "## Primary request and intent\nbuild X\n# All user messages\n- hi\n## Pending tasks\n- y",
        "## All user messages\n- stale\n## Next step\ngo",
        "## Primary request and intent\nx\n# Files and commands\n- own\n## All user messages\n- stale",
    ],
)
@pytest.mark.parametrize("users", [["keep port 8080", "use   Kafka\nplease"], ["a", "   "], []])
def test_the_summary_is_the_one_made_with_the_user_messages_in_first(
    answer: str, users: list[str], tmp_path: Path
) -> None:
    """Exactly as before (not only its lines): a user-messages heading of the answer after the
    ledger's place, or a file's path in the ledger that holds a line break and a heading, changes
    nothing; the ledger is never searched for the user messages' heading."""
    odd = [Entry(ARTIFACT, "path:" + p, f"{p} \u2014 read", 4 + i, 0) for i, p in enumerate(_ODD_PATHS)]
    led = Ledger((*_EARLIER, *odd))
    made = default_finalize(_context(answer, users, led, tmp_path, False))[0]
    expected = _reference_finalize_text(answer, led, users, False)
    assert made.text.split("\n\n", 1)[1] == expected.strip()
    assert render(led) in made.text


@settings(max_examples=200, deadline=None)
@given(evictions(), st.integers(1, 10**6), st.integers(0, 8), st.integers(40, 4_000))
def test_a_remembered_ledger_is_the_one_its_summary_carries(
    eviction: tuple[list[Message], list[int]], first: int, read: int, budget: int
) -> None:
    """The ledger kept on a summary by the compaction that made it is the one its metadata
    reads back as; the next compaction takes it; a summary whose ledger was changed since
    (another metadata value) is read from its metadata."""
    messages, positions = eviction
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ledger, "READ_MESSAGES", read)
        seqs = list(range(first, first + len(messages)))
        made = ledger.fit(carry([messages[i] for i in positions], messages, seqs), budget)
    summary = _summary(9, first, [])
    summary = summary.evolve(metadata={**summary.metadata, LEDGER_KEY: made.to_metadata()})
    ledger.remember_ledger(summary, made)
    assert Ledger.from_metadata(summary.metadata[LEDGER_KEY]) == made
    assert ledger.summary_ledger(summary) == made and isinstance(summary._cues, ledger._Carried)
    changed = summary.evolve(metadata={**summary.metadata, LEDGER_KEY: Ledger(tuple(_EARLIER)).to_metadata()})
    assert ledger.summary_ledger(changed) == Ledger(tuple(_EARLIER))


def test_a_ledger_its_metadata_would_not_read_back_is_not_remembered() -> None:
    summary = _summary(1, 1, _EARLIER)
    odd = Ledger(tuple(_EARLIER), {ledger.TASK: ()})  # an empty range list is not written
    ledger.remember_ledger(summary, odd)
    assert ledger.summary_ledger(summary) == Ledger(tuple(_EARLIER)) != odd
    other = Ledger(tuple(_EARLIER[:1]))  # not the ledger the metadata holds
    ledger.remember_ledger(summary, other)
    assert ledger.summary_ledger(summary) == Ledger(tuple(_EARLIER))
    # (JSON writes 3.0, reads a float)
    floats = Ledger(tuple(e._replace(seq=float(e.seq)) for e in _EARLIER))  # type: ignore[arg-type]
    made = summary.evolve(metadata={**summary.metadata, LEDGER_KEY: floats.to_metadata()})
    ledger.remember_ledger(made, floats)
    assert made._cues is None and ledger.summary_ledger(made) == Ledger()  # read back: not entries


def test_a_remembered_ledger_is_a_copy_of_its_ranges() -> None:
    ranges = {ledger.VALUE: ((1, 4),)}
    led = Ledger(tuple(_EARLIER), ranges)
    summary = _summary(1, 1, [])
    summary = summary.evolve(metadata={**summary.metadata, LEDGER_KEY: led.to_metadata()})
    ledger.remember_ledger(summary, led)
    ranges[ledger.TASK] = ((7, 9),)  # a finalizer changing the ledger it was given, afterwards
    assert ledger.summary_ledger(summary) == Ledger.from_metadata(summary.metadata[LEDGER_KEY])


async def test_a_compactions_summary_carries_its_ledger_to_the_next(tmp_path: Path) -> None:
    from cmdc import Compacted, Compactor
    from cmdc.testing import conversation

    async def instant(messages: object, instruction: str) -> str:
        return "the summary"

    state = State(agent_id="a", config={"compact_trigger": ("tokens", 10**9), "compact_offload_dir": str(tmp_path)})
    compactor = Compactor(instant)
    state = state.append(*conversation(60, seed=3, system=False, usage=False))
    result = await compactor.force_compact(state)
    assert isinstance(result, Compacted)
    summary = next(m for m in result.state.messages if m.is_summary)
    assert isinstance(summary._cues, ledger._Carried)
    assert ledger.summary_ledger(summary) == Ledger.from_metadata(summary.metadata[LEDGER_KEY])
    restored = State.from_json(result.state.to_json())  # a restored summary is read from its metadata
    again = next(m for m in restored.messages if m.is_summary)
    assert again._cues is None and ledger.summary_ledger(again) == ledger.summary_ledger(summary)
