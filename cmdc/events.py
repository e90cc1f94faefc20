"""Event records: what happened in an agent, with its figures; every kind as a constant.

Subscribers get every event. Logging is the application's choice, as a library's should be:
`log_event` sends an event to structlog when the application configured structlog
(`structlog.configure`), else to the stdlib logger `cmdc` (which has a `NullHandler`, so nothing
is printed unless the application configured logging, e.g. `logging.basicConfig(level=...)`).
Chatty kinds log at DEBUG, compactions and overflows at INFO, failures at WARNING (`LEVELS`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import attrs
import structlog

TURN_START = "turn_start"
TURN_END = "turn_end"
REQUEST = "request"
RESPONSE = "response"
TOOL_START = "tool_start"
TOOL_END = "tool_end"
COMPACTION_START = "compaction_start"
COMPACTION_END = "compaction_end"
COMPACTION_SKIPPED = "compaction_skipped"
COMPACTION_FAILED = "compaction_failed"
COMPACTION_FALLBACK = "compaction_fallback"
QUEUED_DROPPED = "queued_dropped"
SUMMARIZER_ATTEMPT = "summarizer_attempt"
SUMMARIZER_FALLBACK = "summarizer_fallback"
SUMMARIZER_SUSPENDED = "summarizer_suspended"  # a summarizer that kept failing is skipped for a while
OVERFLOW = "overflow"
CONTINUED = "continued"
RETRY = "retry"
ERROR = "error"
PLUGIN_ERROR = "plugin_error"
PINS_OVER_BUDGET = "pins_over_budget"
TOOL_RESULTS_CLIPPED = "tool_results_clipped"
TOOL_RESULT_CAPPED = "tool_result_capped"  # a tool result over its limit was journaled; the context got a preview
TOOL_RESULTS_MASKED = "tool_results_masked"  # old tool results were journaled and replaced by placeholders
COMPACTION_THRASH = "compaction_thrash"  # the thrash guard stopped a compaction loop (the turn fails)
COMPACTION_REQUESTED = "compaction_requested"  # the model asked for a compaction (compact_context)
RESTART = "restart"
EVENTS_DROPPED = "events_dropped"
JOURNAL_LOST = "journal_lost"
JOURNAL_DAMAGED = "journal_damaged"
JOURNAL_REPAIRED = "journal_repaired"
JOURNAL_INDEX_REBUILT = "journal_index_rebuilt"  # a file journal's search index was missing, stale or damaged
STOPPED = "stopped"  # an agent stopped for good; its subscriptions end after this event
USAGE_REFUSED = "usage_refused"  # a reply's usage figures were implausible: dropped, the size is estimated
TOOL_CALLS_REFUSED = "tool_calls_refused"  # a reply asked for more tool calls than run per step
ACTIVATED = "activated"  # a virtual agent came back into memory from its checkpoint
DEACTIVATED = "deactivated"  # a virtual agent left memory (its state is in the store)
LEASE_LOST = "lease_lost"  # another runtime took the agent's name lease
MCP_SERVER_FAILED = "mcp_server_failed"
MCP_TOOLS_LIST_FAILED = "mcp_tools_list_failed"
MCP_TOOLS_CHANGED = "mcp_tools_changed"
MCP_TOOL_DROPPED = "mcp_tool_dropped"
INDEX_RETRY = "index_retry"  # a store's search indexer lost its connection: it tries again after `delay` s
INDEX_FAILED = "index_failed"  # a store's search indexer gave up on an agent for now (left for later)
MCP_SERVER_RESTART = "mcp_server_restart"  # a stdio server that died is started again (after `delay` s)
MCP_SERVER_GAVE_UP = "mcp_server_gave_up"  # a stdio server died once more after `restarts` restarts: it stays down
MCP_MESSAGE_CLIPPED = "mcp_message_clipped"  # a stdio server's message past `max_message_bytes` (never held whole)

LEVELS: Mapping[str, int] = MappingProxyType(
    {
        TURN_START: logging.DEBUG,
        TURN_END: logging.DEBUG,
        REQUEST: logging.DEBUG,
        RESPONSE: logging.DEBUG,
        TOOL_START: logging.DEBUG,
        TOOL_END: logging.DEBUG,
        ACTIVATED: logging.DEBUG,
        DEACTIVATED: logging.DEBUG,
        SUMMARIZER_ATTEMPT: logging.DEBUG,
        SUMMARIZER_FALLBACK: logging.WARNING,
        SUMMARIZER_SUSPENDED: logging.WARNING,
        COMPACTION_START: logging.INFO,
        COMPACTION_END: logging.INFO,
        COMPACTION_SKIPPED: logging.INFO,
        COMPACTION_FALLBACK: logging.INFO,
        TOOL_RESULTS_CLIPPED: logging.INFO,
        TOOL_RESULT_CAPPED: logging.INFO,
        TOOL_RESULTS_MASKED: logging.INFO,
        COMPACTION_REQUESTED: logging.INFO,
        COMPACTION_THRASH: logging.WARNING,
        OVERFLOW: logging.INFO,
        CONTINUED: logging.INFO,
        RETRY: logging.INFO,
        STOPPED: logging.INFO,
        MCP_TOOLS_CHANGED: logging.INFO,
        RESTART: logging.WARNING,
        COMPACTION_FAILED: logging.WARNING,
        ERROR: logging.WARNING,
        PLUGIN_ERROR: logging.WARNING,
        PINS_OVER_BUDGET: logging.WARNING,
        QUEUED_DROPPED: logging.WARNING,
        EVENTS_DROPPED: logging.WARNING,
        USAGE_REFUSED: logging.WARNING,
        TOOL_CALLS_REFUSED: logging.WARNING,
        JOURNAL_LOST: logging.WARNING,
        JOURNAL_DAMAGED: logging.WARNING,
        JOURNAL_REPAIRED: logging.WARNING,
        JOURNAL_INDEX_REBUILT: logging.INFO,
        LEASE_LOST: logging.WARNING,
        MCP_SERVER_FAILED: logging.WARNING,
        MCP_TOOLS_LIST_FAILED: logging.WARNING,
        MCP_TOOL_DROPPED: logging.WARNING,
        INDEX_RETRY: logging.WARNING,
        INDEX_FAILED: logging.WARNING,
        MCP_SERVER_RESTART: logging.WARNING,
        MCP_SERVER_GAVE_UP: logging.WARNING,
        MCP_MESSAGE_CLIPPED: logging.WARNING,
    }
)
"""The log level of each kind (an unknown kind logs at INFO)."""

FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        TURN_START: ("messages", "tokens"),
        TURN_END: ("steps", "duration", "usage", "aborted", "reason"),
        REQUEST: ("messages", "tokens"),
        RESPONSE: ("usage", "duration", "tool_calls"),
        TOOL_START: ("tool", "call_id"),
        TOOL_END: ("tool", "call_id", "error", "duration"),
        COMPACTION_START: ("reason", "tokens", "messages"),
        COMPACTION_END: ("report",),
        COMPACTION_SKIPPED: ("reason", "skipped_by"),
        COMPACTION_FAILED: ("reason", "error"),
        COMPACTION_FALLBACK: ("fallback", "budget", "evicted_tokens", "summary_tokens"),
        SUMMARIZER_ATTEMPT: ("summarizer", "role", "attempt", "ok", "error", "chunk_tokens", "output_tokens"),
        SUMMARIZER_FALLBACK: ("summarizer", "attempts", "error"),
        SUMMARIZER_SUSPENDED: ("summarizer", "failures", "compactions", "error"),
        TOOL_RESULTS_CLIPPED: ("clipped", "offload_path"),
        TOOL_RESULT_CAPPED: ("tool", "call_id", "tokens", "limit", "record"),
        TOOL_RESULTS_MASKED: ("masked", "freed", "tokens_before", "records"),
        COMPACTION_REQUESTED: ("reason", "estimated_gain", "min_gain", "accepted"),
        COMPACTION_THRASH: ("compactions", "requests", "culprit", "figures"),
        OVERFLOW: ("prompt_tokens", "limit", "forced"),
        CONTINUED: ("stop_reason", "tokens", "window", "continuation"),
        RETRY: ("after", "forced", "clipped"),
        RESTART: ("restarts",),
        STOPPED: ("reason", "restarts"),
        ERROR: ("error", "during", "crashed", "retry_in"),
        PLUGIN_ERROR: ("plugin", "hook", "error"),
        PINS_OVER_BUDGET: ("budget", "unpinned", "pinned_tokens"),
        QUEUED_DROPPED: ("count", "error"),
        EVENTS_DROPPED: ("count",),
        USAGE_REFUSED: ("usage", "limit"),
        TOOL_CALLS_REFUSED: ("refused", "limit"),
        JOURNAL_LOST: ("path", "expected", "found", "why"),
        JOURNAL_DAMAGED: ("path", "damaged", "torn"),
        JOURNAL_REPAIRED: ("path", "moved", "lines"),
        JOURNAL_INDEX_REBUILT: ("path", "reason"),
        ACTIVATED: (),
        DEACTIVATED: (),
        LEASE_LOST: (),
        MCP_SERVER_FAILED: ("server", "error"),
        MCP_TOOLS_LIST_FAILED: ("server", "error"),
        MCP_TOOLS_CHANGED: ("server", "tools"),
        MCP_TOOL_DROPPED: ("server", "tool", "reason"),
        INDEX_RETRY: ("attempt", "delay", "error"),
        INDEX_FAILED: ("attempts", "error"),
        MCP_SERVER_RESTART: ("server", "restarts", "delay", "error"),
        MCP_SERVER_GAVE_UP: ("server", "restarts", "error"),
        MCP_MESSAGE_CLIPPED: ("server", "bytes", "cap", "message"),
    }
)
"""The data keys of each kind: an event of a known kind always carries exactly these (a key its
emitter leaves out is None, or False for the flags `aborted`, `crashed` and `clipped`)."""

_FLAGS = frozenset({"aborted", "crashed", "clipped"})

logger = logging.getLogger("cmdc")
"""The stdlib logger of cmdc (and parent of `cmdc.*`). It has a `NullHandler`: silent unless the
application configures logging."""
logger.addHandler(logging.NullHandler())

_structlog = structlog.get_logger("cmdc")
_METHODS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning", logging.ERROR: "error"}
_RESERVED = frozenset({"event", "agent"})  # structlog's message key and the agent


def _freeze_data(value: Mapping[str, Any]) -> Mapping[str, Any]:
    # A shallow read-only copy: event data carries figures and frozen values (reports, usage).
    return value if isinstance(value, MappingProxyType) else MappingProxyType(dict(value))


def _shaped(kind: str, data: Mapping[str, Any]) -> Mapping[str, Any]:
    keys = FIELDS.get(kind)
    if keys is None or all(k in data for k in keys):
        return data
    return {**{k: (False if k in _FLAGS else None) for k in keys}, **data}


@attrs.frozen
class Event:
    """One event: its kind, the agent it concerns, its data (figures, reports) and its time
    (`trio.current_time()` when emitted inside trio)."""

    kind: str
    agent_id: str | None = None
    data: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze_data)
    time: float = 0.0

    def __attrs_post_init__(self) -> None:
        shaped = _shaped(self.kind, self.data)
        if shaped is not self.data:  # fill the keys of the kind's shape (`FIELDS`) left out
            object.__setattr__(self, "data", _freeze_data(shaped))


EventSink = Callable[[Event], None]
"""A synchronous receiver of events. It must not block; exceptions it raises are swallowed."""


def logging_enabled() -> bool:
    """Whether `log_event` may write anything: structlog is configured, or the stdlib logger
    `cmdc` is enabled for DEBUG (the lowest level events use)."""
    return structlog.is_configured() or logger.isEnabledFor(logging.DEBUG)


def _loggable(value: Any) -> Any:
    """A JSON-friendly form of `value`: attrs instances as dicts (their repr fields), other
    non-JSON values as their repr."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if attrs.has(type(value)):
        return _loggable(attrs.asdict(value, filter=lambda a, _v: a.repr is not False))
    if isinstance(value, Mapping):
        return {str(k): _loggable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_loggable(v) for v in value]
    return repr(value)


