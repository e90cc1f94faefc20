"""Compaction: config, cutoff, summary and the `Compactor`."""

from ..report import Compacted, CompactionReport, Skipped
from .breaker import SummarizerBreaker
from .compactor import Compactor, SummaryAttempt, default_should_retry
from .config import DEFAULT_SUMMARY_PROMPT, CompactConfig, Threshold
from .cutoff import Split, split_messages
from .summary import ExtractiveSummarizer, Summarizer, render_transcript

__all__ = [
    "DEFAULT_SUMMARY_PROMPT",
    "CompactConfig",
    "Compacted",
    "CompactionReport",
    "Compactor",
    "ExtractiveSummarizer",
    "Skipped",
    "Split",
    "Summarizer",
    "SummarizerBreaker",
    "SummaryAttempt",
    "Threshold",
    "default_should_retry",
    "render_transcript",
    "split_messages",
]
