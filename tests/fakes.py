"""Fakes shared by the tests: a recording summarizer, a tool, and an SSE body builder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import trio

from cmdc import Message, tool


class Recorder:
    """A summarizer (an async callable) that records what it was given and answers `answer`."""

    def __init__(self, answer: str = "the summary") -> None:
        self.calls: list[tuple[list[Message], str]] = []
        self.answer = answer

    async def __call__(self, messages: Sequence[Message], instruction: str) -> str:
        self.calls.append((list(messages), instruction))
        return self.answer


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
