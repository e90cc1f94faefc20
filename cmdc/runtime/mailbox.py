"""What travels through an agent's mailbox: the requests (a turn, a manual compaction, queued
messages, a call run inside the agent task, a deactivation), each with its one-shot reply slot,
and the exceptions that end the agent's loop. Shared by `ref` (which sends) and `agent` (which
serves)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..errors import ConfigError, InvalidMessage
from ..message import Message

if TYPE_CHECKING:
    from .agent import Agent

# The names of the agents a delegated turn is running for (to refuse cycles and bound depth).
current_chain: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("cmdc_chain", default=())


class Reply:
    """A one-shot reply slot carried by a request."""

    __slots__ = ("_event", "abandoned", "error", "value")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.abandoned = False

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def set(self, value: Any) -> None:
        if not self._event.is_set():
            self.value = value
            self._event.set()

    def fail(self, error: BaseException) -> None:
        if not self._event.is_set():
            self.error = error
            self._event.set()

    async def wait(self) -> Any:
        await self._event.wait()
        if self.error is not None:
            raise self.error
        return self.value


@attrs.define(slots=True)
class Prompt:
    messages: tuple[Message, ...]
    reply: Reply
    chain: tuple[str, ...] = ()
    context: contextvars.Context | None = None  # the caller's, for a tracer to parent the turn


def prompt_request(content: str | Message | Sequence[Message]) -> Prompt:
    """A turn request, with the caller's chain of agents and its context."""
    return Prompt(as_messages(content), Reply(), current_chain.get(), contextvars.copy_context())


@attrs.define(slots=True)
class Compact:
    instruction: str | None
    reply: Reply
    context: contextvars.Context | None = None  # the caller's, for a tracer


@attrs.define(slots=True)
class Send:
    messages: tuple[Message, ...]


@attrs.define(slots=True)
class Call:
    """A request answered by running `fn(agent)` inside the agent task (ping, stop, ...)."""

    fn: Callable[[Agent], Any]
    reply: Reply


# The agent loop's control flow (never an error a user sees, so not in cmdc.errors): private to
# this package, shared by its modules.
class _Crash(Exception):
    """An unexpected error in a turn: delivered to the caller, then the agent crashes."""


class _StopRequested(Exception):
    """Raised by a `Call` (`AgentRef.stop`) inside the agent task: its loop ends."""


@attrs.define(slots=True)
class Deactivate:
    """Asks an idle agent to end its task, keeping its state in the store (see `Host`)."""

    reply: Reply


class _DeactivateNow(Exception):
    """A deactivation went through (its state saved): the agent's loop ends."""


def as_messages(content: str | Message | Sequence[Message]) -> tuple[Message, ...]:
    if isinstance(content, str):
        return (Message.user(content),)
    if isinstance(content, Message):
        return (content,)
    if isinstance(content, (list, tuple)) and content and all(isinstance(m, Message) for m in content):
        return tuple(content)
    raise ConfigError(f"a prompt must be text, a Message or a non-empty list of Messages, got {content!r:.80}")


def begun(messages: Sequence[Message]) -> bool:
    return any(m.role != "system" for m in messages)


def check_system(begun: bool, messages: Sequence[Message]) -> None:
    """Refuse a system message once the conversation has begun (after any other message):
    the system prompt is `spawn(instructions=...)`; one mid-conversation is almost always a
    mistake, and providers place or reject it differently."""
    for m in messages:
        if m.role != "system":
            begun = True
        elif begun:
            raise InvalidMessage(
                "a system message once the conversation has begun is refused; give the system "
                "prompt as spawn(..., instructions=...), or send this text as a user message"
            )


__all__ = [
    "Call",
    "Compact",
    "Deactivate",
    "Prompt",
    "Reply",
    "Send",
    "as_messages",
    "begun",
    "check_system",
    "current_chain",
    "prompt_request",
]
