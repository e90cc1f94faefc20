"""Fakes shared by the tests: a recording summarizer, a scripted summarizing model, an adding
model and its tool, a State builder, an SSE body builder, and a drain for subscriptions."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import trio

import cmdc
from cmdc import Message, State, TokenUsage, ToolCall, tool
from cmdc.bus import Subscription
from cmdc.events import Event
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


_call_ids = itertools.count(1)


class Adder:
    """A deterministic model for `add`: on a user message it calls `add` with the last two
    numbers of the latest message that holds two, then answers `answer: <the tool's result>`;
    asked to summarize, it answers a short summary. Its replies report usage, and its calls
    carry some words, so that a summary of old turns is smaller than they are. Call ids are
    unique in the process (a restarted agent's new model never reuses an old one)."""

    THINKING = "I will add the two numbers with the add tool, then report the sum. " * 4

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> Message:
        await trio.lowlevel.checkpoint()
        self.calls += 1
        usage = TokenUsage(input_tokens=cmdc.estimate_tokens_from_messages(request.messages), output_tokens=5)
        if request.metadata.get("cmdc.purpose") == "summarize":
            return Message.assistant("summary of earlier turns", usage=usage)
        last = request.messages[-1]
        if last.role == "user":
            asked = next(m for m in reversed(request.messages) if len(re.findall(r"\d+", m.text)) >= 2)
            a, b = map(int, re.findall(r"\d+", asked.text)[-2:])
            call = ToolCall(id=f"add{next(_call_ids)}", name="add", arguments={"a": a, "b": b})
            return Message.assistant(self.THINKING, tool_calls=(call,), usage=usage)
        return Message.assistant(f"answer: {last.text}", usage=usage)


def make_state(offload: Path, messages: Sequence[Message] = (), *, agent_id: str = "a1", **config: Any) -> State:
    """A State of `messages` whose journal goes to the directory `offload`, with `config`."""
    return State(agent_id=agent_id, messages=messages, config={"compact_offload_dir": str(offload), **config})


def drain(sub: Subscription) -> list[Event]:
    """The events a subscription holds now, taken without waiting."""
    out = []
    while True:
        try:
            out.append(sub.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return out


def sse(*events: Any, event_names: bool = False) -> bytes:
    """An SSE body, one event per item: a dict becomes `data: <json>`, a str or bytes is sent as
    the data verbatim; with `event_names`, a dict's `type` is named in an `event:` line."""
    out = []
    for e in events:
        data = e if isinstance(e, bytes) else e.encode() if isinstance(e, str) else orjson.dumps(e)
        name = f"event: {e['type']}\n".encode() if event_names and isinstance(e, dict) else b""
        out.append(name + b"data: " + data + b"\n\n")
    return b"".join(out)


def new_process() -> None:
    """Forget the process-wide journal stores (`cmdc._stores`), as a new process starts
    without them: the next compactor or store opens the journals afresh."""
    from cmdc import _stores

    _stores._STORES.clear()
