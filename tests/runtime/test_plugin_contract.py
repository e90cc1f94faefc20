"""The plugin contract as a type checker and a user see it: one typed context per hook, every
context frozen and exported, one checker for every hook's return value."""

from __future__ import annotations

import typing
from typing import Any

import attrs
import pytest

import cmdc
from cmdc import (
    Abort,
    AfterCompact,
    AfterResponse,
    AfterTool,
    BeforeCompact,
    BeforeRequest,
    BeforeTool,
    CompactionIncomplete,
    CompactionReport,
    Message,
    OnError,
    OnStart,
    OnStop,
    Plugin,
    Skip,
    State,
    ToolCall,
)
from cmdc.plugins import PluginReturnError, check_result

CONTEXTS = {
    "on_start": OnStart,
    "before_request": BeforeRequest,
    "after_response": AfterResponse,
    "before_tool": BeforeTool,
    "after_tool": AfterTool,
    "before_compact": BeforeCompact,
    "after_compact": AfterCompact,
    "on_error": OnError,
    "on_stop": OnStop,
}


def report() -> CompactionReport:
    return CompactionReport("auto", 10, 5, 4, 2, 2, "/x.jsonl", 1, 2, 1, 3, "s", 1, 0.0)


def mentions_any(tp: object) -> bool:
    return tp is Any or any(mentions_any(a) for a in typing.get_args(tp))


@pytest.mark.parametrize("hook", sorted(CONTEXTS))
def test_every_hook_is_typed_documented_and_exported(hook: str) -> None:
    hints = typing.get_type_hints(getattr(Plugin, hook))
    context = CONTEXTS[hook]
    assert hints["ctx"] is context
    assert not mentions_any(hints["return"])
    assert getattr(Plugin, hook).__doc__, f"{hook} has no docstring"
    assert context.__name__ in cmdc.__all__ and getattr(cmdc, context.__name__) is context
    assert attrs.has(context) and context.__doc__
    for field in attrs.fields(context):
        assert not mentions_any(typing.get_type_hints(context)[field.name]), (context, field.name)


def test_allowed_returns_per_hook() -> None:
    hints = {hook: set(typing.get_args(typing.get_type_hints(getattr(Plugin, hook))["return"])) for hook in CONTEXTS}
    assert hints["before_request"] == {State, Skip, Abort, type(None)}
    assert hints["after_compact"] == {State, type(None)}
    assert hints["before_tool"] == {ToolCall, Skip, Abort, type(None)}
    assert typing.get_type_hints(Plugin.on_stop)["return"] is type(None)


def test_contexts_are_frozen() -> None:
    state = State(agent_id="a")
    ctx = AfterCompact(state, report())
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ctx.state = state  # type: ignore[misc]


def test_old_context_names_still_import() -> None:
    from cmdc.agent import LifecycleContext, RequestContext, ResponseContext, ToolContext
    from cmdc.compaction import Compacted, Skipped
    from cmdc.compaction import CompactionReport as FromCompaction

    assert RequestContext is BeforeRequest and ResponseContext is AfterResponse
    assert isinstance(BeforeTool(State(agent_id="a"), ToolCall(id="c", name="t", arguments={}), None), ToolContext)
    assert isinstance(OnStop(State(agent_id="a")), LifecycleContext)
    assert FromCompaction is CompactionReport and Compacted is cmdc.Compacted and Skipped is cmdc.Skipped


def test_one_checker_accepts_each_hooks_subject() -> None:
    state = State(agent_id="a")
    other = State(agent_id="a", messages=(Message.user("hi"),))
    assert check_result("before_request", other, state) is other
    assert check_result("after_compact", other, state) is other
    reply = Message.assistant("ok")
    assert check_result("after_response", reply, Message.assistant("x")) is reply
    call = ToolCall(id="c1", name="t", arguments={})
    new_call = ToolCall(id="c1", name="u", arguments={"a": 1})
    assert check_result("before_tool", new_call, call) is new_call
    result = Message.tool_result("c1", "fine")
    assert check_result("after_tool", result, Message.tool_result("c1", "x")) is result
    a, b = Message.user("a"), Message.user("b")
    assert check_result("before_compact", [b], (a, b)) == (b,)


@pytest.mark.parametrize(
    ("hook", "value", "current"),
    [
        ("before_request", "not a state", State(agent_id="a")),
        ("before_request", State(agent_id="b"), State(agent_id="a")),
        ("after_compact", 42, State(agent_id="a")),
        ("on_start", State(agent_id="zz"), State(agent_id="a")),
        ("after_response", Message.user("x"), Message.assistant("x")),
        ("after_response", b"bytes", Message.assistant("x")),
        ("before_tool", ToolCall(id="c2", name="t", arguments={}), ToolCall(id="c1", name="t", arguments={})),
        ("before_tool", {"id": "c1"}, ToolCall(id="c1", name="t", arguments={})),
        ("after_tool", Message.tool_result("c2", "x"), Message.tool_result("c1", "x")),
        ("after_tool", "text", Message.tool_result("c1", "x")),
        ("before_compact", "ab", (Message.user("a"),)),
        ("before_compact", [Message.user("new")], (Message.user("a"),)),
        ("before_compact", [1, 2], (Message.user("a"),)),
        ("before_compact", 42, (Message.user("a"),)),
        ("on_error", State(agent_id="a"), State(agent_id="a")),
        ("on_stop", 0, State(agent_id="a")),
    ],
)
def test_one_checker_refuses_what_cannot_replace_the_subject(hook: Any, value: object, current: object) -> None:
    with pytest.raises(PluginReturnError, match=hook):
        check_result(hook, value, current)


def test_compaction_incomplete_carries_a_typed_state() -> None:
    state = State(agent_id="a")
    exc = CompactionIncomplete("still too big", state=state, report=report())
    assert exc.state is state and exc.report.tokens_after == 5
    assert typing.get_type_hints(CompactionIncomplete.__init__, vars(cmdc))["state"] is State
