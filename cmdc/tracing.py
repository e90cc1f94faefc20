"""The tracing seam: what an agent tells a tracer about its work, with no tracing library in
the core.

`cmdc.otel.Tracing` implements `Tracer` with OpenTelemetry (extra `otel`);
`open_runtime(tracing=...)` turns it on for every agent of the runtime. Off (the default,
`tracing=None`) an agent does no tracing work at all: no span objects, no attributes.

Each method returns a context manager around one piece of work: a turn, a model request, a
tool call, a compaction. It yields a `Span` the agent hands the work's result to; the span ends
when the block exits, with an error status when it exits by an exception (a cancellation
included). A tracer must not raise from these: tracing never breaks an agent.

Parenting: within a turn, spans nest through the agent task's context (its tool tasks copy it
when they start). A turn runs in the agent's own task, not its caller's, so the caller's
context is captured with the request (`contextvars.copy_context()` when `prompt` is called)
and handed to `turn` as `parent`: a turn is the child of whatever span was current where it
was asked for, and a delegated child's turn sits under its parent's `delegate` tool span.
"""

from __future__ import annotations

import contextlib
import contextvars
from contextlib import AbstractContextManager
from typing import Protocol

from ._report import Compacted, Skipped
from .events import Event
from .message import Message, ToolCall
from .providers.base import ModelRequest, Provider
from .state import State
from .tools import Tool


class Span(Protocol):
    """The open span of one piece of work."""

    def record(self, result: Message | Compacted | Skipped) -> None:
        """What the work produced: a turn's final reply, a model's reply, a tool's result
        message, a compaction's outcome."""


class Tracer(Protocol):
    """What an agent tells a tracer. `agent` is the agent's name in every call."""

    def turn(
        self, agent: str, incoming: tuple[Message, ...], parent: contextvars.Context | None
    ) -> AbstractContextManager[Span]:
        """A turn over the `incoming` user messages; `parent`: the context it was asked from."""
        ...

    def request(self, agent: str, provider: Provider, request: ModelRequest) -> AbstractContextManager[Span]:
        """One model request (each retry after an overflow is another one)."""
        ...

    def tool(self, agent: str, call: ToolCall, tool: Tool | None) -> AbstractContextManager[Span]:
        """One tool call (`tool` None: the model named a tool that does not exist)."""
        ...

    def compaction(
        self, agent: str, reason: str, state: State, parent: contextvars.Context | None = None
    ) -> AbstractContextManager[Span]:
        """One compaction (`auto`, `forced` or `manual`) of `state`."""
        ...

    def event(self, event: Event) -> None:
        """An event of an agent's compactor (a summarizer attempt, a fallback, clipped tool
        results), emitted in the agent's task: the span current there may note it."""
        ...


class _NoSpan:
    __slots__ = ()

    def record(self, result: Message | Compacted | Skipped) -> None:
        return None


NO_SPAN: Span = _NoSpan()
UNTRACED: AbstractContextManager[Span] = contextlib.nullcontext(NO_SPAN)
"""What an agent without a tracer enters instead of a span: reusable, does nothing."""


__all__ = ["NO_SPAN", "UNTRACED", "Span", "Tracer"]
