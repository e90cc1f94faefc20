"""Compaction is a contraction: hard summary budgets, a bounded summarizer answer, the step-down
to a pointer-only summary, media placeholders, summaries that are compactable themselves, and
exact accounting. The property at the end ties them together."""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmdc import (
    Compacted,
    CompactionIncomplete,
    Compactor,
    Event,
    ImagePart,
    Message,
    OffloadStore,
    Skipped,
    State,
    TextPart,
    TokenUsage,
    ToolCall,
)
from cmdc.compaction.config import CompactConfig
from cmdc.compaction.summary import ANSWER_MARKER
from cmdc.message import KIND_KEY, PINNED_KEY, SUMMARY_KIND
from cmdc.providers import ModelRequest
from cmdc.tokens import estimate_message_tokens, estimate_text_tokens

PNG = base64.b64encode(bytes(range(256)) * 1_200).decode()  # ~400 KB of base64
DATA_URL = f"data:image/png;base64,{PNG}"


def config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"compact_offload_dir": str(tmp_path / "journal"), **extra}


def words(n: int, word: str = "detail") -> str:
    return " ".join(f"{word}{i}" for i in range(n))


def summaries(state: State) -> list[Message]:
    return [m for m in state.messages if m.is_summary]


# -- budgets -------------------------------------------------------------------------------------


def test_default_budgets_are_absolute_and_relative() -> None:
    c = Compactor()
    assert c.budgets(CompactConfig()) == (20_000, 13_333, 6_667)  # default trigger 170k: the cap
    big = CompactConfig.from_mapping({"context_window": 1_000_000, "compact_trigger": ("fraction", 0.9)})
    assert c.budgets(big)[0] == 20_000  # a 1M window does not lift the cap
    assert c.budgets(CompactConfig.from_mapping({"compact_trigger": ("tokens", 10**9)}))[0] == 20_000
    assert c.budgets(CompactConfig.from_mapping({"compact_trigger": ("tokens", 6_000)})) == (1_500, 1_000, 500)
    assert c.budgets(CompactConfig(), window=8_000)[0] == 2_000  # a window the model reported
    assert c.budgets(CompactConfig.from_mapping({"compact_trigger": ("tokens", 100)}))[0] == 256  # the floor
    assert Compactor(summary_budget=4_000).budgets(CompactConfig())[0] == 4_000
    assert Compactor(user_message_budget=10**6).budgets(CompactConfig())[1] == 15_000  # at most 3/4


async def test_a_10_mb_summarizer_answer_is_clipped_never_accepted_whole(tmp_path: Path) -> None:
    async def flood(messages: Sequence[Message], instruction: str) -> str:
        return "## Current work\n" + "blah " * 2_000_000

    msgs = [Message.user("task"), *(Message.assistant(words(2_000)) for _ in range(10)), Message.user("last")]
    state = State(agent_id="a", messages=msgs, config=config(tmp_path, compact_keep=("messages", 1)))
    result = await Compactor(flood).force_compact(state)
    assert isinstance(result, Compacted)
    report = result.report
    assert report.summary_tokens <= report.summary_budget == 20_000
    assert report.tokens_after < report.tokens_before
    assert "bytes of the summarizer's answer clipped" in summaries(result.state)[0].text


async def test_a_provider_summarizer_gets_an_output_limit_and_its_overlong_answer_is_clipped(tmp_path: Path) -> None:
    seen: list[ModelRequest] = []

    class Verbose:
        async def complete(self, request: ModelRequest) -> Message:
            seen.append(request)
            return Message.assistant("x " * 100_000, usage=TokenUsage(input_tokens=10, output_tokens=50_000))

    msgs = [Message.user("task"), *(Message.assistant(words(300)) for _ in range(40)), Message.user("last")]
    cfg = config(tmp_path, compact_trigger=("tokens", 8_000), compact_keep=("messages", 1))
    result = await Compactor(Verbose()).force_compact(State(agent_id="a", messages=msgs, config=cfg))
    assert isinstance(result, Compacted)
    answer_budget = Compactor().budgets(CompactConfig.from_mapping(cfg))[2]
    # the answer's budget, less what the session ledger takes: here only its pointer lines to the
    # records it did not read (past ledger.READ_TOKENS of the 40 evicted messages)
    assert answer_budget == 667 and 600 <= (seen[0].max_output_tokens or 0) <= answer_budget
    assert result.report.summary_tokens <= 2_000


