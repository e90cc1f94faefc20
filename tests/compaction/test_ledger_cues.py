"""What the ledger reads of each message once (its cues: read as the message is appended, or
by the first compaction that reads it) gives the entries reading it afresh gives: on any mix
of messages, under any record numbers, read before or not, media in them or not."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmdc import Message, State, ToolCall
from cmdc._clip import clip_line, scrub_media
from cmdc.compaction import ledger
from cmdc.compaction.ledger import Entry, carry, cues_ready, observe, render

_MEDIA = "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUgAA" * 8

_TEXTS = [
    "We must keep port 8080 for the gateway.",
    "Chose Kafka because it keeps order per key; RabbitMQ was the other option.",
    "Let's go with sqlite: it needs no server.",
    "I'll run the tests next, then fix the parser.",
    "- [ ] ship the docs\n- [x] write the parser\nTODO: bump the version",
    "Please never touch `config/prod.yaml` again.",
    "ok",
    "",
    "see the chart " + _MEDIA + " and keep it under 300 px",
    "the limit is 50 requests per second, not 500",
    "lorem ipsum dolor sit amet " * 30,
]
_RESULTS = [
    "ok",
    "FAILED tests/test_pay.py::test_total - ValueError: [PAY-17] bad total\n1 failed in 0.2s",
    "error: cannot open file src/x.py (E404)\nTraceback (most recent call last):\n  boom",
    "===== 3 passed in 1.2s =====",
    "- [x] migrate the schema",
    "pixels: " + _MEDIA,
    "",
]


def _call(draw: st.DrawFn, i: int) -> ToolCall:
    kind = draw(st.sampled_from(["read", "edit", "bash", "todo", "odd"]))
    if kind == "read":
        return ToolCall(f"c{i}", "read_file", {"path": draw(st.sampled_from(["src/a.py", "docs/x.md", "a b/c.txt"]))})
    if kind == "edit":
        return ToolCall(f"c{i}", "edit_file", {"file_path": "src/a.py", "paths": ["src/a.py", "src/b.py"]})
    if kind == "bash":
        cmd = draw(st.sampled_from(["pytest -q", "make   build", "echo " + _MEDIA]))
        return ToolCall(f"c{i}", "bash", {"command": cmd})
    if kind == "todo":
        status = draw(st.sampled_from(["pending", "in_progress", "completed", True]))
        items = [{"content": "ship the docs", "status": status}, {"content": "fix the parser", "status": "pending"}]
        return ToolCall(f"c{i}", "write_todos", {"todos": items, "command": "x"})
    return ToolCall(f"c{i}", "custom", {"n": 3, "path": 7, "file": "ok.txt\nno"})


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = [Message.system("you are a coder")]
    n = 0
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["user", "assistant", "calls"]))
        text = draw(st.sampled_from(_TEXTS))
        if kind == "user":
            out.append(Message.user(text or "hi"))
        elif kind == "assistant":
            out.append(Message.assistant(text))
        else:
            calls = []
            for _ in range(draw(st.integers(1, 3))):
                n += 1
                calls.append(_call(draw, n))
            out.append(Message.assistant(text, tool_calls=tuple(calls)))
            for call in calls:
                if draw(st.booleans()):  # some results never came, some are errors
                    result = draw(st.sampled_from(_RESULTS))
                    out.append(Message.tool_result(call.id, result, is_error=draw(st.booleans())))
    return out


def _fresh(messages: Sequence[Message]) -> list[Message]:
    """The same messages, nothing read of them yet."""
    return [m.evolve() for m in messages]


def _reference(messages: Sequence[Message], seqs: Sequence[int]) -> list[Entry]:
    """`observe` as it was before cues: every message read afresh, here."""
    results = {m.tool_call_id: m for m in messages if m.role == "tool" and m.tool_call_id}
    calls: dict[str, ToolCall] = {}
    out: list[Entry] = []
    replies = [i for i, m in enumerate(messages) if m.role == "assistant" and m.text.strip()]
    last_reply = replies[-1] if replies else -1
    for i, (m, seq) in enumerate(zip(messages, seqs, strict=True)):
        if m.is_summary or m.role == "system":
            continue
        if m.role == "tool":
            call = calls.get(m.tool_call_id or "")
            window = ledger._window(m.text, ledger._RESULT_WINDOW)
            errors = ledger.error_lines(window) if call is None or ledger._command(call) is None else []
            if errors:
                said = ledger._safe(" \u2026 ".join(errors), seq)
                rank = ledger._RANK_SAID if ledger._ERROR_CODE.search(said) else 1
                label = call.name if call is not None else "tool"
                text = ledger._one_line(f"{label}: {said}", ledger.ERROR)
                out.append(Entry(ledger.ERROR, "err:" + ledger._norm(errors[-1]), text, seq, rank))
            out.extend(ledger._checkboxes(window, seq, own=True))
            continue
        text = ledger._window(m.text, ledger._SCAN_WINDOW)
        if text.strip():
            out.extend(ledger._from_text(m.role, text, seq, plan=i == last_reply))
        for call in m.tool_calls:
            calls[call.id] = call
            out.extend(_reference_call(call, results.get(call.id), seq))
    return out


def _reference_call(call: ToolCall, result: Message | None, seq: int) -> list[Entry]:
    items = ledger._todo_items(call)
    if items:
        return [
            Entry(ledger.TASK, "task:" + ledger._norm(t), ledger._one_line(t, ledger.TASK), seq, r, s)
            for t, s in items
            for r in [ledger._RANK_TASK if s != ledger.DONE else 0]
        ]
    command = ledger._command(call)
    if command is not None:
        outcome, failed = ledger._outcome(result)
        shown = scrub_media(" ".join(command.split()), f"journal record {seq}")
        said = scrub_media(outcome, f"journal record {seq}")
        line = ledger._one_line(f"ran `{shown}` -> {said}", ledger.ARTIFACT)
        rank = (ledger._RANK_SAID if ledger._ERROR_CODE.search(outcome) else 2) if failed else 1
        return [Entry(ledger.ARTIFACT, "cmd:" + ledger._norm(command), line, seq, rank)]
    action, rank = ledger._action(call.name)
    failed = result is not None and result.is_error
    note = f" (failed: {clip_line(result.text.strip(), 80)})" if failed and result is not None else ""
    return [
        Entry(ledger.ARTIFACT, "path:" + p, f"{p} \u2014 {action}{note}", seq, rank) for p in ledger._paths(call)
    ]


@settings(max_examples=300, deadline=None)
@given(conversations(), st.integers(1, 10**6), st.integers(1, 10**6))
def test_cues_give_what_reading_afresh_gives_under_any_record_numbers(
    messages: list[Message], first: int, again: int
) -> None:
    seqs = list(range(first, first + len(messages)))
    assert observe(messages, seqs) == _reference(_fresh(messages), seqs)  # read now, kept
    other = list(range(again, again + len(messages)))
    assert observe(messages, other) == _reference(_fresh(messages), other)  # kept, other records
    appended = State(agent_id="a").append(*_fresh(messages)).messages  # read as they arrive
    assert observe(appended, other) == _reference(_fresh(messages), other)


@settings(max_examples=100, deadline=None)
@given(conversations(), st.integers(1, 10**6))
def test_a_ledger_from_cues_renders_what_one_read_afresh_renders(messages: list[Message], first: int) -> None:
    seqs = list(range(first, first + len(messages)))
    read = State(agent_id="a").append(*messages).messages
    assert render(carry([], read, seqs)) == render(carry([], _fresh(messages), seqs))


def test_media_names_the_record_it_is_kept_in_whichever_record_that_is() -> None:
    """A text with media in it gives entries that name its journal record: its cues are not
    kept (the next read is afresh), so a record number is never carried to another."""
    m = Message.user("see the chart " + _MEDIA + " and keep it under 300 px")
    first = observe([m], [11])
    second = observe([m], [22])
    assert first and "journal record 11" in first[0].text
    assert second and "journal record 22" in second[0].text and "record 11" not in second[0].text


def test_append_reads_the_cues_and_a_restored_state_does_not() -> None:
    """`State.append` reads each message's cues as it arrives (a compaction then only takes
    them); a state made whole from its messages (a restore, an import) does not: the first
    compaction reads them, in a worker thread past a few hundred messages."""
    msgs = [Message.user(f"we must keep port {8000 + i}") for i in range(5)]
    restored = State(agent_id="a", messages=_fresh(msgs))
    assert not cues_ready(restored.messages)
    appended = State(agent_id="a").append(*msgs)
    assert cues_ready(appended.messages)
    assert observe(appended.messages, [1, 2, 3, 4, 5]) == observe(restored.messages, [1, 2, 3, 4, 5])
    assert cues_ready(restored.messages)  # read by that first use, and kept


def test_a_message_under_a_new_id_keeps_its_cues_and_a_changed_one_does_not() -> None:
    m = State(agent_id="a").append(Message.user("we must keep port 8080")).messages[0]
    assert cues_ready([m._with_id("other")])
    changed = m.evolve(content="we must keep port 9090")
    assert not cues_ready([changed])
    assert "9090" in observe([changed], [1])[0].text


def test_a_copied_message_shares_its_cues_and_a_message_from_json_reads_them_again() -> None:
    """A message copies (`copy.copy`) with its cues (the "read afresh" marker, told by identity,
    stays itself); one decoded from JSON (a checkpoint, another process) has none."""
    import copy

    media = Message.user("see the chart " + _MEDIA + " and keep it under 300 px")
    plain = Message.user("we must keep port 8080")
    appended = State(agent_id="a").append(media, plain).messages
    copied = [copy.copy(m) for m in appended]
    decoded = [Message.from_json(m.to_json()) for m in appended]
    assert all(c._cues is a._cues for c, a in zip(copied, appended, strict=True))
    assert cues_ready(copied[1:]) and not cues_ready(decoded[1:])  # (the media: read afresh, never ready)
    for moved in (copied, decoded):
        assert observe(moved, [5, 6]) == _reference(_fresh(appended), [5, 6])


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
_KEYS = st.sampled_from(["path", "file_path", "paths", "command", "cmd", "todos", "items", "x", "PATH", "files"])


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(_KEYS | st.text(max_size=8), _JSON, max_size=5),
    st.text(max_size=300),
    st.text(max_size=300),
    st.booleans(),
)
def test_append_takes_any_call_and_text_and_the_cues_match_a_fresh_read(
    arguments: dict[str, object], said: str, output: str, failed: bool
) -> None:
    """Hostile tool arguments and texts: appending never fails on the cues, and what they give
    is what a fresh read gives."""
    call = ToolCall("c1", "tool", arguments)
    messages = [
        Message.user(said or "x"),
        Message.assistant(said, tool_calls=(call,)),
        Message.tool_result("c1", output, is_error=failed),
        Message.assistant(output),
    ]
    appended = State(agent_id="a").append(*messages).messages
    assert observe(appended, [1, 2, 3, 4]) == _reference(_fresh(messages), [1, 2, 3, 4])


def test_a_cue_that_cannot_be_read_never_fails_the_append(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cues are derived: a reading that raises leaves the message without them and the
    append goes on; the compaction that reads the message meets the error itself."""

    def broken(*args: object, **keywords: object) -> list[Entry]:
        raise RuntimeError("a bug in the ledger's reading")

    monkeypatch.setattr(ledger, "_from_text", broken)
    state = State(agent_id="a").append(Message.user("we must keep port 8080"))
    assert state.messages[0]._cues is None and not cues_ready(state.messages)
    with pytest.raises(RuntimeError, match="ledger's reading"):
        observe(state.messages, [1])


