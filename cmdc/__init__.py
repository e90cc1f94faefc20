"""cmdc: an async, actor-style runtime for LLM agents on trio, with durable context compaction."""

from ._version import __version__
from .compact_tool import compact_context_tool
from .compaction import (
    DEFAULT_SUMMARY_PROMPT,
    CompactConfig,
    Compacted,
    CompactionReport,
    Compactor,
    ExtractiveSummarizer,
    Skipped,
    SummaryAttempt,
    split_messages,
)
from .errors import (
    AgentNotFound,
    AgentStopped,
    CmdcError,
    CompactionAborted,
    CompactionError,
    CompactionIncomplete,
    CompactionThrashing,
    ConfigError,
    ContextOverflow,
    HTTPProviderError,
    InvalidMessage,
    InvalidState,
    LeaseLost,
    MailboxFull,
    NameLeased,
    NodeLost,
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
from .plugins import (
    Abort,
    AfterCompact,
    AfterResponse,
    AfterTool,
    BeforeCompact,
    BeforeRequest,
    BeforeTool,
    OnError,
    OnStart,
    OnStop,
    Plugin,
    Skip,
)
from .rehydrate import RehydrateReads
from .runtime import AgentHandle, AgentOptions, AgentRef, Runtime, SpawnOptions, open_runtime
from .runtime import runtime as _runtime
from .state import State, validate_agent_id
from .tokens import estimate_message_tokens, estimate_tokens_from_messages
from .tools import Tool, tool
from .ui import serve_runtime as _serve_ui

_runtime.UI_SERVER = _serve_ui  # rt.serve_ui(): the page is a face (cmdc.ui); the runtime only calls it

__all__ = [
    "DEFAULT_SUMMARY_PROMPT",
    "Abort",
    "AfterCompact",
    "AfterResponse",
    "AfterTool",
    "AgentHandle",
    "AgentNotFound",
    "AgentOptions",
    "AgentRef",
    "AgentStopped",
    "BeforeCompact",
    "BeforeRequest",
    "BeforeTool",
    "CmdcError",
    "CompactConfig",
    "Compacted",
    "CompactionAborted",
    "CompactionError",
    "CompactionIncomplete",
    "CompactionReport",
    "CompactionThrashing",
    "Compactor",
    "ConfigError",
    "ContextOverflow",
    "Event",
    "ExtractiveSummarizer",
    "HTTPProviderError",
    "ImagePart",
    "InvalidMessage",
    "InvalidState",
    "JournalRecord",
    "LeaseLost",
    "MailboxFull",
    "Message",
    "NameLeased",
    "NodeLost",
    "OffloadCorrupted",
    "OffloadError",
    "OffloadStore",
    "OnError",
    "OnStart",
    "OnStop",
    "Plugin",
    "PluginAborted",
    "ProviderError",
    "RehydrateReads",
    "RequestSkipped",
    "Runtime",
    "Skip",
    "Skipped",
    "State",
    "StepLimitReached",
    "SummarizerError",
    "SpawnOptions",
    "SummaryAttempt",
    "TextPart",
    "TokenUsage",
    "Tool",
    "ToolCall",
    "TurnAborted",
    "compact_context_tool",
    "estimate_message_tokens",
    "estimate_tokens_from_messages",
    "open_runtime",
    "split_messages",
    "tool",
    "validate_agent_id",
    "__version__",
]

_OPTIONAL_MODULES = frozenset({"mcp", "otel"})
"""Submodules on optional extras, imported on first use (`cmdc.mcp`, `cmdc.otel`): `import cmdc` never
imports their dependencies."""


def __getattr__(name: str) -> object:
    if name in _OPTIONAL_MODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
