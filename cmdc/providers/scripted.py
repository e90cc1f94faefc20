"""`ScriptedProvider`: replays a script of replies, tool calls and failures, for tests."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

import trio

from .._check import seconds, text
from ..errors import ConfigError, ProviderError
from ..message import Message, TokenUsage, ToolCall
from ..tokens import estimate_message_tokens, estimate_tokens_from_messages
from .base import ModelRequest

Reply = Message | str
"""What a script step (or a callable step) answers with: an assistant message, or its text."""

Step = Reply | BaseException | type[BaseException] | Callable[[ModelRequest], Reply | Awaitable[Reply]]
"""One script step: a reply, an exception (instance or class) to raise, or a callable (sync or
async) that takes the request and returns a reply."""


def with_usage(request: ModelRequest, reply: Message) -> Message:
    """`reply` as is when it carries usage; otherwise a copy (same id) with estimated usage."""
    if reply.usage is not None:
        return reply
    usage = TokenUsage(
        input_tokens=estimate_tokens_from_messages(request.messages),
        output_tokens=estimate_message_tokens(reply),
    )
    return reply.evolve(usage=usage)


class ScriptedProvider:
    """A provider that answers each request with the next step of `replies`.

    Steps: an assistant `Message` (returned as is; one without usage gets estimated usage), a
    `str` (an assistant text reply), an exception instance or class (raised), or a callable
    taking the `ModelRequest` and returning a `Message` or `str`, sync or async. Every request
    is recorded in `requests` before it is answered. Past the end of the script it raises
    `ProviderError`, unless `cycle` is set. `delay` seconds are slept before each answer.
    """

    _call_ids: ClassVar[Iterator[int]] = itertools.count(1)

    def __init__(
        self, replies: Iterable[Step], *, name: str = "scripted", cycle: bool = False, delay: float = 0.0
    ) -> None:
        if isinstance(replies, (str, bytes, Message)) or not isinstance(replies, Iterable):
            raise ConfigError(f"replies must be a sequence of script steps, got {type(replies).__name__}")
        self.name = text(name, "name")
        self.script: tuple[Step, ...] = tuple(replies)
        self.cycle = bool(cycle)
        self.delay = seconds(delay, "delay", zero=True)
        self.requests: list[ModelRequest] = []
        self._position = 0

    @classmethod
    def tool_call(
        cls, name: str, arguments: Mapping[str, Any] | None = None, *, id: str | None = None, text: str = ""
    ) -> Message:
        """An assistant message with one tool call; the call id defaults to a fresh `call_<n>`."""
        call_id = id if id is not None else f"call_{next(cls._call_ids)}"
        return Message.assistant(text, tool_calls=(ToolCall(id=call_id, name=name, arguments=arguments or {}),))

    async def complete(self, request: ModelRequest) -> Message:
        self.requests.append(request)
        if self.delay:
            await trio.sleep(self.delay)
        index = self._position
        if index >= len(self.script) and (not self.cycle or not self.script):
            raise ProviderError(f"scripted provider {self.name}: script exhausted after {len(self.script)} replies")
        self._position += 1
        index %= len(self.script)
        step = self.script[index]
        result: object = step
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, type):
            if issubclass(step, BaseException):
                raise step
        elif not isinstance(step, (Message, str)) and callable(step):
            result = step(request)
            if inspect.isawaitable(result):
                result = await result
        return with_usage(request, self._as_message(result, index))

    def _as_message(self, value: object, index: int) -> Message:
        where = f"scripted provider {self.name}: reply {index + 1}"
        if isinstance(value, str):
            return Message.assistant(value)
        if not isinstance(value, Message):
            raise ProviderError(f"{where} is a {type(value).__name__} ({value!r:.80}), not an assistant Message")
        if value.role != "assistant":
            raise ProviderError(f"{where} is a {value.role!r} message, not an assistant Message")
        return value
