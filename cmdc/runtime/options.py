"""How an agent runs: `AgentOptions`, one checked value per option, and `SpawnOptions`, the same
options as the keywords `Runtime.spawn` takes (a `TypedDict`, so a type checker catches a
misspelt or mistyped one)."""

from __future__ import annotations

from typing import Literal, TypedDict, get_args

import attrs

from .._check import choice, integer, known_names, optional_integer, optional_seconds, seconds, validator
from ..errors import ConfigError

RestartPolicy = Literal["permanent", "transient", "temporary"]

_OPTION = "agent option {!r}"
_positive = validator(integer, _OPTION)
_non_negative = validator(integer, _OPTION, minimum=0)
_seconds = validator(seconds, _OPTION)
_restart = validator(choice, _OPTION, options=get_args(RestartPolicy))


@attrs.frozen
class AgentOptions:
    """How an agent runs. Every value is checked; a bad one raises `ConfigError` naming it.

    - `max_steps`: model requests per turn before `StepLimitReached`.
    - `tool_timeout`: seconds per tool call (a `Tool.timeout` overrides it); None: no bound.
    - `max_forced_compactions`: forced compactions per step after `ContextOverflow`.
    - `mailbox_size`: requests queued before senders wait (or `MailboxFull`).
    - `max_output_tokens`: passed to the provider with each request.
    - `restart`: what a crash (an unexpected, non-cmdc exception in a turn) does. `temporary`:
      the agent ends. `transient`: it restarts from its last committed state, at most
      `max_restarts` times within `restart_window` seconds, then ends. `permanent`: like
      transient, but past the limit it waits out `restart_window` and restarts again: it only
      ends by `stop()` or with the runtime.
    - `max_delegation_depth`: how deep a chain of agents delegating to agents may go.
    - `compaction_cooldown`: after an automatic compaction fails, seconds before the next
      automatic one is tried (the turn goes on uncompacted; an overflow still forces one).
    - `max_parallel_tools`: tool calls of one reply that run (concurrently); each call past
      it gets an error result the model can read instead of running.
    - `max_children`: temporary children (`delegate` without an agent) at work at once.
    - `max_continuations`: per turn, how many times a text reply cut off by the full context
      window (Anthropic's `model_context_window_exceeded`, or stop `length`/`max_tokens` with
      prompt + output at the window) is followed by a compaction and a request to continue
      (a `continued` event each); 0 returns such a reply as it is.
    - `max_queued`: messages queued with `send` / `send_nowait` and not yet taken by a turn;
      past it both raise `MailboxFull`. A turn that fails before its first commit drops the
      queued messages it took (a `queued_dropped` event; the error says how many), so they
      never poison later turns; an aborted or cancelled turn leaves them queued.
      `AgentRef.queued()` shows them, `AgentRef.clear_queued()` drops them.
    - `summarizer_timeout`: seconds one summarizer attempt may take before it counts as failed
      (retried, then failed over like any failed attempt: `SummarizerTimeout`); None: no bound.
    - `max_tool_argument_values`, `max_tool_argument_depth`: one tool call's arguments with more
      values in all (object members and array items, through every level; 10,000), or nested
      deeper (32 levels), are not validated nor run: the model reads an error saying so. (The
      HTTP providers refuse them already while reading the reply: `ReplyLimits`.)
    """

    max_steps: int = attrs.field(default=25, validator=_positive)
    tool_timeout: float | None = attrs.field(default=60.0, validator=validator(optional_seconds, _OPTION))
    max_forced_compactions: int = attrs.field(default=2, validator=_non_negative)
    mailbox_size: int = attrs.field(default=16, validator=_positive)
    max_output_tokens: int | None = attrs.field(default=None, validator=validator(optional_integer, _OPTION))
    restart: RestartPolicy = attrs.field(default="transient", validator=_restart)
    max_restarts: int = attrs.field(default=3, validator=_non_negative)
    restart_window: float = attrs.field(default=60.0, validator=_seconds)
    max_delegation_depth: int = attrs.field(default=3, validator=_positive)
    compaction_cooldown: float = attrs.field(default=30.0, validator=_seconds)
    max_parallel_tools: int = attrs.field(default=32, validator=_positive)
    max_children: int = attrs.field(default=8, validator=_positive)
    max_continuations: int = attrs.field(default=2, validator=_non_negative)
    max_queued: int = attrs.field(default=256, validator=_positive)
    summarizer_timeout: float | None = attrs.field(default=300.0, validator=validator(optional_seconds, _OPTION))
    max_tool_argument_values: int = attrs.field(default=10_000, validator=_positive)
    max_tool_argument_depth: int = attrs.field(default=32, validator=_positive)


class SpawnOptions(TypedDict, total=False):
    """The agent options as `spawn` keywords: `rt.spawn("a1", provider, max_steps=5)`. Each is
    the `AgentOptions` field of its name (documented there); `tests/runtime/test_spawn_api.py` keeps the
    two lists equal."""

    max_steps: int
    tool_timeout: float | None
    max_forced_compactions: int
    mailbox_size: int
    max_output_tokens: int | None
    restart: RestartPolicy
    max_restarts: int
    restart_window: float
    max_delegation_depth: int
    compaction_cooldown: float
    max_parallel_tools: int
    max_children: int
    max_continuations: int
    max_queued: int
    summarizer_timeout: float | None
    max_tool_argument_values: int
    max_tool_argument_depth: int


OPTION_NAMES = frozenset(f.name for f in attrs.fields(AgentOptions))
DEFAULT_OPTIONS = AgentOptions()


def agent_options(options: AgentOptions | None, values: SpawnOptions) -> AgentOptions:
    """The options `spawn` was given: `options` (or the defaults) with the keyword `values`
    over it. An unknown keyword (from a caller no type checker saw) is a `ConfigError` naming
    it; a bad value, one naming its option (`AgentOptions` checks each)."""
    known_names(values, OPTION_NAMES, "spawn option")
    if options is None:
        return AgentOptions(**values) if values else DEFAULT_OPTIONS
    if not isinstance(options, AgentOptions):
        raise ConfigError(f"options must be an AgentOptions value, got {options!r:.80}")
    return attrs.evolve(options, **values) if values else options


__all__ = ["DEFAULT_OPTIONS", "OPTION_NAMES", "AgentOptions", "RestartPolicy", "SpawnOptions", "agent_options"]
