"""The last stage of a pass: what a compaction inserts is held to the contraction rule
(stepping down to a pointer-only summary when needed), then the new state, its report and the
`after_compact` fold. The `Compactor` makes a `Verification` per pass from its options; the
journal tags the state and its summaries carry live here too."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from .._report import Compacted, CompactionReport, Skipped
from ..events import COMPACTION_END, COMPACTION_FALLBACK, PLUGIN_ERROR
from ..message import Message, TokenUsage
from ..plugins import AfterCompact, fold
from ..state import State
from ..store.records import ATTEMPTS_KEY, JOURNAL_KEY, AppendResult
from .attempts import Summary
from .clip import contract
from .cutoff import Split
from .evict import Emit, held_before_evicted, plugin_error, skipped
from .ledger import LEDGER_KEY
from .options import CompactorOptions
from .summary import pointer_message


@attrs.frozen
class Verification:
    """The verify stage of one pass: `options` (the plugins), `count` (tokens of a message),
    `estimate` (of a state), `emit` (events)."""

    options: CompactorOptions
    count: Callable[[Message], int]
    estimate: Callable[[State], int]
    emit: Emit

    async def verify(
        self,
        state: State,
        split: Split,
        written: AppendResult,
        compaction: int,
        inserted: list[Message],
        summary: Summary,
        reason: str,
        budget: int,
        tokens_before: int,
        evicted_tokens: int,
        started: float,
    ) -> Compacted | Skipped:
        """What is inserted fits the budget and costs less than what it replaces (stepping down
        to a pointer when needed); then the new state, its report and the `after_compact` fold."""
        def smallest_summary() -> Message:  # tagged as it will be inserted: a counter may count its metadata
            smallest = pointer(compaction, len(split.evicted), str(written.path), written.first_seq, written.last_seq)
            carried = next((m.metadata[LEDGER_KEY] for m in inserted if LEDGER_KEY in m.metadata), None)
            if carried is not None:  # the next compaction carries the ledger on from the pointer
                smallest = smallest.evolve(metadata={**smallest.metadata, LEDGER_KEY: carried})
            return tag_summaries([smallest], written)[0]

        inserted, fallback = contract(inserted, min(budget, evicted_tokens - 1), smallest_summary, self.count)
        summary_tokens = sum(self.count(m) for m in inserted)
        if fallback is not None:
            self.emit(
                COMPACTION_FALLBACK,
                state,
                fallback=fallback,
                budget=budget,
                evicted_tokens=evicted_tokens,
                summary_tokens=summary_tokens,
            )
        if fallback == "skipped":  # not even a pointer is smaller (a custom counter's quirk)
            return skipped(self.emit, state, "not even a pointer-only summary is smaller than the evicted messages")
        # Kept messages older than everything evicted (the pinned task) stay before the summary.
        before = held_before_evicted(state, split)
        # (the summaries are tagged already: `summarized`, or `pointer`; a clipped one keeps its tags)
        messages = (*split.pinned, *split.kept[:before], *inserted, *split.kept[before:])
        new_state = state.evolve(
            messages=messages, compactions=compaction, usage_floor=len(messages), **journal_fields(state, written)
        )
        report = CompactionReport(
            reason=reason,
            tokens_before=tokens_before,
            tokens_after=self.estimate(new_state),
            messages_before=len(state.messages),
            messages_after=len(messages),
            evicted=len(split.evicted),
            offload_path=str(written.path),
            first_seq=written.first_seq,
            last_seq=written.last_seq,
            compaction=compaction,
            summary_tokens=summary_tokens,
            summarizer=summary.summarizer,
            attempts=summary.attempts,
            duration=trio.current_time() - started,
            summary_budget=budget,
            fallback=fallback,
            **_usage_fields(summary),
        )
        after = await self.after_compact(new_state, report)
        if after is not new_state:
            new_state = after
            report = attrs.evolve(report, tokens_after=self.estimate(after), messages_after=len(after.messages))
        report = attrs.evolve(report, duration=trio.current_time() - started)
        self.emit(COMPACTION_END, state, report=report)
        return Compacted(new_state, report)

    async def after_compact(self, state: State, report: CompactionReport) -> State:
        folded = await fold(
            self.options.plugins,
            "after_compact",
            AfterCompact(state, report),
            state,
            rebind=_rebind,
            on_error=plugin_error(self.emit, state, "after_compact"),
        )
        result = folded.value
        if folded.stop is not None:  # too late to veto: the offload has happened
            self.emit(
                PLUGIN_ERROR,
                state,
                plugin=folded.stopped_by,
                hook="after_compact",
                error=f"{type(folded.stop).__name__} ignored after compaction: {folded.stop.reason}",
            )
        if result is not state:
            # No reply has come since the compaction: every reported usage in it is stale.
            result = result.evolve(
                usage_floor=len(result.messages),
                compactions=state.compactions,
                journal_id=state.journal_id,
                journal_seq=state.journal_seq,
            )
        return result


def _rebind(ctx: AfterCompact, state: State) -> AfterCompact:
    return attrs.evolve(ctx, state=state)


def _usage_fields(summary: Summary) -> dict[str, Any]:
    """The report's figures of the summarizer's requests."""
    usage = summary.usage or TokenUsage()
    return {
        "summarizer_input_tokens": usage.input_tokens,
        "summarizer_cache_read_tokens": usage.cache_read_tokens,
        "summarizer_cache_creation_tokens": usage.cache_creation_tokens,
        "summarizer_output_tokens": usage.output_tokens,
        "warm_cache": summary.warm,
    }


def pointer(compaction: int, evicted: int, path: str, first: int = 10**12, last: int = 10**12) -> Message:
    """The smallest summary: it only says where the evicted messages went (the default record
    numbers are wider than any real ones, so its cost is an upper bound before the offload)."""
    return pointer_message(compaction=compaction, evicted=evicted, offload_path=path, first_seq=first, last_seq=last)


def journal_fields(state: State, written: AppendResult) -> dict[str, Any]:
    """The state's journal identity after `written`: its journal, the last record it names."""
    return {"journal_id": written.journal, "journal_seq": max(state.journal_seq, written.last_seq)}


def tag_summaries(inserted: Sequence[Message], written: AppendResult) -> tuple[Message, ...]:
    """The summary messages carry the journal's identity and the attempts to commit with them."""
    tags = {JOURNAL_KEY: written.journal, ATTEMPTS_KEY: list(written.pending)}
    return tuple(m.evolve(metadata={**m.metadata, **tags}) if m.is_summary else m for m in inserted)
