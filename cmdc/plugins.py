"""The plugin contract: the hooks, their typed contexts, and the fold that runs them.

A plugin subclasses `Plugin` and overrides the hooks it needs. Each hook gets a frozen context
and returns `None` (carry on), a new value of its subject (carry on with it), `Skip(reason)`
(skip the thing and stop the pipeline) or `Abort(reason)` (end the turn with an error); each
hook's signature says which of these it may return. Plugins run in priority order as a fold, the
way structlog's processors do. A hook that raises, times out, or returns a value of the wrong
kind is reported and skipped: it never corrupts `State`.

| hook             | context          | subject (what it may return instead)            |
|------------------|------------------|-------------------------------------------------|
| `on_start`       | `OnStart`        | the agent's `State`                             |
| `before_request` | `BeforeRequest`  | the `State` about to be sent (`Skip`, `Abort`)  |
| `after_response` | `AfterResponse`  | the assistant `Message` (`Abort`)               |
| `before_tool`    | `BeforeTool`     | the `ToolCall`, same id (`Skip`, `Abort`)       |
| `after_tool`     | `AfterTool`      | the tool result `Message`, same call (`Abort`)  |
| `before_compact` | `BeforeCompact`  | a subset of the messages to evict (`Skip`, `Abort`) |
| `after_compact`  | `AfterCompact`   | the compacted `State`                           |
| `on_error`       | `OnError`        | nothing                                         |
| `on_stop`        | `OnStop`         | nothing                                         |
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, Literal, TypeAlias, TypeVar, cast

import attrs
import trio

from ._report import CompactionReport
from .errors import InvalidPlugin, PluginReturnError
from .message import Message, ToolCall
from .state import State
from .tools import Tool

T = TypeVar("T")
C = TypeVar("C")

HookName = Literal[
    "on_start",
    "before_request",
    "after_response",
    "before_tool",
    "after_tool",
    "before_compact",
    "after_compact",
    "on_error",
    "on_stop",
]


@attrs.frozen
class Skip:
    """Skip this thing (a compaction, a tool call, a request) and stop the pipeline."""

    reason: str = ""


@attrs.frozen
class Abort:
    """End the turn with an error the caller sees."""

    reason: str = ""


# -- the contexts, one per hook -----------------------------------------------------------------


@attrs.frozen
class OnStart:
    """Context of `on_start` (the agent task is starting): return a new `State` or None."""

    state: State
    error: None = None  # kept so code written for the old shared LifecycleContext still reads


@attrs.frozen
class BeforeRequest:
    """Context of `before_request`: return a new `State`, `Skip` (end the turn), `Abort` or None."""

    state: State
    step: int


@attrs.frozen
class AfterResponse:
    """Context of `after_response`: return a new assistant `Message`, `Abort` or None."""

    state: State
    reply: Message


@attrs.frozen
class BeforeTool:
    """Context of `before_tool`: return a new `ToolCall` (same id), `Skip`, `Abort` or None.
    `tool` is the tool the call names, None when no such tool exists."""

    state: State
    call: ToolCall
    tool: Tool | None
    result: None = None  # kept so code written for the old shared ToolContext still reads


@attrs.frozen
class AfterTool:
    """Context of `after_tool`: return a new result `Message` (same call id), `Abort` or None."""

    state: State
    call: ToolCall
    tool: Tool | None
    result: Message


@attrs.frozen
class BeforeCompact:
    """Context of `before_compact`: return a subset of `evicted` to evict less, `Skip`, `Abort`
    or None."""

    state: State
    evicted: tuple[Message, ...]
    kept: tuple[Message, ...]
    reason: str
    instruction: str | None = None


@attrs.frozen
class AfterCompact:
    """Context of `after_compact`: return a new `State` (e.g. with skills re-injected) or None.
    The offload has happened: it cannot veto.

    To add context, return `ctx.insert_after_summary(note)`: it lands right after the summary,
    before the kept messages. `ctx.state.append(note)` appends, as everywhere: after the
    user's current question, which the model would then not answer."""

    state: State
    report: CompactionReport

    def insert_after_summary(self, *messages: Message) -> State:
        """`state` with `messages` right after the summary (see `State.insert_after_summary`)."""
        return self.state.insert_after_summary(*messages)


@attrs.frozen
class OnError:
    """Context of `on_error` (a turn failed with `error`): observe only, return None."""

    state: State
    error: BaseException


@attrs.frozen
class OnStop:
    """Context of `on_stop` (the agent task is ending): observe only, return None."""

    state: State
    error: None = None  # kept so code written for the old shared LifecycleContext still reads


# The contexts' earlier names: one context per pair of hooks (annotations keep working).
ToolContext: TypeAlias = BeforeTool | AfterTool
RequestContext: TypeAlias = BeforeRequest
ResponseContext: TypeAlias = AfterResponse
LifecycleContext: TypeAlias = OnStart | OnError | OnStop