_DASHED = "-" * 300 + "Ab1x" * 150  # a payload only once its sentence's leading dashes are stripped


@pytest.mark.parametrize("media", [_MEDIA, _DASHED])
@pytest.mark.parametrize("before", [0, 60, 70, 120, 200])
@pytest.mark.parametrize("after", [20, 140, 300])
def test_media_clipped_out_of_an_entry_still_reads_afresh(media: str, before: int, after: int) -> None:
    """A text whose media placeholder the entry's line clips (cut in the middle, or only partly
    kept) or only its key holds: the record it names differs from record to record, so its
    entries are never kept for another record (nor when only a sentence of it, not the whole
    text, holds what looks like a payload)."""
    m = Message.user(f"We must keep port 8080 {'x' * before}.\n{media} is the key {'y' * after}.")
    observe([m], [1])  # read once, under record 1
    for seq in (5, 123_456):
        assert observe([m], [seq]) == _reference(_fresh([m]), [seq])
    appended = State(agent_id="a").append(m.evolve()).messages
    assert observe(appended, [5]) == _reference(_fresh([m]), [5])


def test_messages_read_afresh_each_time_are_not_ready() -> None:
    """`cues_ready` lets the compactor read the ledger in the trio thread, on the promise that it
    only takes what was read: a text with media is read afresh by every compaction (a sentence
    with a payload in it takes the decision patterns a millisecond), so it is not ready."""
    plain = Message.user("we must keep port 8080")
    media = Message.user("see the chart " + _MEDIA + " and keep it under 300 px")
    appended = State(agent_id="a").append(plain, media, Message.assistant("done.")).messages
    assert cues_ready([appended[0], appended[2]])
    assert not cues_ready(appended)


