"""Token estimation: UTF-8 bytes / 4 (rounded up) plus a per-message overhead.

The estimate is the fallback; a provider's reported usage is the baseline (see `State`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import orjson

from .message import Message, TextPart

MESSAGE_OVERHEAD = 4
"""Tokens added per message for role and framing."""

TOOL_CALL_OVERHEAD = 3
"""Tokens added per tool call for its framing."""

IMAGE_TOKENS = 1_000
"""The fixed cost of one image part."""

TokenCounter = Callable[[Message], int]
"""A per-message token counter: `(message) -> int`. Pass a real tokenizer's to a `Compactor`."""


def estimate_text_tokens(text: str) -> int:
    """UTF-8 byte length / 4, rounded up (an ASCII text's size is its length: not encoded)."""
    return ((len(text) if text.isascii() else len(text.encode("utf-8"))) + 3) // 4


def _estimate(message: Message) -> int:
    content = message.content
    if isinstance(content, str):
        n = estimate_text_tokens(content)
    else:
        n = sum(estimate_text_tokens(p.text) if isinstance(p, TextPart) else IMAGE_TOKENS for p in content)
    for call in message.tool_calls:
        n += TOOL_CALL_OVERHEAD + estimate_text_tokens(call.name)
        # orjson walks the frozen arguments itself (a read-only mapping through `dict`): no thawed copy
        n += (len(orjson.dumps(call.arguments, default=dict)) + 3) // 4
    return n + MESSAGE_OVERHEAD


def estimate_message_tokens(message: Message) -> int:
    """The default estimate for one message, computed once and cached on the message."""
    cached = message._tokens
    if cached is None:
        cached = _estimate(message)
        object.__setattr__(message, "_tokens", cached)
    return cached


def estimate_tokens_from_messages(messages: Iterable[Message]) -> int:
    """The default estimate for a list of messages (ignores any reported usage)."""
    return sum(estimate_message_tokens(m) for m in messages)

__all__ = [
    "TokenCounter",
    "estimate_message_tokens",
    "estimate_text_tokens",
    "estimate_tokens_from_messages",
]
