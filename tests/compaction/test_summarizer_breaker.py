"""A weak model summarizer costs little: it is skipped for a while once it keeps failing.

- `SummarizerBreaker`: after `threshold` compactions in a row in which the primary summarizer
  gave up, the next `cooldown` compactions skip it (its fallbacks write the summaries); then it
  is tried again, and a failure suspends it for twice as long (capped), a success closes it.
- A compactor with nothing to fall back to never skips its summarizer.
- A cut-off answer whose input cannot be cut smaller is not asked for again.
- An agent's model summarizer has one retry and a breaker; a callable summarizer has neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes import STRUCTURED, ScriptedSummaryModel

import cmdc
from cmdc import Compacted, CompactionError, Compactor, ConfigError, Message, State
from cmdc.compaction import ExtractiveSummarizer, SummarizerBreaker
from cmdc.events import SUMMARIZER_ATTEMPT, SUMMARIZER_FALLBACK, SUMMARIZER_SUSPENDED, Event
from cmdc.testing import drain

OFF_TASK = ("You are correct, when using gunicorn you should set the timeout.", "stop")
GOOD = (STRUCTURED, "stop")


def history(turns: int, start: int = 0) -> list[Message]:
    out: list[Message] = []
    for i in range(start, start + turns):
        out += [Message.user(f"question {i}: " + "word " * 40), Message.assistant(f"answer {i}: " + "text " * 40)]
    return out


def fresh(tmp_path: Path, n: int) -> State:
    cfg = {"compact_offload_dir": str(tmp_path), "compact_keep": ("messages", 2)}
    return State(agent_id=f"a{n}", messages=history(3, 10 * n), config=cfg)


def test_the_breaker_suspends_doubles_and_closes() -> None:
    b = SummarizerBreaker(threshold=2, cooldown=2, max_cooldown=5)
    assert b.admit() and b.record(False) == 0  # one failure: still asked
    assert b.admit() and b.record(False) == 2  # two in a row: suspended for 2
    assert [b.admit(), b.admit(), b.admit()] == [False, False, True]
    assert b.record(False) == 4  # the try after a suspension failed: twice as long
    assert [b.admit() for _ in range(5)] == [False] * 4 + [True]
    assert b.record(False) == 5  # capped at max_cooldown
    assert [b.admit() for _ in range(6)] == [False] * 5 + [True]
    assert b.record(True) == 0 and b.failures == 0 and b.suspended_for == 0
    assert b.admit() and b.record(False) == 0  # closed: the threshold counts again from zero


def test_a_success_between_failures_resets_the_count() -> None:
    b = SummarizerBreaker(threshold=2)
    for ok in (False, True, False, True, False):
        assert b.admit() and b.record(ok) == 0


@pytest.mark.parametrize("field", ["threshold", "cooldown", "max_cooldown"])
@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", None])
def test_breaker_settings_are_checked(field: str, bad: Any) -> None:
    with pytest.raises(ConfigError, match=field):
        SummarizerBreaker(**{field: bad})


@pytest.mark.parametrize("bad", [object(), 3, "breaker", SummarizerBreaker])
def test_the_compactor_checks_its_breaker(bad: Any) -> None:
    with pytest.raises(ConfigError, match="breaker"):
        Compactor(breaker=bad)


async def test_a_failing_model_is_skipped_then_tried_again(tmp_path: Path) -> None:
    model = ScriptedSummaryModel(OFF_TASK)
    events: list[Event] = []
    compactor = Compactor(
        model,
        fallbacks=[ExtractiveSummarizer()],
        retries=0,
        retry_backoff=0,
        breaker=SummarizerBreaker(threshold=2, cooldown=2),
        on_event=events.append,
    )
    asked = []
    for n in range(7):
        before = len(model.requests)
        result = await compactor.force_compact(fresh(tmp_path, n))
        assert isinstance(result, Compacted)  # every compaction succeeds: the fallback wrote it
        assert "## Primary request and intent" in next(m for m in result.state.messages if m.is_summary).text
        asked.append(len(model.requests) > before)
    # asked, asked (2 failures: suspended 2), skipped x2, asked (failed: suspended 4), skipped x2 (of 4)
    assert asked == [True, True, False, False, True, False, False]
    suspended = [e.data for e in events if e.kind == SUMMARIZER_SUSPENDED]
    assert [(d["failures"], d["compactions"]) for d in suspended] == [(2, 2), (3, 4)]
    assert all("lacks the sections" in d["error"] for d in suspended)
    fallbacks = [e.data for e in events if e.kind == SUMMARIZER_FALLBACK]
    assert len(fallbacks) == 7 and all(d["summarizer"] == "extractive" for d in fallbacks)
    skipped = [d for d, a in zip(fallbacks, asked, strict=True) if not a]
    assert all("suspended after failing" in d["error"] for d in skipped)
    primary = [e for e in events if e.kind == SUMMARIZER_ATTEMPT and e.data["role"] == "primary"]
    assert len(primary) == asked.count(True)  # no attempt is made (or reported) while suspended


async def test_a_model_that_recovers_is_used_again(tmp_path: Path) -> None:
    model = ScriptedSummaryModel(OFF_TASK, OFF_TASK, GOOD)
    compactor = Compactor(
        model, fallbacks=[ExtractiveSummarizer()], retries=0, breaker=SummarizerBreaker(threshold=2, cooldown=1)
    )
    for n in range(5):
        result = await compactor.force_compact(fresh(tmp_path, n))
        assert isinstance(result, Compacted)
    # 2 failures, one skipped compaction, then a good summary: closed, asked every time since
    assert len(model.requests) == 4
    assert compactor.breaker is not None and compactor.breaker.failures == 0 and compactor.breaker.skipping == 0
    summary = next(m for m in result.state.messages if m.is_summary)
    assert "- noted" in summary.text  # the model's summary, not the extractive one


async def test_without_a_fallback_the_model_is_always_asked(tmp_path: Path) -> None:
    model = ScriptedSummaryModel(OFF_TASK)
    compactor = Compactor(model, retries=0, breaker=SummarizerBreaker(threshold=1, cooldown=5))
    for n in range(3):
        with pytest.raises(CompactionError, match="lacks the sections"):
            await compactor.force_compact(fresh(tmp_path, n))
    assert len(model.requests) == 3


async def test_a_cut_off_answer_with_no_smaller_input_is_not_asked_again(tmp_path: Path) -> None:
    model = ScriptedSummaryModel((STRUCTURED[:50], "length"))
    events: list[Event] = []
    cfg = {"compact_offload_dir": str(tmp_path), "compact_keep": ("messages", 1)}
    # One message to summarize: no chunk can be smaller than it.
    state = State(agent_id="one", messages=[Message.user("x " * 400), Message.assistant("ok")], config=cfg)
    compactor = Compactor(model, pin_task=False, fallbacks=[ExtractiveSummarizer()], retries=3, on_event=events.append)
    result = await compactor.force_compact(state)
    assert isinstance(result, Compacted)
    assert len(model.requests) == 1  # not three more identical requests
    [fallback] = [e for e in events if e.kind == SUMMARIZER_FALLBACK]
    assert "cut off" in fallback.data["error"]


async def test_an_agents_model_summarizer_gets_one_retry_and_a_breaker(tmp_path: Path) -> None:
    summarizer = ScriptedSummaryModel(OFF_TASK)
    chat = cmdc.providers.ScriptedProvider(["ok"], cycle=True)
    config = {"compact_offload_dir": str(tmp_path), "compact_keep": ("messages", 2), "compact_trigger": ("messages", 6)}
    async with cmdc.open_runtime(log_events=False) as rt:
        with rt.subscribe("a1", buffer=1_000) as sub:
            agent = await rt.spawn("a1", chat, summarizer=summarizer, config=config)
            for i in range(11):
                await agent.prompt(f"question {i}: " + "word " * 30)
            state = await agent.state()
            events = drain(sub)
    compactions = [e for e in events if e.kind == "compaction_end"]
    assert state.compactions == len(compactions) == 8
    # Compactions 1-2 ask the model twice each (one retry), 3-6 skip it, 7 tries it again
    # (twice) and suspends it for 8.
    assert len(summarizer.requests) == 6
    suspended = [e.data for e in events if e.kind == SUMMARIZER_SUSPENDED]
    assert [(d["failures"], d["compactions"]) for d in suspended] == [(2, 4), (3, 8)]
    assert sum(e.kind == SUMMARIZER_FALLBACK for e in events) == len(compactions)


async def test_a_callable_summarizer_has_no_breaker(tmp_path: Path) -> None:
    calls = []

    async def summarize(messages: Any, instruction: str) -> str:
        calls.append(len(messages))
        return STRUCTURED

    chat = cmdc.providers.ScriptedProvider(["ok"], cycle=True)
    config = {"compact_offload_dir": str(tmp_path), "compact_keep": ("messages", 2), "compact_trigger": ("messages", 6)}
    async with cmdc.open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", chat, summarizer=summarize, config=config)
        for i in range(8):
            await agent.prompt(f"question {i}")
        assert (await agent.state()).compactions == len(calls) >= 2
