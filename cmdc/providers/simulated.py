"""`SimulatedModel`: a plausible, deterministic fake model for demos and benchmarks.

It has a context window and raises `ContextOverflow` like a real model when the prompt (plus the
output room the request asks for) does not fit, reports usage, calls the tools it is offered (a
bounded number of rounds) with plausible arguments for every parameter of their schemas (see
`_arguments`: paths and words from the conversation, enums, ranges, nested objects; a named agent
when `delegate` lists any), answers in text that echoes the user's words, and summarizes
(briefly) when asked to by the compactor.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import orjson
import trio

from .._check import integer, number_in, seconds, text
from .._clip import clip
from .._frozen import thaw
from ..errors import ContextOverflow
from ..message import Message, TokenUsage, ToolCall
from ..tokens import estimate_message_tokens, estimate_text_tokens, estimate_tokens_from_messages
from ._arguments import arguments_for, example_value
from .base import ModelRequest, ToolSchema

PURPOSE_KEY = "cmdc.purpose"
SUMMARIZE = "summarize"

_WORDS = (
    "the", "module", "parser", "config", "test", "change", "result", "cache", "schema", "request",
    "handler", "error", "file", "function", "update", "check", "value", "path", "state", "next",
)  # fmt: skip
_EDGE_LINES = 4


def _clip(line: str, width: int) -> str:
    return clip(line, width, keep="head", marker="…")


def tool_schema_tokens(tool: ToolSchema) -> int:
    """What a tool's schema costs in the prompt: the estimate of its JSON form."""
    data = {"name": tool.name, "description": tool.description, "parameters": thaw(tool.parameters)}
    return estimate_text_tokens(orjson.dumps(data).decode())


