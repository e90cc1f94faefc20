"""Prompt caching in compaction: the summarizer's token usage, and the warm-cache request.

Every model server caches the prompt's prefix (OpenAI and Anthropic bill cached input at a
fraction, llama-server reuses its KV cache). A summarizer request with a shape of its own (the
instruction as system prompt, a transcript) shares no prefix with the agent's requests: the
provider reads it cold. The warm-cache request is the agent's current context itself (the
messages the last request sent, and what came after them, the same tools) with the summary
instruction appended as a last user message: everything but the instruction is served from
the cache. The agent says what its requests look like (`agent_context`), the compactor builds
the request when the summarizer is a model provider that opted in (`warm_cache`), and falls
back to today's request shape when it would not fit the window.

Usage: `counting()` collects the `TokenUsage` of every summarizer reply made inside it
(`record_usage`, called where a summarizer provider answers), for the compaction's report.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import attrs

from ..message import Message, TokenUsage
from ..providers.base import ModelRequest, Provider, ToolSchema
from ..tokens import estimate_text_tokens

_USAGE: contextvars.ContextVar[list[TokenUsage] | None] = contextvars.ContextVar("cmdc_summarizer_usage", default=None)


def record_usage(usage: TokenUsage | None) -> None:
    """Count one summarizer reply's usage in the enclosing `counting()` (nothing outside one)."""
    sink = _USAGE.get()
    if sink is not None and usage is not None:
        sink.append(usage)


@contextmanager
def counting() -> Iterator[list[TokenUsage]]:
    """Collects the usage of the summarizer replies made inside the block."""
    sink: list[TokenUsage] = []
    token = _USAGE.set(sink)
    try:
        yield sink
    finally:
        _USAGE.reset(token)


def total(usages: Sequence[TokenUsage]) -> TokenUsage:
    """The sum of several requests' usage."""
    return TokenUsage(
        input_tokens=sum(u.input_tokens for u in usages),
        output_tokens=sum(u.output_tokens for u in usages),
        total_tokens=sum(u.total_tokens for u in usages),
        cache_read_tokens=sum(u.cache_read_tokens for u in usages),
        cache_creation_tokens=sum(u.cache_creation_tokens for u in usages),
    )


@attrs.frozen
class AgentContext:
    """What an agent's model requests look like beside their messages: its provider and tools."""

    provider: Provider
    tools: tuple[ToolSchema, ...] = ()


_AGENT: contextvars.ContextVar[AgentContext | None] = contextvars.ContextVar("cmdc_agent_context", default=None)


def set_agent_context(context: AgentContext) -> None:
    """Called by an agent's task before it requests or compacts: a compaction in this task may
    then ask its summarizer on the agent's cached prefix."""
    _AGENT.set(context)


def agent_context() -> AgentContext | None:
    return _AGENT.get()


WARM_INSTRUCTION = (
    "[Context compaction] Do not continue the conversation and do not call tools. Write a summary "
    "of the conversation above that will replace its earlier messages. {kept}\n\n{prompt}"
)
WARM_OUTPUT_FACTOR = 4
"""The warm request's output limit, in answer budgets: room for a model that writes long to
finish (a cut-off answer is unusable, and the whole request is lost), clipped afterwards."""
WARM_MARGIN = 64
"""Tokens kept free in the window for the chat template and the estimate's error."""


def warm_request(
    messages: Sequence[Message],
    tools: Sequence[ToolSchema],
    prompt: str,
    kept: int,
    context_tokens: int,
    max_tokens: int | None,
    window: int | None,
) -> ModelRequest | None:
    """The summarizer request on the agent's cached prefix: `messages` as they are (the agent's
    context: its last request's messages are their prefix), the same `tools`, then the summary
    instruction as a user message. `kept`: the newest messages that stay verbatim after the
    summary; `context_tokens`: the context's size (reported usage plus estimates). The output
    limit is what the window leaves, at most `WARM_OUTPUT_FACTOR` times `max_tokens` (the
    answer's budget: the caller clips a longer answer to it, as any other); None when not even
    half of `max_tokens` fits, or the window is unknown: the caller falls back to the cold
    request."""
    if window is None or not messages:
        return None
    stays = f"The last {kept} message(s) stay in the context verbatim after your summary." if kept else ""
    text = WARM_INSTRUCTION.format(kept=stays, prompt=prompt)
    instruction = Message.user(text, metadata={"cmdc.purpose": "summarize"})
    room = window - context_tokens - estimate_text_tokens(text) - WARM_MARGIN
    wanted = max_tokens if max_tokens is not None else max(1, window // 4)
    if room < max(1, wanted // 2):
        return None
    return ModelRequest(
        messages=(*messages, instruction),
        tools=tuple(tools),
        # Room to finish (an answer cut off is thrown away); the caller bounds it to `max_tokens`.
        max_output_tokens=min(room, WARM_OUTPUT_FACTOR * wanted),
        metadata={"cmdc.purpose": "summarize", "cmdc.warm_cache": True},
    )


__all__ = [
    "AgentContext",
    "agent_context",
    "counting",
    "record_usage",
    "set_agent_context",
    "total",
    "warm_request",
]