# -- the contraction rule ------------------------------------------------------------------------


async def test_small_evictions_never_grow_the_context(tmp_path: Path) -> None:
    """The issue's case: 5 user/assistant pairs of ~60 tokens, keep 2, offline summarizer."""
    msgs: list[Message] = []
    for i in range(5):
        msgs += [Message.user(f"question {i}: " + words(25, "q")), Message.assistant(f"answer {i}: " + words(25, "a"))]
    events: list[Event] = []
    state = State(agent_id="a", messages=msgs, config=config(tmp_path, compact_keep=("messages", 2)))
    result = await Compactor(on_event=events.append).force_compact(state)
    assert isinstance(result, Compacted)
    assert result.report.tokens_after < result.report.tokens_before
    if result.report.fallback is not None:
        assert any(e.kind == "compaction_fallback" for e in events)


async def test_falls_back_to_a_pointer_only_summary(tmp_path: Path) -> None:
    async def wordy(messages: Sequence[Message], instruction: str) -> str:
        return "a long-winded summary " * 400

    events: list[Event] = []
    msgs = [Message.user("task"), Message.assistant(words(40)), Message.assistant(words(40)), Message.user("last")]
    state = State(agent_id="a", messages=msgs, config=config(tmp_path, compact_keep=("messages", 1)))
    result = await Compactor(wordy, on_event=events.append).force_compact(state)
    assert isinstance(result, Compacted)
    summary = summaries(result.state)[0]
    assert result.report.fallback in ("clipped", "pointer only")
    assert result.report.tokens_after < result.report.tokens_before
    assert f"records {result.report.first_seq}-{result.report.last_seq}" in summary.text
    fallback = [e for e in events if e.kind == "compaction_fallback"]
    assert len(fallback) == 1 and fallback[0].data["fallback"] == result.report.fallback


async def test_pointer_only_when_nothing_else_is_smaller(tmp_path: Path) -> None:
    async def wordy(messages: Sequence[Message], instruction: str) -> str:
        return "a long-winded summary " * 400

    # Evicted: ~70 tokens. A summary with its header is larger; a pointer is not.
    msgs = [Message.user("task"), Message.assistant(words(30)), Message.user("last")]
    state = State(agent_id="a", messages=msgs, config=config(tmp_path, compact_keep=("messages", 1)))
    result = await Compactor(wordy).force_compact(state)
    assert isinstance(result, Compacted) and result.report.fallback == "pointer only"
    summary = summaries(result.state)[0]
    assert summary.metadata["cmdc.pointer_only"] is True and "use recall" in summary.text
    assert result.report.tokens_after < result.report.tokens_before


async def test_skipped_when_not_even_a_pointer_is_smaller(tmp_path: Path) -> None:
    msgs = [Message.user("task"), Message.assistant("ok"), Message.user("go"), Message.assistant("done")]
    state = State(agent_id="a", messages=msgs, config=config(tmp_path, compact_keep=("messages", 1)))
    result = await Compactor().force_compact(state)
    assert isinstance(result, Skipped) and result.state is state
    assert "cost no more than the smallest summary" in result.reason
    assert not (tmp_path / "journal").exists()  # decided before anything was written


async def test_the_kept_task_is_referred_to_not_restated(tmp_path: Path) -> None:
    task = "Migrate the billing service to the new invoice schema " + words(60, "req")
    msgs = [Message.user(task), *(Message.assistant(words(100)) for _ in range(6)), Message.user("last")]
    state = State(agent_id="a", messages=msgs, config=config(tmp_path, compact_keep=("messages", 1)))
    result = await Compactor().force_compact(state)
    assert isinstance(result, Compacted)
    text = summaries(result.state)[0].text
    assert "req30" not in text and "kept verbatim" in text
    assert any(m.text == task for m in result.state.messages)  # the task itself stays


