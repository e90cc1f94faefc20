from __future__ import annotations

from collections.abc import Sequence

from cmdc import Message, ToolCall


def asst(*call_ids: str, text: str = "") -> Message:
    return Message.assistant(text, tool_calls=tuple(ToolCall(id=c, name="t", arguments={"c": c}) for c in call_ids))


def res(call_id: str, text: str = "ok") -> Message:
    return Message.tool_result(call_id, text)


def check_pairs(kept: Sequence[Message], original: Sequence[Message]) -> None:
    """No kept result lacks its call; no kept call lacks a result that exists in `original`."""
    kept_calls = {c.id for m in kept for c in m.tool_calls}
    kept_results = {m.tool_call_id for m in kept if m.role == "tool"}
    all_results = {m.tool_call_id for m in original if m.role == "tool"}
    assert kept_results <= kept_calls, "a kept tool result lost its call"
    assert (kept_calls & all_results) <= kept_results, "a kept call lost its result"
