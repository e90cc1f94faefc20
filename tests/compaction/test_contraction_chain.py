"""Compaction stays flat over a long life: the offline summarizer reads a bounded part of the
history, and 1,000 chained compactions with a huge trigger keep the summary's size, the
summarizer's input and the context flat. (Timing is the benchmark's: bench_compaction.)"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from pathlib import Path

import pytest

from cmdc import Compacted, Compactor, Message, State
from cmdc.providers import ExtractiveSummarizer
from cmdc.testing import conversation


def test_the_extractive_summary_does_not_depend_on_the_old_middle() -> None:
    """Only the start (the task, earlier summaries) and a bounded tail are read: a history
    with 4,000 old messages in its middle and one with 10 different ones summarize alike."""
    task = Message.user("Task: migrate the billing service to the new invoice schema.")
    tail = conversation(700, seed=3, system=False)
    long_middle = conversation(4_000, seed=1, system=False)
    short_middle = conversation(10, seed=2, system=False)
    summarizer = ExtractiveSummarizer()
    a = summarizer.summarize([task, *long_middle, *tail])
    b = summarizer.summarize([task, *short_middle, *tail])
    assert a == b
    assert task.text in a  # the task is read however old it is
    assert len(a.encode()) <= summarizer.max_chars


class Recording(ExtractiveSummarizer):
    """The default summarizer, recording what each call was given."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[tuple[int, int]] = []  # (messages, characters) per call

    async def __call__(self, messages: Sequence[Message], instruction: str) -> str:
        self.inputs.append((len(messages), sum(len(m.text) for m in messages)))
        return await super().__call__(messages, instruction)


async def test_1000_chained_compactions_stay_flat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not what this test is about
    summarizer = Recording()
    compactor = Compactor(summarizer)
    state = State(
        agent_id="chained",
        config={
            "compact_trigger": ("tokens", 10**9),
            "compact_keep": ("messages", 2),
            "compact_offload_dir": str(tmp_path),
        },
    )
    summary_tokens: list[int] = []
    sizes: list[tuple[int, int]] = []  # (messages, tokens) of the compacted context
    for i in range(1_000):
        state = state.append(*conversation(8, seed=10_000 + i, system=False, usage=False))
        result = await compactor.force_compact(state)
        assert isinstance(result, Compacted), result
        report = result.report
        assert report.tokens_after < report.tokens_before
        assert report.summary_tokens <= report.summary_budget
        state = result.state
        summary_tokens.append(report.summary_tokens)
        sizes.append((len(state.messages), compactor.estimate_tokens(state)))
    assert state.compactions == 1_000
    assert len(summarizer.inputs) == 1_000  # one attempt each
    # The summary grows while the preserved user messages fill their budget, then stays flat.
    early, late = summary_tokens[200:400], summary_tokens[-200:]
    assert max(late) <= max(early) * 1.05
    assert statistics.median(late) <= statistics.median(early) * 1.05
    # The work of a compaction does not grow with the history: the summarizer's input (the
    # previous summary and the new messages) and the compacted context stay flat.
    early_in, late_in = summarizer.inputs[200:400], summarizer.inputs[-200:]
    assert max(n for n, _ in late_in) <= max(n for n, _ in early_in)
    assert max(c for _, c in late_in) <= max(c for _, c in early_in) * 1.05
    assert max(n for n, _ in sizes[-200:]) <= max(n for n, _ in sizes[200:400])
    assert max(t for _, t in sizes[-200:]) <= max(t for _, t in sizes[200:400]) * 1.05
