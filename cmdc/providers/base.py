"""The provider protocol: one async method from a `ModelRequest` to an assistant `Message`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from .._frozen import freeze_mapping
from ..message import Message

# Reply metadata keys every provider may set (the HTTP providers do).
CONTEXT_EXCEEDED_KEY = "cmdc.context_exceeded"
"""True on a reply that was cut short because the context window filled up (Anthropic's
`stop_reason == "model_context_window_exceeded"`), or that only fitted with a lowered output
limit: the agent should compact before its next step."""
STOP_REASON_KEY = "cmdc.stop_reason"
"""The provider's own finish / stop reason (`stop`, `tool_calls`, `length`, `end_turn`,
`max_tokens`, ...): `length` / `max_tokens` mean the reply stopped on its output limit or on a
full window, not because it was finished."""
INVALID_ARGUMENTS_KEY = "cmdc.invalid_tool_arguments"
"""{call id: raw text} for tool calls whose arguments were not a JSON object (delivered with
arguments `{}`, so the tool's validation answers the model with a readable error)."""
REFUSED_ARGUMENTS_KEY = "cmdc.refused_tool_arguments"
"""{call id: why} for tool calls whose arguments were past `ReplyLimits.max_argument_values` or
`max_argument_depth` (delivered with arguments `{}`, never run: the agent answers the model with
why; the raw text is not kept)."""
OUTPUT_REDUCED_KEY = "cmdc.output_limit_reduced_to"
"""The lowered output limit a reply was produced with after an `OutputBudgetOverflow`."""


def _freeze_parameters(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return freeze_mapping(value, "tool parameters")


def _freeze_metadata(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return freeze_mapping(value, "request metadata")


@attrs.frozen
class ToolSchema:
    """What a model is told about one tool: its name, description and JSON-schema parameters."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = attrs.field(
        factory=lambda: {"type": "object", "properties": {}}, converter=_freeze_parameters
    )


def _messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return tuple(value)


def _tools(value: Iterable[ToolSchema]) -> tuple[ToolSchema, ...]:
    return tuple(value)


@attrs.frozen
class ModelRequest:
    """One request to a model: the messages, the tools it may call, and limits."""

    messages: tuple[Message, ...] = attrs.field(converter=_messages)
    tools: tuple[ToolSchema, ...] = attrs.field(default=(), converter=_tools)
    max_output_tokens: int | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze_metadata)


@runtime_checkable
class Provider(Protocol):
    """A model. `complete` returns an assistant `Message` carrying `TokenUsage`, and raises
    `ContextOverflow` when the prompt is too long (other failures: `ProviderError`)."""

    async def complete(self, request: ModelRequest) -> Message: ...
