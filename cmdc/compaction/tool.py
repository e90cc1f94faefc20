"""`compact_context`: an opt-in tool with which the model asks for a compaction at a natural
breakpoint (a finished subtask), giving its reason.

The agent runs its tools with a `CompactionDesk` in a context variable; the tool asks the desk
what a compaction would free now. Below the minimum gain (`compact_min_gain`) it answers so and
nothing happens; otherwise the compaction runs before the model's next request (the tool's
call and result are then part of the context, whole), the reason goes into the summarizer's
instruction, and a `compaction_requested` event carries it either way.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

from ..tools import Tool, tool

MAX_REASON_CHARS = 500

DESCRIPTION = (
    "Ask for the conversation so far to be compacted: older messages are replaced by a summary "
    "(they stay readable in the journal). Use it at a natural breakpoint, when a subtask is done "
    "and its details are no longer needed verbatim. Give the reason and what the summary must "
    "keep. It only runs when it frees enough room; the answer says whether it will."
)


class CompactionDesk:
    """What a tool call can ask of its agent: `estimate()` gives (the tokens a compaction would
    free now, the least it must free); `accept(reason)` schedules one; `report` sees each ask."""

    __slots__ = ("estimate", "reason", "report")

    def __init__(self, estimate: Callable[[], tuple[int, int]], report: Callable[[str, int, int, bool], None]) -> None:
        self.estimate = estimate
        self.report = report
        self.reason: str | None = None


current_desk: contextvars.ContextVar[CompactionDesk | None] = contextvars.ContextVar(
    "cmdc_compaction_desk", default=None
)


def compact_context_tool(*, name: str = "compact_context") -> Tool:
    """The tool; give it to an agent (`tools=[compact_context_tool()]`) to let its model ask
    for compactions."""

    async def compact_context(reason: str) -> str:
        """Ask for a compaction of the conversation so far.

        Args:
            reason: Why now, and what the summary must keep (at most 500 characters).
        """
        desk = current_desk.get()
        if desk is None:
            return "compact_context works only inside an agent's turn: nothing was compacted."
        reason = " ".join(reason.split())[:MAX_REASON_CHARS]
        gain, minimum = desk.estimate()
        if gain < minimum:
            desk.report(reason, gain, minimum, False)
            return (
                f"Not compacted: a compaction now would free only about {gain} tokens, less than the "
                f"minimum of {minimum}. Go on working; ask again when more has accumulated."
            )
        desk.reason = reason
        desk.report(reason, gain, minimum, True)
        return f"Compaction scheduled before your next request; it frees about {gain} tokens or more."

    return tool(compact_context, name=name, description=DESCRIPTION)


__all__ = ["DESCRIPTION", "CompactionDesk", "compact_context_tool", "current_desk"]
