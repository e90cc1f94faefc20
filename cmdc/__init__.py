"""cmdc: an async, actor-style runtime for LLM agents on trio, with durable context compaction."""

from .agent import AgentOptions, AgentRef
from .compaction import (
    DEFAULT_SUMMARY_PROMPT,
    CompactConfig,
    Compacted,
    CompactionReport,
    Compactor,
    ExtractiveSummarizer,
    Skipped,
    split_messages,
)
from .errors import (
    AgentNotFound,
    AgentStopped,
    CmdcError,
    CompactionAborted,
    CompactionError,
    ConfigError,
    ContextOverflow,
    InvalidMessage,
    InvalidState,
    MailboxFull,
    OffloadCorrupted,
    OffloadError,
    PluginAborted,
    ProviderError,
    RequestSkipped,
    StepLimitReached,
    SummarizerError,
    TurnAborted,
)
from .events import Event
from .message import ImagePart, Message, TextPart, TokenUsage, ToolCall
from .offload import JournalRecord, OffloadStore
from .plugins import Abort, AfterCompact, BeforeCompact, Plugin, Skip
from .runtime import Runtime, open_runtime
from .state import State, validate_agent_id
from .tokens import estimate_message_tokens, estimate_tokens_from_messages
from .tools import Tool, tool

__all__ = [
    "DEFAULT_SUMMARY_PROMPT",
    "Abort",
    "AfterCompact",
    "AgentNotFound",
    "AgentOptions",
    "AgentRef",
    "AgentStopped",
    "BeforeCompact",
    "CmdcError",
    "CompactConfig",
    "Compacted",
    "CompactionAborted",
    "CompactionError",
    "CompactionReport",
    "Compactor",
    "ConfigError",
    "ContextOverflow",
    "Event",
    "ExtractiveSummarizer",
    "ImagePart",
    "InvalidMessage",
    "InvalidState",
    "JournalRecord",
    "MailboxFull",
    "Message",
    "OffloadCorrupted",
    "OffloadError",
    "OffloadStore",
    "Plugin",
    "PluginAborted",
    "ProviderError",
    "RequestSkipped",
    "Runtime",
    "Skip",
    "Skipped",
    "State",
    "StepLimitReached",
    "SummarizerError",
    "TextPart",
    "TokenUsage",
    "Tool",
    "ToolCall",
    "TurnAborted",
    "estimate_message_tokens",
    "estimate_tokens_from_messages",
    "open_runtime",
    "split_messages",
    "tool",
    "validate_agent_id",
]
