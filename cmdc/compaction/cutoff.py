"""Where to cut: a pure function from messages and a keep rule to pinned / evicted / kept.

Rules (docs/design.md, "Compaction, step by step", step 2):

- leading system messages are pinned, never evicted;
- the keep rule picks the suffix to keep (at least the last message);
- the cut then moves earlier so that no tool call is separated from its results: every
  assistant message in the evicted part has all of its results in the evicted part;
- an assistant message with a call that has no result yet (a pending call), a message pinned by
  metadata (`cmdc.pinned`) or by id, and the whole call group of any of these, are kept.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Sequence

import attrs

from .._groups import CallIndex
from ..message import Message
from ..tokens import estimate_message_tokens
from .config import Threshold


@attrs.frozen
class Split:
    """The three parts of a conversation. `kept` is in original order and may include pinned
    messages from before the cut; `pinned` are the leading system messages."""

    pinned: tuple[Message, ...]
    evicted: tuple[Message, ...]
    kept: tuple[Message, ...]
    held: tuple[Message, ...] = ()  # kept from before the cut: pins and pending call groups

    @property
    def evicts_anything(self) -> bool:
        """True when something other than an earlier summary would be evicted."""
        return any(not m.is_summary for m in self.evicted)


def split_messages(
    messages: Sequence[Message],
    keep: Threshold,
    *,
    context_window: int | None = None,
    count: Callable[[Message], int] = estimate_message_tokens,
    pinned_ids: Collection[str] = (),
    unpinned_ids: Collection[str] = (),
    index: CallIndex | None = None,
) -> Split:
    """Split `messages` following the rules above. Pure.

    With the conversation's `CallIndex` (a `State` keeps one), the work is proportional to the
    kept part and the pins, not to the history: the evicted part is only sliced. Without it,
    or with `pinned_ids`, one O(n) scan finds them. `unpinned_ids` take back the pins of
    those messages (a pin budget); pending calls are always kept."""
    n = len(messages)
    lead = 0
    while lead < n and messages[lead].role == "system":
        lead += 1
    cut = _keep_cut(messages, lead, keep, context_window, count)
    if index is None:
        index = CallIndex.scan(messages)
    groups = _Groups(messages, lead)

    # Held back from eviction: open call groups, and the whole group of every pinned message.
    held: set[int] = set()
    for g in index.open:
        held.add(g.index)
        held.update(g.results)
    pins = [i for i in index.pinned if i >= lead]
    if pinned_ids:
        wanted = set(pinned_ids)
        for i in range(lead, n):  # ends as soon as every wanted id is found (a task is early)
            if messages[i].id in wanted:
                pins.append(i)
                wanted.discard(messages[i].id)
                if not wanted:
                    break
    if unpinned_ids:
        dropped = set(unpinned_ids)
        pins = [i for i in pins if messages[i].id not in dropped]
    for i in pins:
        if i not in held:
            held.update(groups.group_of(i))

    # Move the cut earlier until no call group straddles it: walking down from the end, a
    # result whose call lies before the cut pulls the cut back to that call.
    j = n - 1
    while j >= cut:
        if messages[j].tool_call_id is not None and j not in held:
            owner = groups.owner(j)
            if owner is not None and owner < cut:
                cut = owner
        j -= 1

    pinned = tuple(messages[:lead])
    if not held:
        return Split(pinned=pinned, evicted=tuple(messages[lead:cut]), kept=tuple(messages[cut:]))
    evicted: list[Message] = []
    kept: list[Message] = []
    start = lead
    for i in sorted(h for h in held if lead <= h < cut):
        evicted += messages[start:i]
        kept.append(messages[i])
        start = i + 1
    evicted += messages[start:cut]
    held_before_cut = tuple(kept)
    kept += messages[cut:]
    return Split(pinned=pinned, evicted=tuple(evicted), kept=tuple(kept), held=held_before_cut)


class _Groups:
    """Finds a result's call and a call's results by looking nearby; a full map of call ids is
    built only if a lookup has to go far (an orphan result, a call answered much later)."""

    _NEAR = 64

    def __init__(self, messages: Sequence[Message], lead: int) -> None:
        self.messages = messages
        self.lead = lead
        self._by_call: dict[str, list[int]] | None = None

    def owner(self, j: int) -> int | None:
        """The nearest assistant message before `j` that made the call `j` answers."""
        call_id = self.messages[j].tool_call_id
        stop = max(self.lead, j - self._NEAR)
        for i in range(j - 1, stop - 1, -1):
            if any(c.id == call_id for c in self.messages[i].tool_calls):
                return i
        if stop == self.lead:
            return None
        owners = self._map().get(call_id or "", [])
        k = bisect.bisect_left(owners, j) - 1
        return owners[k] if k >= 0 else None

    def group_of(self, i: int) -> list[int]:
        """Message `i` with its call group: the assistant message and all of its results."""
        m = self.messages[i]
        owner = i if m.tool_calls else (self.owner(i) if m.tool_call_id is not None else None)
        if owner is None:
            return [i]
        waiting = {c.id for c in self.messages[owner].tool_calls}
        members = [owner]
        for k in range(owner + 1, len(self.messages)):
            if not waiting:
                break
            r = self.messages[k]
            if r.tool_call_id in waiting:
                waiting.discard(r.tool_call_id)
                members.append(k)
            elif r.tool_calls and waiting & {c.id for c in r.tool_calls}:
                break  # a later call reuses the id: the rest belong to it
        if i not in members:
            members.append(i)
        return members

    def _map(self) -> dict[str, list[int]]:
        if self._by_call is None:
            self._by_call = {}
            for i in range(self.lead, len(self.messages)):
                for c in self.messages[i].tool_calls:
                    self._by_call.setdefault(c.id, []).append(i)
        return self._by_call


def _keep_cut(
    messages: Sequence[Message],
    lead: int,
    keep: Threshold,
    context_window: int | None,
    count: Callable[[Message], int],
) -> int:
    n = len(messages)
    if keep.mode == "messages":
        return max(lead, n - int(keep.value))
    budget = keep.tokens(context_window)
    cut, total = n, 0
    while cut > lead:
        cost = count(messages[cut - 1])
        if cut < n and total + cost > budget:
            break
        total += cost
        cut -= 1
    return cut
