"""cmdc: an async, actor-style runtime for LLM agents on trio, with durable context compaction."""

from typing import TYPE_CHECKING

from ._version import __version__
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
from .compaction.rehydrate import RehydrateReads
from .compaction.tool import compact_context_tool
from .errors import (
    AgentNotFound,
    AgentStopped,
    AuthError,
    BadRequest,
    ChatFileError,
    CheckpointCorrupted,
    CheckpointError,
    CmdcDeprecationWarning,
    CmdcError,
    CompactionAborted,
    CompactionError,
    CompactionIncomplete,
    CompactionThrashing,
    ConfigError,
    ConnectionFailed,
    ContextOverflow,
    DelegationRefused,
    DemoError,
    HTTPProviderError,
    IncompleteStream,
    IndexUnavailable,
    InvalidMessage,
    InvalidPlugin,
    InvalidState,
    JournalLost,
    LeaseLost,
    MailboxFull,
    MCPServerError,
    MCPToolError,
    NameLeased,
    NodeLost,
    OffloadCorrupted,
    OffloadError,
    OutputBudgetOverflow,
    Overloaded,
    PluginAborted,
    PluginReturnError,
    ProviderError,
    ProviderTimeout,
    QuotaExceeded,
    RateLimited,
    ReplyTooLarge,
    RequestSkipped,
    ServerError,
    StepLimitReached,
    StoreRefused,
    StoreUnavailable,
    SummarizerError,
    SummarizerTimeout,
    ToolArgumentsError,
    TooManyToolCalls,
    TurnAborted,
    UsageError,
)
from .events import Event
from .message import ImagePart, Message, TextPart, TokenUsage, ToolCall
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
from .runtime import AgentHandle, AgentOptions, AgentRef, Runtime, SpawnOptions, open_runtime
from .runtime import runtime as _runtime
from .state import State, validate_agent_id
from .store.file.journal import JournalRecord, OffloadStore
from .tokens import estimate_message_tokens, estimate_tokens_from_messages
from .tools import Tool, tool
from .ui import serve_runtime as _serve_ui

_runtime.UI_SERVER = _serve_ui  # rt.serve_ui(): the page is a face (cmdc.ui); the runtime only calls it

__all__ = [
    "Abort",
    "AfterCompact",
    "AfterResponse",
    "AfterTool",
    "AgentHandle",
    "AgentNotFound",
    "AgentOptions",
    "AgentRef",
    "AgentStopped",
    "AuthError",
    "BadRequest",
    "BeforeCompact",
    "BeforeRequest",
    "BeforeTool",
    "ChatFileError",
    "CheckpointCorrupted",
    "CheckpointError",
    "CmdcDeprecationWarning",
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
    "ConnectionFailed",
    "ContextOverflow",
    "DEFAULT_SUMMARY_PROMPT",
    "DelegationRefused",
    "DemoError",
    "Event",
    "ExtractiveSummarizer",
    "HTTPProviderError",
    "ImagePart",
    "IncompleteStream",
    "IndexUnavailable",
    "InvalidMessage",
    "InvalidPlugin",
    "InvalidState",
    "JournalLost",
    "JournalRecord",
    "LeaseLost",
    "MCPServerError",
    "MCPToolError",
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
    "OutputBudgetOverflow",
    "Overloaded",
    "Plugin",
    "PluginAborted",
    "PluginReturnError",
    "ProviderError",
    "ProviderTimeout",
    "QuotaExceeded",
    "RateLimited",
    "RehydrateReads",
    "ReplyTooLarge",
    "RequestSkipped",
    "Runtime",
    "ServerError",
    "Skip",
    "Skipped",
    "State",
    "StepLimitReached",
    "StoreRefused",
    "StoreUnavailable",
    "SummarizerError",
    "SummarizerTimeout",
    "SpawnOptions",
    "SummaryAttempt",
    "TextPart",
    "TokenUsage",
    "TooManyToolCalls",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "TurnAborted",
    "UsageError",
    "__version__",
    "compact_context_tool",
    "estimate_message_tokens",
    "estimate_tokens_from_messages",
    "open_runtime",
    "split_messages",
    "tool",
    "validate_agent_id",
]

_OPTIONAL_MODULES = frozenset({"mcp", "otel"})
"""Submodules on optional extras, imported on first use (`cmdc.mcp`, `cmdc.otel`): `import cmdc` never
imports their dependencies."""


if TYPE_CHECKING:
    # What a type checker sees: the two submodules by name, and no module `__getattr__`
    # (one returning `object` would make every misspelt `cmdc.Name` pass as an `object`).
    from . import mcp as mcp
    from . import otel as otel
else:

    def __getattr__(name: str) -> object:
        if name in _OPTIONAL_MODULES:
            import importlib

            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
