"""Deterministic synthetic conversations for the benchmarks and the tests (`cmdc.testing`)."""

from __future__ import annotations

import random

from .message import Message, TokenUsage, ToolCall
from .tokens import estimate_message_tokens

_WORDS = [
    "agent",
    "context",
    "window",
    "summary",
    "journal",
    "offload",
    "token",
    "budget",
    "compaction",
    "tool",
    "result",
    "request",
    "reply",
    "parser",
    "module",
    "config",
    "schema",
    "cache",
    "retry",
    "timeout",
    "channel",
    "nursery",
    "cancel",
    "state",
    "message",
]
_FILES = ("src/app.py", "src/db/models.py", "docs/api.md", "tests/test_api.py", "pyproject.toml")


def _text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        w = rng.choice(_WORDS)
        words.append(w)
        length += len(w) + 1
    return " ".join(words)[:size]


def conversation(
    n: int, *, seed: int = 0, message_chars: int = 400, system: bool = True, usage: bool = True
) -> list[Message]:
    """At most `n` messages (never ending inside a call group): a system prompt, then rounds of
    user -> assistant with 1-3 parallel tool calls -> their results -> assistant text. Each
    message carries ~`message_chars` characters; assistant messages report usage when `usage`
    is set. The same arguments give the same texts, calls and figures (new message ids).
    Exported as `cmdc.testing.conversation`.

    ```python
    from cmdc.testing import conversation

    messages = conversation(20, seed=1)
    assert len(messages) <= 20 and messages[0].role == "system"
    assert [m.text for m in conversation(20, seed=1)] == [m.text for m in messages]
    calls = {c.id for m in messages for c in m.tool_calls}
    assert calls == {m.tool_call_id for m in messages if m.role == "tool"}  # every call answered
    ```
    """
    rng = random.Random(seed)
    out: list[Message] = [Message.system("You are a careful coding agent.")] if system else []
    round_no = 0
    while len(out) < n:
        round_no += 1
        out.append(Message.user(f"Task {round_no}: work on {rng.choice(_FILES)}. " + _text(rng, message_chars)))
        calls = [
            ToolCall(
                id=f"call_{round_no}_{k}",
                name=rng.choice(("read_file", "search", "run_tests")),
                arguments={"path": rng.choice(_FILES), "query": _text(rng, 40)},
            )
            for k in range(rng.randint(1, 3))
        ]
        out.append(_reply(out, Message.assistant(_text(rng, message_chars // 4), tool_calls=calls), usage))
        for c in calls:
            out.append(Message.tool_result(c.id, _text(rng, message_chars), is_error=rng.random() < 0.05))
        out.append(_reply(out, Message.assistant(_text(rng, message_chars)), usage))
    k = n
    while not _closed(out[:k]):  # never end inside a call group
        k -= 1
    return out[:k]


def _reply(history: list[Message], reply: Message, usage: bool) -> Message:
    """`reply` with the usage a model would report: the prompt (history) plus its own output."""
    if not usage:
        return reply
    prompt = 0
    for m in reversed(history):  # the last reported total, plus what came after it
        if m.usage is not None:
            prompt += m.usage.total_tokens
            break
        prompt += estimate_message_tokens(m)
    return reply.evolve(usage=TokenUsage(input_tokens=prompt, output_tokens=estimate_message_tokens(reply)))


def _closed(messages: list[Message]) -> bool:
    calls = {c.id for m in messages for c in m.tool_calls}
    results = {m.tool_call_id for m in messages if m.role == "tool"}
    return calls == results
