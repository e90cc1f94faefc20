"""An agent's tools and its tool calls: the tools by name (its own, then its tool sets'), and
one tool call run through the `before_tool` and `after_tool` plugins, with its argument bounds
and timeout: any failure is a result the model can read. A part of `Agent` (whose `_run_tools`
runs the calls of one reply concurrently, bounded)."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .._frozen import past_bounds
from ..errors import PluginAborted, ToolArgumentsError
from ..events import TOOL_END, TOOL_START
from ..message import Message, ToolCall
from ..plugins import AfterTool, BeforeTool, Folded, HookName, Skip
from ..providers.base import ToolSchema
from ..state import State
from ..tools import Tool, ToolSet
from ..tracing import Span
from .options import AgentOptions

T = TypeVar("T")
C = TypeVar("C")


class ToolCalls:
    """The tool side of `Agent` (which holds these fields in its slots)."""

    __slots__ = ("_schemas", "_seen", "_tools")

    name: str
    options: AgentOptions
    own_tools: dict[str, Tool]
    toolsets: tuple[ToolSet, ...]
    _seen: tuple[int, ...]  # the toolsets' versions the views below were built from
    _tools: dict[str, Tool]
    _schemas: tuple[ToolSchema, ...]

    if TYPE_CHECKING:

        async def _hook(self, hook: HookName, ctx: C, subject: T, rebind: Callable[[C, T], C]) -> Folded[T]: ...

        def _tool_span(self, call: ToolCall) -> AbstractContextManager[Span]: ...

        def _emit(self, kind: str, **data: Any) -> None: ...

    @property
    def tools(self) -> dict[str, Tool]:
        """The tools by name: its own, then those its tool sets (MCP servers) list now (a name
        already taken keeps its first tool)."""
        if self.toolsets:
            versions = tuple(ts.version for ts in self.toolsets)
            if versions != self._seen:
                merged = dict(self.own_tools)
                for ts in self.toolsets:
                    for name, t in ts.tools.items():
                        merged.setdefault(name, t)
                self._tools, self._seen = merged, versions
                self._schemas = tuple(t.schema for t in merged.values())
        return self._tools

    @property
    def tool_schemas(self) -> tuple[ToolSchema, ...]:
        """What the model is told of the tools, in the order of `tools`."""
        self.tools  # noqa: B018  # rebuilds both views when a tool set changed
        return self._schemas

    async def _run_tool(
        self,
        state: State,
        call: ToolCall,
        results: list[Message | None],
        i: int,
        aborted: list[PluginAborted],
        scope: trio.CancelScope,
    ) -> None:
        t0 = trio.current_time()
        self._emit(TOOL_START, tool=call.name, call_id=call.id)
        try:
            with self._tool_span(call) as span:
                call, result = await self._tool_result(state, call)
                result = await self._after_tool(state, call, self.tools.get(call.name), result)
                span.record(result)
        except PluginAborted as exc:
            aborted.append(exc)
            scope.cancel()
            return
        results[i] = result
        self._emit(TOOL_END, tool=call.name, call_id=call.id, error=result.is_error, duration=trio.current_time() - t0)

    async def _tool_result(self, state: State, call: ToolCall) -> tuple[ToolCall, Message]:
        """Run one tool call (after `before_tool`, which may rewrite it): the call as run and
        its result; a failure of any kind is a result the model can read."""
        tool = self.tools.get(call.name)

        folded = await self._hook(
            "before_tool",
            BeforeTool(state, call, tool),
            call,
            lambda ctx, c: BeforeTool(state, c, self.tools.get(c.name)),
        )
        if isinstance(folded.stop, Skip):
            return call, Message.tool_result(
                call.id, f"tool call skipped by {folded.stopped_by}: {folded.stop.reason}", is_error=True
            )
        call = folded.value
        tool = self.tools.get(call.name)  # the call as the plugins left it
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return call, Message.tool_result(
                call.id, f"unknown tool {call.name!r}; available tools: {known}", is_error=True
            )
        options = self.options
        why = past_bounds(call.arguments, options.max_tool_argument_values, options.max_tool_argument_depth)
        if why is not None:
            bounds = (
                f"max_tool_argument_values={options.max_tool_argument_values:,}, "
                f"max_tool_argument_depth={options.max_tool_argument_depth}"
            )
            text = f"tool {call.name!r} not run: its arguments were refused: {why} (the limits: {bounds})"
            return call, Message.tool_result(call.id, text, is_error=True)
        timeout = tool.timeout if tool.timeout is not None else self.options.tool_timeout
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                text = await tool.run(call.arguments)
        except ToolArgumentsError as exc:
            return call, Message.tool_result(call.id, str(exc), is_error=True)
        except trio.TooSlowError:
            return call, Message.tool_result(call.id, f"tool {call.name!r} timed out after {timeout} s", is_error=True)
        except Exception as exc:
            return call, Message.tool_result(
                call.id, f"tool {call.name!r} failed: {type(exc).__name__}: {exc}", is_error=True
            )
        return call, Message.tool_result(call.id, text)

    async def _after_tool(self, state: State, call: ToolCall, tool: Tool | None, result: Message) -> Message:
        folded = await self._hook(
            "after_tool",
            AfterTool(state, call, tool, result),
            result,
            lambda ctx, r: AfterTool(state, call, tool, r),
        )
        return folded.value


__all__ = ["ToolCalls"]
