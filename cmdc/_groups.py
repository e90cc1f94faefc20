"""Call groups without scanning history: which assistant calls still wait for results, and
which messages are pinned. `State` keeps a `CallIndex` up to date as messages are appended, so
the cutoff never has to walk the whole conversation to find them."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .message import Message


@attrs.frozen
class OpenGroup:
    """An assistant message (at `index`) with calls still `waiting` for results; `results` are
    the indices of the results that have arrived."""

    index: int
    waiting: frozenset[str]
    results: tuple[int, ...] = ()


@attrs.frozen
class CallIndex:
    """Open call groups, pinned messages and summaries of a conversation, by index."""

    open: tuple[OpenGroup, ...] = ()
    pinned: tuple[int, ...] = ()
    summaries: tuple[int, ...] = ()

    def add(self, index: int, message: Message) -> CallIndex:
        """The index after `message` is appended at `index` (O(open groups); usually no copy)."""
        result = self
        if message.metadata:
            if message.is_pinned:
                result = attrs.evolve(result, pinned=(*result.pinned, index))
            if message.is_summary:
                result = attrs.evolve(result, summaries=(*result.summaries, index))
        if message.tool_calls:
            group = OpenGroup(index, frozenset(c.id for c in message.tool_calls))
            return attrs.evolve(result, open=(*result.open, group))
        call_id = message.tool_call_id
        if call_id is None or not result.open:
            return result
        groups = result.open
        for k in range(len(groups) - 1, -1, -1):
            g = groups[k]
            if call_id in g.waiting:
                waiting = g.waiting - {call_id}
                rest = groups[:k] + groups[k + 1 :]
                if waiting:
                    rest = (*groups[:k], OpenGroup(g.index, waiting, (*g.results, index)), *groups[k + 1 :])
                return attrs.evolve(result, open=rest)
        return result

    @classmethod
    def scan(cls, messages: Sequence[Message]) -> CallIndex:
        """Build the index of `messages` from scratch (O(n)), as `add` would, one by one."""
        open_groups: dict[int, tuple[set[str], list[int]]] = {}
        pinned: list[int] = []
        summaries: list[int] = []
        for i, m in enumerate(messages):
            if m.metadata:
                if m.is_pinned:
                    pinned.append(i)
                if m.is_summary:
                    summaries.append(i)
            if m.tool_calls:
                open_groups[i] = ({c.id for c in m.tool_calls}, [])
            elif m.tool_call_id is not None and open_groups:
                for index in reversed(open_groups):  # the latest group waiting for this call
                    waiting, results = open_groups[index]
                    if m.tool_call_id in waiting:
                        waiting.discard(m.tool_call_id)
                        results.append(i)
                        if not waiting:
                            del open_groups[index]
                        break
        if not (open_groups or pinned or summaries):
            return EMPTY_INDEX
        groups = tuple(OpenGroup(i, frozenset(w), tuple(r)) for i, (w, r) in open_groups.items())
        return cls(groups, tuple(pinned), tuple(summaries))


EMPTY_INDEX = CallIndex()
"""The index of a conversation with no calls, pins or summaries (shared)."""
