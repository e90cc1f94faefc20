"""Compaction: the `Compactor` and its parts.

`config` (the settings in `state.config`), `cutoff` (the pure split), `options` (the
Compactor's validated options, the one list of them, and budgets), `evict` (the split stage of
a pass: pins and the `before_compact` fold), `verify` (the contraction rule, the new state and
report, the `after_compact` fold), `attempts` (retries, fallbacks, failover),
`breaker` (suspending a failing summarizer), `summary` (calling a summarizer, the summary
message), `finalize` (what replaces the evicted messages), `clip` (what a compaction clips),
`caches` (process-wide caches) and `compactor` (the API and the pipeline's stages).
"""

from .._report import Compacted, CompactionReport, Skipped
from .breaker import SummarizerBreaker
from .compactor import Compactor, SummaryAttempt, default_should_retry
from .config import DEFAULT_SUMMARY_PROMPT, CompactConfig, Threshold, TierConfig
from .cutoff import Split, split_messages
from .options import SUMMARY_BUDGET, CompactorOptions
from .summary import ExtractiveSummarizer, Summarizer, render_transcript

__all__ = [
    "DEFAULT_SUMMARY_PROMPT",
    "SUMMARY_BUDGET",
    "CompactConfig",
    "Compacted",
    "CompactionReport",
    "Compactor",
    "CompactorOptions",
    "ExtractiveSummarizer",
    "Skipped",
    "Split",
    "Summarizer",
    "SummarizerBreaker",
    "SummaryAttempt",
    "Threshold",
    "TierConfig",
    "default_should_retry",
    "render_transcript",
    "split_messages",
]