# -- media ---------------------------------------------------------------------------------------


async def test_an_image_never_enters_the_summary_as_text(tmp_path: Path) -> None:
    image = Message.user((TextPart("what is wrong in this screenshot?"), ImagePart(DATA_URL, "image/png")))
    inline = Message.user(f"and this one: {DATA_URL}")
    msgs = [Message.user("task"), image, Message.assistant(words(100)), inline, Message.assistant(words(100))]
    msgs += [Message.user("last"), Message.assistant("ok")]
    state = State(agent_id="a", messages=msgs, config=config(tmp_path, compact_keep=("messages", 2)))
    seen: list[list[Message]] = []

    async def reader(messages: Sequence[Message], instruction: str) -> str:
        seen.append(list(messages))
        return "## Current work\nlooking at screenshots"

    for summarizer in (None, reader):
        result = await Compactor(summarizer).force_compact(state.evolve(agent_id=f"img{len(seen)}"))
        assert isinstance(result, Compacted)
        assert result.report.tokens_after < result.report.tokens_before
        text = "\n".join(m.text for m in result.state.messages)
        assert PNG[:64] not in text and "image/png" in text and "KB omitted" in text
        journal = await OffloadStore(tmp_path / "journal").read(result.state.agent_id)
        assert image in journal and inline in journal  # the journal keeps the originals whole
    assert all(PNG[:64] not in m.text for m in seen[0])


# -- summaries are compactable -------------------------------------------------------------------


async def test_a_summary_that_alone_is_over_budget_is_shrunk(tmp_path: Path) -> None:
    huge = Message.user("[Conversation summary #1] earlier\n\n" + words(30_000), metadata={KIND_KEY: SUMMARY_KIND})
    msgs = [Message.system("sys"), huge, *(Message.user(f"q{i}") for i in range(3)), Message.assistant("a")]
    cfg = config(tmp_path, compact_keep=("messages", 6), compact_trigger=("tokens", 8_000))
    state = State(agent_id="a", messages=msgs, config=cfg, compactions=1)
    result = await Compactor().force_compact(state)
    assert isinstance(result, Compacted)
    assert result.report.summary_tokens <= result.report.summary_budget == 2_000
    assert result.report.tokens_after < result.report.tokens_before // 10


# -- the property --------------------------------------------------------------------------------

text_st = st.one_of(
    st.text(max_size=300),
    st.text(alphabet="漢字かなカナ한국어😀🎉", min_size=1, max_size=600),
    st.builds(lambda n: words(n), st.integers(1, 800)),
    st.just(f"pasted: {DATA_URL[:20_000]}"),
)


@st.composite
def sessions(draw: st.DrawFn) -> list[Message]:
    """Conversations with tool calls (some pending), pins, images, CJK and emoji, huge texts."""
    out: list[Message] = [Message.system("sys")] if draw(st.booleans()) else []
    for r in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["user", "image", "pin", "tools", "assistant", "huge"]))
        if kind == "user":
            out.append(Message.user(draw(text_st)))
        elif kind == "image":
            out.append(Message.user((TextPart(draw(text_st)), ImagePart(DATA_URL, "image/png"))))
        elif kind == "pin":
            out.append(Message.user(draw(text_st), metadata={PINNED_KEY: True}))
        elif kind == "huge":
            out.append(Message.user(words(draw(st.integers(2_000, 12_000)))))
        elif kind == "assistant":
            out.append(Message.assistant(draw(text_st)))
        else:
            n = draw(st.integers(1, 3))
            calls = tuple(ToolCall(id=f"c{r}_{k}", name="read", arguments={"q": draw(text_st)}) for k in range(n))
            out.append(Message.assistant("", tool_calls=calls))
            answered = n if r < 9 else draw(st.integers(0, n))  # the last round may be pending
            out += [Message.tool_result(c.id, draw(text_st)) for c in calls[:answered]]
            if answered < n:
                break
    return out