class Plugin:
    """Base class: override the hooks you need. Lower `priority` runs first; `hook_timeout`
    (seconds, or None) bounds each hook call. Hooks not overridden are not called at all."""

    priority: int = 100
    hook_timeout: float | None = 30.0

    @property
    def name(self) -> str:
        return type(self).__name__

    async def on_start(self, ctx: OnStart) -> State | None:
        """The agent is starting: return a new `State` to start from, or None."""
        return None

    async def before_request(self, ctx: BeforeRequest) -> State | Skip | Abort | None:
        """Before each model request: return the `State` to send, `Skip` to end the turn, or `Abort`."""
        return None

    async def after_response(self, ctx: AfterResponse) -> Message | Abort | None:
        """After each model reply: return an assistant `Message` to use instead, or `Abort`."""
        return None

    async def before_tool(self, ctx: BeforeTool) -> ToolCall | Skip | Abort | None:
        """Before a tool call: return a rewritten `ToolCall` (same id), `Skip` it, or `Abort`."""
        return None

    async def after_tool(self, ctx: AfterTool) -> Message | Abort | None:
        """After a tool call: return a result `Message` for the same call to use instead, or `Abort`."""
        return None

    async def before_compact(self, ctx: BeforeCompact) -> Sequence[Message] | Skip | Abort | None:
        """Before a compaction: return a subset of `ctx.evicted` to evict, `Skip` it, or `Abort`."""
        return None

    async def after_compact(self, ctx: AfterCompact) -> State | None:
        """After a compaction (offloaded, summarized): return a new `State`, or None."""
        return None

    async def on_error(self, ctx: OnError) -> None:
        """A turn failed with `ctx.error` (the caller gets it too): observe only."""
        return None

    async def on_stop(self, ctx: OnStop) -> None:
        """The agent is stopping: observe only."""
        return None

    def implements(self, hook: HookName) -> bool:
        """True when this plugin overrides `hook` (others are not called at all)."""
        return getattr(type(self), hook, None) is not getattr(Plugin, hook)


def sort_plugins(plugins: Iterable[Plugin]) -> tuple[Plugin, ...]:
    """Plugins in run order: by priority, then registration order."""
    items = tuple(plugins)
    for p in items:
        if not isinstance(p, Plugin):
            raise InvalidPlugin(f"plugins must subclass cmdc.Plugin, got {type(p).__name__}")
    return tuple(sorted(items, key=lambda p: p.priority))


@attrs.frozen
class Folded(Generic[T]):
    """The outcome of a fold: the final subject, and who stopped it, if anyone."""

    value: T
    stop: Skip | Abort | None = None
    stopped_by: str | None = None


def check_result(hook: HookName, value: object, current: T) -> T:
    """The value a hook returned, checked against the current subject of the fold; raises
    `PluginReturnError` when it cannot take the subject's place. The one place these rules live."""
    if hook in ("on_start", "before_request", "after_compact"):
        if not isinstance(value, State):
            raise PluginReturnError(f"{hook} must return a State, got {value!r:.80}")
        if value.agent_id != cast(State, current).agent_id:
            raise PluginReturnError(f"{hook} may not change the agent id (got {value.agent_id!r})")
    elif hook == "after_response":
        if not isinstance(value, Message) or value.role != "assistant":
            raise PluginReturnError(f"after_response must return an assistant Message, got {value!r:.80}")
    elif hook == "before_tool":
        call_id = cast(ToolCall, current).id
        if not isinstance(value, ToolCall) or value.id != call_id:
            raise PluginReturnError(f"before_tool must return a ToolCall with id {call_id}, got {value!r:.80}")
    elif hook == "after_tool":
        result_for = cast(Message, current).tool_call_id
        if not isinstance(value, Message) or value.tool_call_id != result_for:
            raise PluginReturnError(f"after_tool must return a tool result for {result_for}, got {value!r:.80}")
    elif hook == "before_compact":
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise PluginReturnError(f"before_compact must return messages to evict, got {type(value).__name__}")
        chosen = tuple(value)
        allowed = {m.id for m in cast(tuple[Message, ...], current)}
        if not all(isinstance(m, Message) and m.id in allowed for m in chosen):
            raise PluginReturnError("before_compact may only return a subset of the messages offered")
        return cast(T, chosen)
    else:
        raise PluginReturnError(f"{hook} must return None, got {value!r:.80}")
    return cast(T, value)


async def fold(
    plugins: Sequence[Plugin],
    hook: HookName,
    ctx: C,
    subject: T,
    *,
    rebind: Callable[[C, T], C],
    on_error: Callable[[Plugin, BaseException], None],
) -> Folded[T]:
    """Run `hook` of each plugin in order over `subject`.

    A returned value is checked by `check_result`; `rebind(ctx, subject)` gives the context for
    the next plugin. A plugin that raises an `Exception` (a bad return value included) or
    exceeds its `hook_timeout` is passed to `on_error` and skipped. Cancellation is never
    swallowed.
    """
    for plugin in plugins:
        if not plugin.implements(hook):
            continue
        timeout = plugin.hook_timeout
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                result: Any = await getattr(plugin, hook)(ctx)
            if result is None:
                continue
            if isinstance(result, (Skip, Abort)):
                return Folded(subject, result, plugin.name)
            subject = check_result(hook, result, subject)
        except Exception as exc:  # trio.TooSlowError (the hook_timeout) included
            on_error(plugin, exc)
            continue
        ctx = rebind(ctx, subject)
    return Folded(subject)


__all__ = [
    "Abort",
    "AfterCompact",
    "AfterResponse",
    "AfterTool",
    "BeforeCompact",
    "BeforeRequest",
    "BeforeTool",
    "Folded",
    "HookName",
    "LifecycleContext",
    "OnError",
    "OnStart",
    "OnStop",
    "Plugin",
    "PluginReturnError",
    "RequestContext",
    "ResponseContext",
    "Skip",
    "ToolContext",
    "check_result",
    "fold",
    "sort_plugins",
]