def log_event(event: Event) -> None:
    """Log `event`, one line, where the application asked for logs (see the module docstring).
    Never raises."""
    with contextlib.suppress(Exception):  # logging must never break the code that emits
        level = LEVELS.get(event.kind, logging.INFO)
        if structlog.is_configured():
            data = {(f"{k}_" if k in _RESERVED else str(k)): _loggable(v) for k, v in event.data.items()}
            getattr(_structlog, _METHODS.get(level, "info"))(event.kind, agent=event.agent_id, **data)
        elif logger.isEnabledFor(level):
            fields = " ".join(f"{k}={_loggable(v)!r}" for k, v in event.data.items())
            logger.log(
                level,
                "%s agent=%s%s",
                event.kind,
                event.agent_id,
                f" {fields}" if fields else "",
                extra={"cmdc_event": event},
            )


def emit(sink: EventSink | None, event: Event) -> None:
    """Send `event` to `sink`, never letting a broken sink disturb the caller."""
    if sink is None:
        return
    with contextlib.suppress(Exception):  # a sink must never break the code that emits
        sink(event)

# The kinds, their shapes (FIELDS) and log levels, and the record. `emit`, `log_event` and
# `logging_enabled` are the library's own plumbing.
__all__ = [
    "ACTIVATED",
    "COMPACTION_END",
    "COMPACTION_FAILED",
    "COMPACTION_FALLBACK",
    "COMPACTION_REQUESTED",
    "COMPACTION_SKIPPED",
    "COMPACTION_START",
    "COMPACTION_THRASH",
    "CONTINUED",
    "DEACTIVATED",
    "ERROR",
    "EVENTS_DROPPED",
    "INDEX_FAILED",
    "INDEX_RETRY",
    "JOURNAL_DAMAGED",
    "JOURNAL_INDEX_REBUILT",
    "JOURNAL_LOST",
    "JOURNAL_REPAIRED",
    "LEASE_LOST",
    "MCP_MESSAGE_CLIPPED",
    "MCP_SERVER_FAILED",
    "MCP_SERVER_GAVE_UP",
    "MCP_SERVER_RESTART",
    "MCP_TOOLS_CHANGED",
    "MCP_TOOLS_LIST_FAILED",
    "MCP_TOOL_DROPPED",
    "OVERFLOW",
    "PINS_OVER_BUDGET",
    "PLUGIN_ERROR",
    "QUEUED_DROPPED",
    "REQUEST",
    "RESPONSE",
    "RESTART",
    "RETRY",
    "STOPPED",
    "SUMMARIZER_ATTEMPT",
    "SUMMARIZER_FALLBACK",
    "SUMMARIZER_SUSPENDED",
    "TOOL_CALLS_REFUSED",
    "TOOL_END",
    "TOOL_RESULTS_CLIPPED",
    "TOOL_RESULTS_MASKED",
    "TOOL_RESULT_CAPPED",
    "TOOL_START",
    "TURN_END",
    "TURN_START",
    "USAGE_REFUSED",
    "FIELDS",
    "LEVELS",
    "Event",
    "EventSink",
]
