"""Fakes for testing code that uses cmdc: scripted and simulated models, a recording
summarizer, synthetic conversations, and `drain` for the events an agent published.

Everything here is deterministic and offline. A test of an agent with a tool and a compaction:

```python
import tempfile

import trio

import cmdc
from cmdc.testing import RecordingSummarizer, ScriptedProvider, drain


async def main() -> None:
    words = "about the parser and its tests " * 10
    model = ScriptedProvider([f"answer {i}: {words}" for i in range(3)])
    summarizer = RecordingSummarizer("what happened so far")
    config = {"compact_trigger": ("messages", 5), "compact_keep": ("messages", 2)}
    with tempfile.TemporaryDirectory() as store:
        async with cmdc.open_runtime(store=store) as rt:
            agent = await rt.spawn("a1", model, summarizer=summarizer, config=config)
            with rt.subscribe("a1") as sub:
                for i in range(3):
                    await agent.prompt(f"question {i}")
                events = drain(sub)
            state = await agent.state()
    assert [e.kind for e in events].count("compaction_end") == state.compactions == 1
    (call,) = summarizer.calls  # the first question is the task: pinned, never summarized
    assert [m.text[:8] for m in call.messages] == ["answer 0", "question"]
    assert len(model.requests) == 3


trio.run(main)
```

`ScriptedProvider` replays a script; `SimulatedModel` answers anything plausibly, reports
usage, and overflows like a real model (the same classes as in `cmdc.providers`):

```python
import trio

import cmdc
from cmdc.providers import ModelRequest
from cmdc.testing import SimulatedModel, conversation

model = SimulatedModel(context_window=2_000)
reply = trio.run(model.complete, ModelRequest(messages=conversation(4)))
assert reply.role == "assistant" and reply.usage is not None
try:
    trio.run(model.complete, ModelRequest(messages=conversation(60)))
except cmdc.ContextOverflow as overflow:
    assert overflow.limit == 2_000 and overflow.prompt_tokens is not None
else:
    raise AssertionError("60 messages of ~400 characters fit a 2,000-token window")
```
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import trio

from ._synthetic import conversation
from .events import Event
from .message import Message
from .providers import ScriptedProvider, SimulatedModel


class SummarizerCall(NamedTuple):
    """One request a `RecordingSummarizer` answered: the messages to summarize, in order, and
    the instruction it was given."""

    messages: tuple[Message, ...]
    instruction: str


class RecordingSummarizer:
    """A summarizer (an async callable `(messages, instruction) -> str`, usable wherever cmdc
    takes one) that records every call in `calls` and answers `answer`, always the same text.

    ```python
    import tempfile

    import trio

    import cmdc
    from cmdc.testing import RecordingSummarizer, conversation

    summarizer = RecordingSummarizer("the summary")
    with tempfile.TemporaryDirectory() as journal:
        config = {"compact_keep": ("messages", 2), "compact_offload_dir": journal}
        state = cmdc.State(agent_id="a1", messages=conversation(12), config=config)
        outcome = trio.run(cmdc.Compactor(summarizer=summarizer).force_compact, state)
    assert isinstance(outcome, cmdc.Compacted)
    (call,) = summarizer.calls
    assert len(call.messages) == outcome.report.evicted and "summar" in call.instruction
    assert "the summary" in next(m.text for m in outcome.state.messages if m.is_summary)
    ```
    """

    def __init__(self, answer: str = "the summary") -> None:
        self.answer = answer
        self.calls: list[SummarizerCall] = []

    def __repr__(self) -> str:
        return f"RecordingSummarizer(answer={self.answer!r}, calls={len(self.calls)})"

    async def __call__(self, messages: Sequence[Message], instruction: str) -> str:
        self.calls.append(SummarizerCall(tuple(messages), instruction))
        await trio.lowlevel.checkpoint()
        return self.answer


class EventSource(Protocol):
    """What `drain` reads: a subscription (`Runtime.subscribe`, `EventBus.subscribe`)."""

    def receive_nowait(self) -> Event: ...


def drain(source: EventSource) -> list[Event]:
    """The events `source` holds now, in order, taken without waiting (an `events_dropped`
    event included where its buffer overflowed). An agent's call (`prompt`, `state`, `send`)
    returns after the events of its work were published, so after it `drain` sees them all.

    ```python
    import tempfile

    import trio

    import cmdc
    from cmdc.testing import ScriptedProvider, drain


    async def main(store: str) -> None:
        async with cmdc.open_runtime(store=store) as rt:
            agent = await rt.spawn("a1", ScriptedProvider(["hello"]))
            with rt.subscribe("a1") as sub:
                await agent.prompt("hi")
                kinds = [e.kind for e in drain(sub)]
                assert kinds == ["turn_start", "request", "response", "turn_end"]
                assert drain(sub) == []  # taken: nothing is left


    with tempfile.TemporaryDirectory() as store:
        trio.run(main, store)
    ```
    """
    out: list[Event] = []
    while True:
        try:
            out.append(source.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return out


__all__ = [
    "EventSource",
    "RecordingSummarizer",
    "ScriptedProvider",
    "SimulatedModel",
    "SummarizerCall",
    "conversation",
    "drain",
]
