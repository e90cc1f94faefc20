"""The provider protocol: one async method from a `ModelRequest` to an assistant `Message`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from .._frozen import freeze_mapping
from ..message import Message


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
