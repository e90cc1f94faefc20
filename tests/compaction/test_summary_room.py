"""A summary needs room, and a truncated or off-task answer is not a summary.

- A model summarizer's request fits its window: input + the summary's output budget, in chunks
  otherwise, whatever the agent's own trigger.
- An answer that stopped on its output limit (`length` / `max_tokens`), or a model's answer
  without the sections its prompt asked for, is a failed attempt by default; a cut-off one is
  retried with smaller chunks.
- An agent whose model summarizer fails every attempt falls back to the offline
  `ExtractiveSummarizer`, with a `summarizer_fallback` event; a bare `Compactor` still fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes import SECTIONS, STRUCTURED, ScriptedSummaryModel, make_state

import cmdc
from cmdc import Compacted, CompactionError, Compactor, ConfigError, Message
from cmdc.compaction import SummaryAttempt, default_should_retry
from cmdc.compaction.config import DEFAULT_SUMMARY_PROMPT
from cmdc.compaction.summary import missing_sections
from cmdc.events import SUMMARIZER_ATTEMPT, SUMMARIZER_FALLBACK, Event
from cmdc.testing import drain
from cmdc.tokens import estimate_tokens_from_messages

WINDOW = 2_048


KEEP = ("messages", 2)
"""The summary-room tests keep the last two messages."""


def history(turns: int, words: int = 120) -> list[Message]:
    out: list[Message] = []
    for i in range(turns):
        text = " ".join(f"w{i}x{j}" for j in range(words))
        out += [Message.user(f"question {i}: {text}"), Message.assistant(f"answer {i}: {text}")]
    return out


async def test_every_model_request_fits_the_window_with_its_output_budget(tmp_path: Path) -> None:
    model = ScriptedSummaryModel((STRUCTURED, "stop"))
    state = make_state(
        tmp_path, history(20), compact_keep=KEEP, context_window=WINDOW, compact_trigger=("tokens", 1_000_000)
    )
    assert state.token_usage > 3 * WINDOW  # far more than one request can hold
    result = await Compactor(model, pin_task=False).force_compact(state)
    assert isinstance(result, Compacted)
    assert len(model.requests) > 1  # chunked
    for request in model.requests:
        assert request.max_output_tokens is not None
        assert estimate_tokens_from_messages(request.messages) + request.max_output_tokens <= WINDOW


async def test_the_summarizers_own_window_wins(tmp_path: Path) -> None:
    model = ScriptedSummaryModel((STRUCTURED, "stop"))
    state = make_state(
        tmp_path, history(6), compact_keep=KEEP, context_window=100_000, compact_trigger=("tokens", 1_000_000)
    )
    result = await Compactor(model, pin_task=False, summarizer_window=1_024).force_compact(state)
    assert isinstance(result, Compacted) and len(model.requests) > 1
    for request in model.requests:
        assert estimate_tokens_from_messages(request.messages) + (request.max_output_tokens or 0) <= 1_024


async def test_without_a_known_window_the_request_is_whole(tmp_path: Path) -> None:
    model = ScriptedSummaryModel((STRUCTURED, "stop"))
    result = await Compactor(model, pin_task=False).force_compact(make_state(tmp_path, history(6), compact_keep=KEEP))
    assert isinstance(result, Compacted) and len(model.requests) == 1


@pytest.mark.parametrize("bad", [0, -5, True, 2.5, "2048"])
def test_summarizer_window_is_checked(bad: Any) -> None:
    with pytest.raises(ConfigError, match="summarizer_window"):
        Compactor(summarizer_window=bad)


@pytest.mark.parametrize("stop", ["length", "max_tokens"])
async def test_a_cut_off_summary_is_refused_and_retried_with_smaller_chunks(tmp_path: Path, stop: str) -> None:
    model = ScriptedSummaryModel((STRUCTURED[:60], stop), (STRUCTURED, "stop"))
    events: list[Event] = []
    state = make_state(tmp_path, history(6), compact_keep=KEEP)
    result = await Compactor(model, pin_task=False, retry_backoff=0, on_event=events.append).force_compact(state)
    assert isinstance(result, Compacted)
    summary = next(m for m in result.state.messages if m.is_summary)
    assert "## Next step" in summary.text  # the finished answer, not the cut one
    attempts = [e for e in events if e.kind == SUMMARIZER_ATTEMPT]
    assert [e.data["ok"] for e in attempts] == [False, True]
    assert "cut off" in attempts[0].data["error"] and stop in attempts[0].data["error"]
    whole = estimate_tokens_from_messages(model.requests[0].messages)
    assert len(model.requests) >= 3  # the retry read the input in (smaller) chunks
    assert all(estimate_tokens_from_messages(r.messages) < whole for r in model.requests[1:])


async def test_an_off_task_answer_is_refused(tmp_path: Path) -> None:
    off_task = "You are correct, when using gunicorn you should set the timeout."
    model = ScriptedSummaryModel((off_task, "stop"), (STRUCTURED, "stop"))
    events: list[Event] = []
    state = make_state(tmp_path, history(6), compact_keep=KEEP)
    result = await Compactor(model, pin_task=False, retry_backoff=0, on_event=events.append).force_compact(state)
    assert isinstance(result, Compacted)
    errors = [e.data["error"] for e in events if e.kind == SUMMARIZER_ATTEMPT and not e.data["ok"]]
    assert len(errors) == 1 and "lacks the sections" in errors[0] and "Next step" in errors[0]


async def test_a_bare_compactor_still_fails_when_every_attempt_is_refused(tmp_path: Path) -> None:
    model = ScriptedSummaryModel(("Sure! Here is some text.", "stop"))
    state = make_state(tmp_path, history(6), compact_keep=KEEP)
    with pytest.raises(CompactionError, match="lacks the sections"):
        await Compactor(model, pin_task=False, retries=1, retry_backoff=0).force_compact(state)


async def test_an_agent_falls_back_to_the_extractive_summarizer(tmp_path: Path) -> None:
    summarizer = ScriptedSummaryModel(("truncated mid-sent", "length"))
    chat = cmdc.providers.ScriptedProvider(["ok"], cycle=True)
    config = {"compact_offload_dir": str(tmp_path), "compact_keep": ("messages", 2), "compact_trigger": ("messages", 8)}
    async with cmdc.open_runtime(log_events=False) as rt:
        with rt.subscribe("a1", buffer=1_000) as sub:
            agent = await rt.spawn("a1", chat, summarizer=summarizer, config=config)
            for m in history(4):
                await agent.send(m)
            await agent.prompt("go on")
            state = await agent.state()
            events = drain(sub)
    assert state.compactions == 1
    summary = next(m for m in state.messages if m.is_summary)
    assert "## Primary request and intent" in summary.text  # the extractive summarizer's sections
    [fallback] = [e for e in events if e.kind == SUMMARIZER_FALLBACK]
    assert fallback.data["summarizer"] == "extractive" and "cut off" in fallback.data["error"]
    attempts = [e for e in events if e.kind == SUMMARIZER_ATTEMPT]
    assert [e.data["ok"] for e in attempts] == [False] * 2 + [True]  # an agent's model summarizer: one retry


def test_missing_sections_reads_headings_in_their_common_forms() -> None:
    answer = "## Primary request and intent\nx\n**Key concepts**\n1. Files and code\n### errors and fixes:\n"
    assert missing_sections(answer, DEFAULT_SUMMARY_PROMPT) == SECTIONS[4:]
    assert missing_sections(STRUCTURED, DEFAULT_SUMMARY_PROMPT) == []
    assert missing_sections("anything", "Summarize the conversation.") == []  # no structure asked for


def test_the_default_predicate() -> None:
    def attempt(answer: str | None, stop: str | None = "stop", error: BaseException | None = None) -> SummaryAttempt:
        return SummaryAttempt(1, "m", "primary", answer, error, (), stop, DEFAULT_SUMMARY_PROMPT)

    assert not default_should_retry(attempt(STRUCTURED))
    assert default_should_retry(attempt(STRUCTURED, "length"))
    assert default_should_retry(attempt(STRUCTURED, "max_tokens"))
    assert default_should_retry(attempt("plain prose"))  # a model's answer without its sections
    assert not default_should_retry(attempt("plain prose", None))  # a callable's: judged on emptiness
    assert default_should_retry(attempt("   ", None))
    assert default_should_retry(attempt(None, None, RuntimeError("down")))
    half = "\n".join(f"## {name}" for name in SECTIONS[:4])
    assert not default_should_retry(attempt(half))  # half the sections is enough
    assert default_should_retry(attempt("\n".join(f"## {name}" for name in SECTIONS[:3])))