@pytest.mark.parametrize("error_line", [False, True])
def test_appending_a_huge_failed_result_reads_only_its_window(error_line: bool) -> None:
    """`State.append` leaves a text past `ENCODE_LATER` to a worker thread (the trio thread runs
    every agent): its cues read only the result's window, whatever its size, not a copy of the
    whole text split into lines (a 30 MB failing log took 260 ms and 85 MB at the append)."""
    import tracemalloc

    huge = "\n  " + "a line of a long test log, one of very many\n" * 500_000
    result = Message.tool_result("c1", huge + ("FAILED t.py::t - E: [E7] boom\n" if error_line else ""), is_error=True)
    tracemalloc.start()
    try:
        appended = State(agent_id="a").append(result).messages
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(huge) // 10
    call = Message.assistant("", tool_calls=(ToolCall("c1", "bash", {"command": "pytest"}),))
    assert observe([call, *appended], [1, 2]) == _reference(_fresh([call, result]), [1, 2])


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\u00a0ab"), max_size=30))
def test_a_failed_results_first_line_is_the_stripped_texts(text: str) -> None:
    assert ledger._outcome(Message.tool_result("c1", text or "x", is_error=True)) == (
        "failed: " + ((text or "x").strip().splitlines() or ["error"])[0],
        True,
    )


