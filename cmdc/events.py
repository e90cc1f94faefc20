"""Event records: what happened in an agent, with its figures. Subscribers and structlog get them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

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
SUMMARIZER_ATTEMPT = "summarizer_attempt"
OVERFLOW = "overflow"
RETRY = "retry"
ERROR = "error"
PLUGIN_ERROR = "plugin_error"
PINS_OVER_BUDGET = "pins_over_budget"


def _freeze_data(value: Mapping[str, Any]) -> Mapping[str, Any]:
    # A shallow read-only copy: event data carries figures and frozen values (reports, usage).
    return value if isinstance(value, MappingProxyType) else MappingProxyType(dict(value))


@attrs.frozen
class Event:
    """One event: its kind, the agent it concerns, its data (figures, reports) and its time
    (`trio.current_time()` when emitted inside trio)."""

    kind: str
    agent_id: str | None = None
    data: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze_data)
    time: float = 0.0


EventSink = Callable[[Event], None]
"""A synchronous receiver of events. It must not block; exceptions it raises are swallowed."""


def emit(sink: EventSink | None, event: Event) -> None:
    """Send `event` to `sink`, never letting a broken sink disturb the caller."""
    if sink is None:
        return
    with contextlib.suppress(Exception):  # a sink must never break the code that emits
        sink(event)
