"""The Compactor: triggers, the write-ahead offload, summaries (chained, chunked, by a provider,
extractive), the tool-pair property end to end, custom counters."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
from fakes import asst, check_pairs, conversations, res, state_in
from hypothesis import given, settings
from hypothesis import strategies as st

from cmdc import (
    Compacted,
    Compactor,
    ContextOverflow,
    Event,
    Message,
    OffloadStore,
    Skipped,
    State,
    TokenUsage,
)
from cmdc import tokens as tokens_mod
from cmdc.compaction.config import Threshold
from cmdc.compaction.ledger import without_ledger
from cmdc.providers import ModelRequest
from cmdc.testing import RecordingSummarizer, conversation


async def test_below_threshold_is_skipped(tmp_path: Path) -> None:
    state = state_in(tmp_path, conversation(20))
    result = await Compactor(RecordingSummarizer()).maybe_compact(state)
    assert isinstance(result, Skipped) and result.state is state
    assert not (tmp_path / "offload").exists()


async def test_compaction_replaces_evicted_with_a_summary(tmp_path: Path) -> None:
    msgs = conversation(60)
    state = state_in(tmp_path, msgs, compact_trigger=("messages", 50))
    events: list[Event] = []
    summarizer = RecordingSummarizer()
    result = await Compactor(summarizer, on_event=events.append).maybe_compact(state)
    assert isinstance(result, Compacted)
    new, report = result.state, result.report
    system, task, summary, *rest = new.messages
    kept = [task, *rest]
    assert system == msgs[0] and summary.is_summary and summary.role == "user"
    assert task == msgs[1]  # the pinned task keeps its place: before the summary of what followed it
    assert "the summary" in summary.text and report.offload_path in summary.text
    assert summary.metadata["cmdc.offload_path"] == report.offload_path
    assert (summary.metadata["cmdc.first_seq"], summary.metadata["cmdc.last_seq"]) == (1, report.evicted)
    offloaded = await OffloadStore(tmp_path / "offload").read("a1")
    assert kept[0] == msgs[1]  # the session's task (its first user message) stays verbatim
    assert [m.id for m in offloaded] + [m.id for m in kept[1:]] == [m.id for m in msgs[2:]]
    assert list(summarizer.calls[0].messages) == offloaded  # the pinned task stays verbatim: not read, not restated
    check_pairs(kept, msgs)
    assert new.compactions == 1 and report.compaction == 1
    assert report.reason == "auto" and report.evicted == len(offloaded)
    assert report.messages_before == 60 and report.messages_after == len(new.messages)
    assert report.tokens_after < report.tokens_before and report.tokens_after == new.token_usage
    assert report.attempts == 1 and report.summarizer == "RecordingSummarizer"
    assert [e.kind for e in events] == ["compaction_start", "summarizer_attempt", "compaction_end"]
    assert events[-1].data["report"] == report
    # The baseline is invalidated: kept replies' usage predates the compaction.
    assert new.last_usage is None
    assert new.token_usage == tokens_mod.estimate_tokens_from_messages(new.messages)


async def test_usage_baseline_triggers_even_when_the_estimate_is_small(tmp_path: Path) -> None:
    msgs = [Message.user("hi"), Message.assistant("ok", usage=TokenUsage(input_tokens=10_000, output_tokens=1))]
    state = state_in(tmp_path, msgs, compact_trigger=("tokens", 10_000))
    assert tokens_mod.estimate_tokens_from_messages(msgs) < 100
    assert Compactor().should_compact(state)
    assert not Compactor().should_compact(state_in(tmp_path, msgs, compact_trigger=("tokens", 10_002)))


async def test_triggers_any_one_fires(tmp_path: Path) -> None:
    state = state_in(
        tmp_path,
        conversation(30),
        context_window=10**9,
        compact_trigger=[("tokens", 10**8), ("fraction", 0.5), ("messages", 30)],
    )
    assert Compactor().should_compact(state)
    state = state_in(
        tmp_path, conversation(29), context_window=10**9, compact_trigger=[("tokens", 10**8), ("messages", 30)]
    )
    assert not Compactor().should_compact(state)


def test_should_compact_cost_does_not_grow_with_history(monkeypatch: pytest.MonkeyPatch) -> None:
    small = State(agent_id="a", messages=conversation(50), config={"compact_trigger": ("tokens", 10**9)})
    big = State(agent_id="a", messages=conversation(50_000), config={"compact_trigger": ("tokens", 10**9)})
    reply = Message.assistant("r", usage=TokenUsage(input_tokens=5_000, output_tokens=5))
    tail = (reply, Message.user("x" * 100), Message.user("y" * 100))
    small, big = small.append(*tail), big.append(*tail)

    calls = 0
    real = tokens_mod._estimate

    def counting(m: Message) -> int:
        nonlocal calls
        calls += 1
        return real(m)

    monkeypatch.setattr(tokens_mod, "_estimate", counting)
    compactor = Compactor()
    counts = []
    for state in (small, big):
        calls = 0
        assert not compactor.should_compact(state)
        counts.append(calls)
    assert counts[0] == counts[1]

    # A custom counter is asked about the messages after the baseline only, once per state.
    seen: list[str] = []

    def counter(m: Message) -> int:
        seen.append(m.id)
        return 1

    custom = Compactor(token_counter=counter)
    counts = []
    for state in (small, big):
        seen.clear()
        custom.should_compact(state)
        custom.should_compact(state)
        counts.append(len(seen))
    assert counts == [len(s.messages) - s.baseline_index - 1 for s in (small, big)]
    assert counts[0] == counts[1] == 2


async def test_custom_token_counter_drives_the_trigger(tmp_path: Path) -> None:
    state = state_in(tmp_path, [Message.user("a"), Message.user("b")], compact_trigger=("tokens", 1000))
    assert not Compactor().should_compact(state)
    assert Compactor(token_counter=lambda m: 500).should_compact(state)


async def test_chained_compaction_sees_the_previous_summary(tmp_path: Path) -> None:
    summarizer = RecordingSummarizer()
    compactor = Compactor(summarizer)
    state = state_in(tmp_path, conversation(40))
    first = await compactor.force_compact(state)
    assert isinstance(first, Compacted)
    state2 = first.state.append(*conversation(30, seed=9, system=False))
    second = await compactor.force_compact(state2, reason="manual")
    assert isinstance(second, Compacted)
    first_summary = next(m for m in first.state.messages if m.is_summary)
    inputs = summarizer.calls[1][0]
    # the previous summary comes first; its ledger sections are carried in its metadata, so the
    # summarizer is not asked to restate them
    assert inputs[0].id == first_summary.id and inputs[0].text == without_ledger(first_summary.text)
    assert "## Requirements and values stated" in first_summary.text
    assert "## Requirements and values stated" not in inputs[0].text
    assert second.report.reason == "manual" and second.state.compactions == 2
    records = await OffloadStore(tmp_path / "offload").records("a1")
    seqs = [r.seq for r in records]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {r.compaction for r in records} == {1, 2}
    assert first_summary.id in {r.message.id for r in records if r.compaction == 2}
    assert second.report.first_seq == first.report.last_seq + 1


async def test_a_provider_can_summarize(tmp_path: Path) -> None:
    seen: list[ModelRequest] = []

    class Model:
        async def complete(self, request: ModelRequest) -> Message:
            seen.append(request)
            return Message.assistant("provider summary", usage=TokenUsage(input_tokens=5, output_tokens=2))

    state = state_in(
        tmp_path,
        [Message.user("read src/app.py"), asst("c1"), res("c1", "contents " * 300), Message.user("now")],
        compact_keep=("messages", 1),
    )
    result = await Compactor(Model(), pin_task=False).force_compact(state, instruction="focus on files")
    assert isinstance(result, Compacted) and "provider summary" in result.state.messages[0].text
    system, user = seen[0].messages
    assert system.role == "system" and system.text.endswith("focus on files")
    assert "read src/app.py" in user.text and "call t (id c1)" in user.text and "contents" in user.text


async def test_large_input_is_summarized_in_rolling_chunks(tmp_path: Path) -> None:
    msgs = conversation(200)
    summarizer = RecordingSummarizer("partial")
    state = state_in(tmp_path, msgs)
    result = await Compactor(summarizer, summarizer_input_tokens=2_000).force_compact(state)
    assert isinstance(result, Compacted)
    assert len(summarizer.calls) > 3
    seen_ids = [m.id for batch, _ in summarizer.calls for m in batch if not m.is_summary]
    offloaded = await OffloadStore(tmp_path / "offload").read("a1")
    assert seen_ids == [m.id for m in offloaded]  # every evicted one, in order (the kept task is not restated)
    for batch, _ in summarizer.calls[1:]:
        assert batch[0].is_summary and batch[0].text == "partial"


async def test_summarizer_overflow_halves_the_chunks(tmp_path: Path) -> None:
    sizes: list[int] = []

    async def small_window(messages: Sequence[Message], instruction: str) -> str:
        size = tokens_mod.estimate_tokens_from_messages(messages)
        sizes.append(size)
        if size > 3_000:
            raise ContextOverflow(prompt_tokens=size, limit=3_000)
        return "ok"

    state = state_in(tmp_path, conversation(200))
    result = await Compactor(small_window, retries=5, retry_backoff=0).force_compact(state)
    assert isinstance(result, Compacted) and max(sizes) > 3_000


async def test_nothing_to_evict_is_skipped(tmp_path: Path) -> None:
    state = state_in(tmp_path, [Message.system("s"), Message.user("only")])
    result = await Compactor().force_compact(state)
    assert isinstance(result, Skipped) and "nothing" in result.reason


async def test_extractive_default_summarizer(tmp_path: Path) -> None:
    msgs = [
        Message.user("Fix ticket ABC-123 in src/app.py"),
        asst("c1"),
        res("c1", "Traceback: KeyError\n" + "  a frame of the stack\n" * 100),
        Message.assistant("I patched src/app.py"),
        Message.user("also run tests"),
        Message.user("thanks"),
    ]
    result = await Compactor(pin_task=False).force_compact(state_in(tmp_path, msgs, compact_keep=("messages", 1)))
    assert isinstance(result, Compacted)
    text = result.state.messages[0].text
    for needle in ("Fix ticket ABC-123", "ABC-123", "src/app.py", "also run tests", "I patched", "KeyError"):
        assert needle in text
    assert result.report.summarizer == "extractive"


@settings(max_examples=150, deadline=None)
@given(
    conversations(),
    st.one_of(
        st.builds(Threshold, st.just("messages"), st.integers(1, 12)),
        st.builds(Threshold, st.just("tokens"), st.integers(1, 800)),
    ),
)
def test_force_compact_never_splits_pairs_nor_loses_a_message(msgs: list[Message], keep: Threshold) -> None:
    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            state = State(
                agent_id="p",
                messages=msgs,
                config={"compact_offload_dir": tmp, "compact_keep": (keep.mode, keep.value)},
            )
            result = await Compactor(RecordingSummarizer()).force_compact(state)
            if isinstance(result, Skipped):
                assert result.state is state
                return
            offloaded = await OffloadStore(tmp).read("p")
            lead = 0
            while lead < len(msgs) and msgs[lead].role == "system":
                lead += 1
            new = result.state.messages
            at = next(i for i, m in enumerate(new) if m.is_summary)
            assert new[:lead] == tuple(msgs[:lead]) and at >= lead
            kept = (*new[lead:at], *new[at + 1 :])
            order = {m.id: i for i, m in enumerate(msgs)}
            if offloaded:  # before the summary: only what is older than everything it replaces
                assert all(order[m.id] < min(order[o.id] for o in offloaded) for m in new[lead:at])
            check_pairs(kept, msgs)
            order = {m.id: i for i, m in enumerate(msgs)}
            ids = sorted(order[m.id] for m in (*msgs[:lead], *offloaded, *kept))
            assert ids == list(range(len(msgs)))
            pinned_before = [m for m in kept if order[m.id] < max(order[o.id] for o in offloaded)]
            if not pinned_before:
                assert [m.id for m in (*offloaded, *kept)] == [m.id for m in msgs[lead:]]

    trio.run(run)


def test_a_custom_counter_counts_only_new_messages_as_a_state_grows() -> None:
    counted: list[str] = []

    def counter(m: Message) -> int:
        counted.append(m.id)
        return 10

    compactor = Compactor(token_counter=counter)
    state = State(
        agent_id="a", messages=conversation(2_000, usage=False), config={"compact_trigger": ("tokens", 10**9)}
    )
    compactor.should_compact(state)
    assert len(counted) == len(state.messages)  # no usage reported: everything, once
    for i in range(5):
        counted.clear()
        state = state.append(Message.user(f"step {i}"), Message.assistant("ok"))
        assert not compactor.should_compact(state)
        assert len(counted) == 2  # only the appended messages
    assert compactor.estimate_tokens(state) == 10 * len(state.messages)
