"""The first, plainly O(n) cutoff, kept as an oracle for the indexed one in cmdc.

Rules (DESIGN.md, "Compaction, step by step", step 2):

- leading system messages are pinned, never evicted;
- the keep rule picks the suffix to keep (at least the last message);
- the cut then moves earlier so that no tool call is separated from its results: every
  assistant message in the evicted part has all of its results in the evicted part;
- an assistant message with a call that has no result yet (a pending call), a message pinned by
  metadata (`cmdc.pinned`) or by id, and the whole call group of any of these, are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from cmdc.compaction.config import Threshold
from cmdc.compaction.cutoff import Split
from cmdc.message import Message
from cmdc.tokens import estimate_message_tokens


def reference_split(
    messages: Sequence[Message],
    keep: Threshold,
    *,
    context_window: int | None = None,
    count: Callable[[Message], int] = estimate_message_tokens,
    pinned_ids: Collection[str] = (),
) -> Split:
    """Split `messages` following the rules above. Pure; O(n) in the number of messages."""
    n = len(messages)
    lead = 0
    while lead < n and messages[lead].role == "system":
        lead += 1
    cut = _keep_cut(messages, lead, keep, context_window, count)

    # Call groups over the body: each result's owner, each assistant's last result, and
    # which assistants still have a call without a result (pending).
    owner_of_call: dict[str, int] = {}
    owner: dict[int, int] = {}
    last_result: dict[int, int] = {}
    unanswered: dict[int, int] = {}
    answered: set[tuple[int, str]] = set()
    flagged: list[int] = []  # messages with metadata (pins live there)
    for i in range(lead, n):
        m = messages[i]
        calls = m.tool_calls
        if calls:
            for call in calls:
                owner_of_call[call.id] = i
            unanswered[i] = len(calls)
        elif m.tool_call_id is not None:
            a = owner_of_call.get(m.tool_call_id)
            if a is not None:
                owner[i] = a
                last_result[a] = i
                if (a, m.tool_call_id) not in answered:
                    answered.add((a, m.tool_call_id))
                    unanswered[a] -= 1
        if m.metadata:
            flagged.append(i)

    # Pins, closed over call groups: pending calls, `cmdc.pinned` metadata, ids asked for.
    pinned_groups = {a for a, left in unanswered.items() if left > 0}
    pinned_single: set[int] = set()
    candidates = set(flagged)
    if pinned_ids:
        wanted = set(pinned_ids)
        candidates.update(i for i in range(lead, n) if messages[i].id in wanted)
        for i in candidates:
            if not (messages[i].is_pinned or messages[i].id in wanted):
                continue
            _pin(i, messages, owner, pinned_groups, pinned_single)
    else:
        for i in candidates:
            if messages[i].is_pinned:
                _pin(i, messages, owner, pinned_groups, pinned_single)

    # Move the cut earlier until no unpinned call group straddles it: the furthest result of
    # any group that starts before the cut must lie before it.
    reach = [-1] * (cut - lead + 1)
    furthest = -1
    for i in range(lead, cut):
        last = last_result.get(i)
        if last is not None and last > furthest and i not in pinned_groups:
            furthest = last
        reach[i - lead + 1] = furthest
    while cut > lead and reach[cut - lead] >= cut:
        cut -= 1

    if not pinned_groups and not pinned_single:
        return Split(pinned=tuple(messages[:lead]), evicted=tuple(messages[lead:cut]), kept=tuple(messages[cut:]))
    held = set(pinned_single)
    for a in pinned_groups:
        held.add(a)
    held.update(i for i, a in owner.items() if a in pinned_groups)
    evicted = tuple(messages[i] for i in range(lead, cut) if i not in held)
    kept = tuple(messages[i] for i in range(lead, n) if i >= cut or i in held)
    return Split(pinned=tuple(messages[:lead]), evicted=evicted, kept=kept)


def _pin(i: int, messages: Sequence[Message], owner: dict[int, int], groups: set[int], single: set[int]) -> None:
    if messages[i].tool_calls:
        groups.add(i)
    elif i in owner:
        groups.add(owner[i])
    else:
        single.add(i)


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