def with_usage(messages: list[Message], count: Callable[[Message], int]) -> list[Message]:
    """An honest provider's usage on every assistant message without calls: the recount so far."""
    out, total = [], 0
    for m in messages:
        total += count(m)
        if m.role == "assistant" and not m.tool_calls:
            m = m.evolve(usage=TokenUsage(input_tokens=total - count(m), output_tokens=count(m)))
        out.append(m)
    return out


def chars(m: Message) -> int:  # a custom counter: characters / 3, plus framing
    return len(m.text) // 3 + sum(len(c.name) for c in m.tool_calls) + 5


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    sessions(),
    st.sampled_from([None, chars]),
    st.booleans(),
    st.sampled_from([("messages", 1), ("messages", 3), ("tokens", 200), ("fraction", 0.1)]),
    st.sampled_from([("tokens", 1_000), ("tokens", 100_000), ("messages", 4)]),
    st.sampled_from([None, "wordy", "flood"]),
)
def test_force_compact_is_a_contraction(
    msgs: list[Message],
    counter: Callable[[Message], int] | None,
    usage: bool,
    keep: tuple[str, Any],
    trigger: tuple[str, Any],
    summarizer: str | None,
) -> None:
    count = counter or estimate_message_tokens
    if usage:
        msgs = with_usage(msgs, count)

    async def wordy(messages: Sequence[Message], instruction: str) -> str:
        return "## Current work\n" + " ".join(m.text[:200] for m in messages)

    async def flood(messages: Sequence[Message], instruction: str) -> str:
        return "blah " * 300_000

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = {
                "compact_offload_dir": tmp,
                "compact_keep": keep,
                "compact_trigger": trigger,
                "context_window": 50_000,
            }
            state = State(agent_id="p", messages=msgs, config=cfg)
            compactor = Compactor(
                {"wordy": wordy, "flood": flood}.get(summarizer or ""), token_counter=counter, max_extra_passes=0
            )
            before = compactor.estimate_tokens(state)
            assert before == sum(count(m) for m in msgs) or usage
            try:
                result: Compacted | Skipped = await compactor.force_compact(state)
            except CompactionIncomplete as exc:  # compacted, but the kept part alone is over the trigger
                assert exc.state is not None and exc.report is not None
                result = Compacted(exc.state, exc.report)
            journal = await OffloadStore(tmp).read("p")
            if isinstance(result, Skipped):
                assert result.state is state and journal == []
                return
            new, report = result.state, result.report
            assert report.tokens_before == before
            assert report.tokens_after < report.tokens_before
            inserted = [m for m in new.messages if m.is_summary]
            assert len(inserted) == 1 and sum(count(m) for m in inserted) <= report.summary_budget
            assert report.summary_tokens <= report.summary_budget
            # no message lost: what stayed, plus the journal, is the original, once each
            stayed = [m for m in new.messages if not m.is_summary]
            assert sorted(m.id for m in stayed + journal) == sorted(m.id for m in msgs)
            # media never entered the summary as text
            assert PNG[:64] not in inserted[0].text
            # the incremental figure is the recount, and stays so as messages are appended
            assert compactor.estimate_tokens(new) == sum(count(m) for m in new.messages)
            grown = new.append(Message.user("next " * 50))
            assert compactor.estimate_tokens(grown) == sum(count(m) for m in grown.messages)

    trio.run(run)


def test_answer_marker_is_recognized() -> None:
    from cmdc.compaction import SummaryAttempt

    clipped = ANSWER_MARKER.format(omitted=10, note="")
    assert SummaryAttempt(1, "s", "primary", "x" + clipped, None).clipped
    assert not SummaryAttempt(1, "s", "primary", "fine", None).clipped
    assert estimate_text_tokens(clipped) < 40
