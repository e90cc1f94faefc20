"""Fakes shared by the tests: a recording summarizer, a scripted summarizing model, a tool, and an
SSE body builder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import trio

from cmdc import Message, TokenUsage, tool
from cmdc.providers import ModelRequest
from cmdc.providers.base import STOP_REASON_KEY

SECTIONS = [
    "Primary request and intent",
    "Key concepts",
    "Files and code",
    "Errors and fixes",
    "All user messages",
    "Pending tasks",
    "Current work",
    "Next step",
]
"""The sections the default summary prompt asks for (written here from the prompt, not read
from the code that checks them)."""
STRUCTURED = "\n".join(f"## {name}\n- noted" for name in SECTIONS)
"""A summary with every section."""


class Recorder:
    """A summarizer (an async callable) that records what it was given and answers `answer`."""

    def __init__(self, answer: str = "the summary") -> None:
        self.calls: list[tuple[list[Message], str]] = []
        self.answer = answer

    async def __call__(self, messages: Sequence[Message], instruction: str) -> str:
        self.calls.append((list(messages), instruction))
        return self.answer


class ScriptedSummaryModel:
    """A summarizing model (a provider) that answers `(text, stop reason)` pairs in order (the
    last one repeats) and records every request."""

    def __init__(self, *answers: tuple[str, str]) -> None:
        self.answers = list(answers)
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> Message:
        self.requests.append(request)
        text, stop = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        usage = TokenUsage(input_tokens=1, output_tokens=1)
        return Message.assistant(text, usage=usage, metadata={STOP_REASON_KEY: stop})


@tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    await trio.lowlevel.checkpoint()
    return a + b


def sse(*events: Any, event_names: bool = False) -> bytes:
    """An SSE body, one event per item: a dict becomes `data: <json>`, a str or bytes is sent as
    the data verbatim; with `event_names`, a dict's `type` is named in an `event:` line."""
    out = []
    for e in events:
        data = e if isinstance(e, bytes) else e.encode() if isinstance(e, str) else orjson.dumps(e)
        name = f"event: {e['type']}\n".encode() if event_names and isinstance(e, dict) else b""
        out.append(name + b"data: " + data + b"\n\n")
    return b"".join(out)
