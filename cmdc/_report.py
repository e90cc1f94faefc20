"""What a compaction did: `CompactionReport`, and its outcomes `Compacted` and `Skipped`.

Plain data (layer 0), so the plugin contexts, the errors and the compactor can all name them
without an import cycle. Also importable from `cmdc` and `cmdc.compaction`.
"""

from __future__ import annotations

from typing import Any

import attrs

from .state import State


@attrs.frozen
class CompactionReport:
    """What one compaction did, with its figures."""

    reason: str
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    evicted: int
    offload_path: str
    first_seq: int
    last_seq: int
    compaction: int
    summary_tokens: int
    summarizer: str
    attempts: int
    duration: float
    passes: int = 1
    summary_budget: int = 0  # what the inserted messages could cost at most, in tokens
    fallback: str | None = None  # "clipped", "summary only" or "pointer only" when the rule needed one
    # The summarizer's requests, summed (zeros when the provider reported no usage): prompt
    # tokens (cached ones included), of them read from and written to the provider's cache, output.
    summarizer_input_tokens: int = 0
    summarizer_cache_read_tokens: int = 0
    summarizer_cache_creation_tokens: int = 0
    summarizer_output_tokens: int = 0
    warm_cache: bool = False  # the summary was asked on the agent's cached prefix

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class Compacted:
    """A compaction happened: the new state and its report."""

    state: State
    report: CompactionReport


@attrs.frozen
class Skipped:
    """No compaction: the state unchanged, why, and which plugin skipped it (if one did)."""

    state: State
    reason: str
    skipped_by: str | None = None


__all__ = ["Compacted", "CompactionReport", "Skipped"]