@pytest.mark.parametrize("spaced", [False, True])
def test_a_huge_failed_file_result_is_noted_from_its_ends(spaced: bool) -> None:
    """A failed file tool's line notes its result in 80 bytes: read from the result's ends, not
    the whole text split into words (the ledger reads cues in the trio thread: a 32 MB failed
    read took it 420 ms). A text whose ends are nearly all blank is still read whole."""
    import tracemalloc

    line = "permission denied while reading this very long line of the file\n"
    huge = (" " * 5_000 if spaced else "") + line * 200_000 + ("\n" * 5_000 if spaced else "")
    call = Message.assistant("", tool_calls=(ToolCall("c1", "read_file", {"path": "a.py"}),))
    messages = State(agent_id="a").append(call, Message.tool_result("c1", huge, is_error=True)).messages
    tracemalloc.start()
    try:
        found = observe(messages, [7, 8])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == _reference(_fresh(messages), [7, 8])
    assert spaced or peak < len(huge) // 10


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "bb", "\u00e9", "\u4e2d", "\U0001f600", " ", "\n", "\t", "\u2028", "xyz" * 9])))
def test_a_failed_results_note_from_its_ends_is_the_whole_texts(pieces: list[str]) -> None:
    text = "".join(pieces)
    window = ledger._BRIEF_WINDOW
    ledger._BRIEF_WINDOW = 30  # (texts past twice this are read from their ends)
    try:
        assert ledger._brief(text) == clip_line(text.strip(), 80)
    finally:
        ledger._BRIEF_WINDOW = window