def example_arguments(parameters: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    """Arguments for a tool with these `parameters`, without a conversation to draw on."""
    value = example_value(parameters, rng)
    return value if isinstance(value, dict) else {}


def _not_called_yet(tools: tuple[ToolSchema, ...], messages: tuple[Message, ...]) -> list[ToolSchema]:
    """The tools not called since the last user message (a model rarely repeats a call)."""
    used: set[str] = set()
    for m in reversed(messages):
        if m.role == "user":
            break
        used.update(c.name for c in m.tool_calls)
    return [t for t in tools if t.name not in used]


def tool_rounds(messages: tuple[Message, ...]) -> int:
    """Assistant messages with tool calls since the last user message."""
    rounds = 0
    for m in reversed(messages):
        if m.role == "user":
            break
        if m.role == "assistant" and m.tool_calls:
            rounds += 1
    return rounds


class SimulatedModel:
    """A fake model with a `context_window`, deterministic given `seed` and the requests it sees.

    The prompt costs the messages' estimate plus each tool schema's; when that plus
    `max_output_tokens` exceeds the window it raises `ContextOverflow` with both figures.
    Summarization requests (`metadata["cmdc.purpose"] == "summarize"`) get a summary of at most
    `summary_chars` characters. Otherwise, with tools offered and fewer than `max_tool_rounds`
    tool rounds since the last user message, it calls 1-2 tools with probability
    `tool_probability`; else it answers with ~`reply_chars` characters of text that quote the
    last user message. Every reply carries usage; `latency` seconds pass before each answer.
    Like a server's prompt cache, it reports as `cache_read_tokens` the prompt tokens of the
    messages (and tools) its previous request and answer had in common with this request, as
    a prefix.
    """

    def __init__(
        self,
        context_window: int = 8_000,
        *,
        seed: int = 0,
        reply_chars: int = 300,
        tool_probability: float = 0.5,
        max_tool_rounds: int = 2,
        summary_chars: int = 1_200,
        latency: float = 0.0,
        name: str = "simulated",
    ) -> None:
        self.context_window = integer(context_window, "context_window")
        integer(seed, "seed", minimum=None)
        self.reply_chars = integer(reply_chars, "reply_chars")
        self.tool_probability = number_in(tool_probability, "tool_probability", 0, 1)
        self.max_tool_rounds = integer(max_tool_rounds, "max_tool_rounds", minimum=0)
        self.summary_chars = integer(summary_chars, "summary_chars")
        self.latency = seconds(latency, "latency", zero=True)
        self.name = text(name, "name")
        self.seed = seed
        self.calls = 0
        self.overflows = 0
        self._rng = random.Random(seed)
        self._call_ids = 0
        self._cache: tuple[tuple[ToolSchema, ...], tuple[Message, ...]] = ((), ())

    def cached_tokens(self, request: ModelRequest) -> int:
        """The prompt tokens of `request` its cached prefix holds (0 when the tools differ)."""
        tools, messages = self._cache
        if tools != request.tools:
            return 0
        same = 0
        for a, b in zip(messages, request.messages, strict=False):
            if a is not b and a != b:
                break
            same += 1
        if not same:
            return 0
        return estimate_tokens_from_messages(request.messages[:same]) + sum(tool_schema_tokens(t) for t in tools)

    def prompt_tokens(self, request: ModelRequest) -> int:
        """The request's prompt size as this model counts it."""
        return estimate_tokens_from_messages(request.messages) + sum(tool_schema_tokens(t) for t in request.tools)

    async def complete(self, request: ModelRequest) -> Message:
        self.calls += 1
        if self.latency:
            await trio.sleep(self.latency)
        prompt = self.prompt_tokens(request)
        output = request.max_output_tokens or 0
        if prompt + output > self.context_window:
            self.overflows += 1
            if prompt > self.context_window:
                message = f"prompt is too long: {prompt} tokens > {self.context_window} maximum"
            else:  # the prompt fits, but not with the output it asks room for
                message = (
                    f"input length and `max_tokens` exceed context limit: {prompt} + {output} > "
                    f"{self.context_window}, decrease input length or `max_tokens` and try again"
                )
            raise ContextOverflow(message, prompt_tokens=prompt, limit=self.context_window)
        if request.metadata.get(PURPOSE_KEY) == SUMMARIZE:
            reply = Message.assistant(self._summary(request))
        elif (
            (fresh := _not_called_yet(request.tools, request.messages))
            and tool_rounds(request.messages) < self.max_tool_rounds
            and self._rng.random() < self.tool_probability
        ):
            reply = self._tool_reply(fresh, request.messages)
        else:
            reply = Message.assistant(self._text_reply(request.messages))
        cached = min(prompt, self.cached_tokens(request))
        usage = TokenUsage(input_tokens=prompt, output_tokens=estimate_message_tokens(reply), cache_read_tokens=cached)
        reply = reply.evolve(usage=usage)
        self._cache = (request.tools, (*request.messages, reply))
        return reply

    def _summary(self, request: ModelRequest) -> str:
        text = "\n".join(m.text for m in request.messages if m.role != "system")
        lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
        header = f"Summary of {len(lines)} lines ({estimate_text_tokens(text)} tokens) of conversation:"
        if len(lines) > 2 * _EDGE_LINES:
            lines = [*lines[:_EDGE_LINES], "[...]", *lines[-_EDGE_LINES:]]
        width = max(1, (self.summary_chars - len(header) - len(lines)) // max(1, len(lines)))
        return clip(
            "\n".join([header, *(_clip(line, width) for line in lines)]), self.summary_chars, keep="head", marker=""
        )

    def _tool_reply(self, tools: list[ToolSchema], messages: tuple[Message, ...]) -> Message:
        calls = []
        for tool in self._rng.sample(tools, min(len(tools), self._rng.randint(1, 2))):
            self._call_ids += 1
            arguments = arguments_for(tool, messages, self._rng)
            calls.append(ToolCall(id=f"sim_{self._call_ids}", name=tool.name, arguments=arguments))
        names = ", ".join(dict.fromkeys(c.name for c in calls))
        return Message.assistant(f"Calling {names}.", tool_calls=calls)

    def _text_reply(self, messages: tuple[Message, ...]) -> str:
        users = [m for m in reversed(messages) if m.role == "user"]
        last = next((m for m in users if not m.is_summary), users[0] if users else None)
        topic = " ".join(last.text.split()[:6]) if last is not None else ""
        text = f'About "{topic}": ' if topic else "About your request: "
        words: list[str] = []
        size = len(text)
        while size < self.reply_chars:
            words.append(self._rng.choice(_WORDS))
            size += len(words[-1]) + 1
        return (text + " ".join(words)).rstrip() + "."
