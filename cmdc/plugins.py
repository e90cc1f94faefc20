"""Plugins: objects with async hooks, folded in priority order like structlog processors.

A hook returns `None` (carry on), a new value of its subject (carry on with it), `Skip(reason)`
(skip the thing and stop the pipeline) or `Abort(reason)` (end the turn with an error). A hook
that raises, times out, or returns a value of the wrong kind is reported and skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

import attrs
import trio

from .message import Message

T = TypeVar("T")

HOOKS = (
    "on_start",
    "before_request",
    "after_response",
    "before_tool",
    "after_tool",
    "before_compact",
    "after_compact",
    "on_error",
    "on_stop",
)


@attrs.frozen
class Skip:
    """Skip this thing (a compaction, a tool call, a request) and stop the pipeline."""

    reason: str = ""


@attrs.frozen
class Abort:
    """End the turn with an error the caller sees."""

    reason: str = ""


class Plugin:
    """Base class: override the hooks you need. Lower `priority` runs first; `hook_timeout`
    (seconds, or None) bounds each hook call."""

    priority: int = 100
    hook_timeout: float | None = 30.0

    @property
    def name(self) -> str:
        return type(self).__name__

    async def on_start(self, ctx: Any) -> Any:
        return None

    async def before_request(self, ctx: Any) -> Any:
        return None

    async def after_response(self, ctx: Any) -> Any:
        return None

    async def before_tool(self, ctx: Any) -> Any:
        return None

    async def after_tool(self, ctx: Any) -> Any:
        return None

    async def before_compact(self, ctx: Any) -> Any:
        return None

    async def after_compact(self, ctx: Any) -> Any:
        return None

    async def on_error(self, ctx: Any) -> Any:
        return None

    async def on_stop(self, ctx: Any) -> Any:
        return None

    def implements(self, hook: str) -> bool:
        """True when this plugin overrides `hook` (others are not called at all)."""
        return getattr(type(self), hook, None) is not getattr(Plugin, hook)


def sort_plugins(plugins: Iterable[Plugin]) -> tuple[Plugin, ...]:
    """Plugins in run order: by priority, then registration order."""
    items = tuple(plugins)
    for p in items:
        if not isinstance(p, Plugin):
            raise TypeError(f"plugins must subclass cmdc.Plugin, got {type(p).__name__}")
    return tuple(sorted(items, key=lambda p: p.priority))


@attrs.frozen
class BeforeCompact:
    """Context of `before_compact`: return a subset of `evicted` to evict less, or `Skip`."""

    state: Any
    evicted: tuple[Message, ...]
    kept: tuple[Message, ...]
    reason: str
    instruction: str | None = None


@attrs.frozen
class AfterCompact:
    """Context of `after_compact`: return a new `State` (e.g. with skills re-injected)."""

    state: Any
    report: Any


@attrs.frozen
class Folded(Generic[T]):
    """The outcome of a fold: the final subject, and who stopped it, if anyone."""

    value: T
    stop: Skip | Abort | None = None
    stopped_by: str | None = None


class PluginReturnError(TypeError):
    """A hook returned a value that is not a valid subject for it."""


async def fold(
    plugins: Sequence[Plugin],
    hook: str,
    ctx: Any,
    subject: T,
    *,
    rebind: Callable[[Any, T], Any],
    accept: Callable[[object, T], T],
    on_error: Callable[[Plugin, BaseException], None],
) -> Folded[T]:
    """Run `hook` of each plugin in order over `subject`.

    `rebind(ctx, subject)` gives the context for the next plugin; `accept(returned, current)`
    checks a returned value (raising `PluginReturnError` when it is unusable). A plugin that
    raises an `Exception` or exceeds its `hook_timeout` is passed to `on_error` and skipped.
    Cancellation is never swallowed.
    """
    for plugin in plugins:
        if not plugin.implements(hook):
            continue
        timeout = plugin.hook_timeout
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                result = await getattr(plugin, hook)(ctx)
            if result is None:
                continue
            if isinstance(result, (Skip, Abort)):
                return Folded(subject, result, plugin.name)
            subject = accept(result, subject)
        except trio.TooSlowError as exc:
            on_error(plugin, exc)
            continue
        except Exception as exc:
            on_error(plugin, exc)
            continue
        ctx = rebind(ctx, subject)
    return Folded(subject)
