"""An oracle for the cutoff, written from the rules in docs/design.md ("Compaction, step by step",
step 2), not from cmdc's code: each rule is stated as a check over the whole conversation and
the cut is found by trying every position. Slow (cubic at worst) and obviously right, so a
test can hold cmdc's indexed cutoff to it.

1. Leading system messages are pinned, never evicted.
2. The keep rule picks the suffix to keep, at least the last message: the last `n` messages;
   or the longest suffix whose token cost fits the budget (`tokens`, or a `fraction` of the
   window).
3. Held back whatever the cut, each with its whole call group (the assistant message making the
   calls and every result answering them): an assistant message with a call that has no result
   (a pending call), and a message pinned by metadata (`cmdc.pinned`) or by id, unless its id
   is unpinned.
4. The cut then moves earlier (keeping more), to the latest position where no call is separated
   from its results: every call group not held back lies wholly before it or wholly after it.
   The evicted part is everything between the pinned head and the cut that is not held back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

from cmdc import Message, estimate_message_tokens


def oracle_split(
    messages: Sequence[Message],
    keep: tuple[str, int | float],
    *,
    context_window: int | None = None,
    count: Callable[[Message], int] = estimate_message_tokens,
    pinned_ids: Collection[str] = (),
    unpinned_ids: Collection[str] = (),
) -> tuple[tuple[Message, ...], tuple[Message, ...], tuple[Message, ...]]:
    """(pinned, evicted, kept) by the rules above; `keep` is `(mode, value)` as in `compact_keep`."""
    n = len(messages)
    head = _leading_systems(messages)
    wanted = _keep_from(messages, head, keep, context_window, count)
    groups = _call_groups(messages, head)
    held = _held(messages, head, groups, set(pinned_ids), set(unpinned_ids))
    free = [g for g in groups if not (g & held)]
    cut = max(c for c in range(head, wanted + 1) if all(max(g) < c or min(g) >= c for g in free))
    evicted = tuple(messages[i] for i in range(head, cut) if i not in held)
    kept = tuple(messages[i] for i in range(head, n) if i >= cut or i in held)
    return tuple(messages[:head]), evicted, kept


def _leading_systems(messages: Sequence[Message]) -> int:
    return next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))


def _keep_from(
    messages: Sequence[Message],
    head: int,
    keep: tuple[str, int | float],
    window: int | None,
    count: Callable[[Message], int],
) -> int:
    """Where the kept suffix starts before any call group is considered."""
    n = len(messages)
    if n == head:
        return n
    mode, value = keep
    if mode == "messages":
        return max(head, n - int(value))
    budget = int(value) if mode == "tokens" else max(1, math.floor(value * (window or 0)))
    fitting = [c for c in range(head, n) if sum(count(m) for m in messages[c:]) <= budget]
    return min(fitting, default=n - 1)  # the last message is kept even when it alone is over


def _call_groups(messages: Sequence[Message], head: int) -> list[set[int]]:
    """Each assistant message with calls (after the head) with the results that answer them: a
    result answers the nearest earlier message that made its call."""
    groups: dict[int, set[int]] = {}
    for j in range(head, len(messages)):
        call_id = messages[j].tool_call_id
        if call_id is None:
            continue
        owner = next(
            (i for i in range(j - 1, head - 1, -1) if any(c.id == call_id for c in messages[i].tool_calls)), None
        )
        if owner is not None:
            groups.setdefault(owner, {owner}).add(j)
    for i in range(head, len(messages)):
        if messages[i].tool_calls:
            groups.setdefault(i, {i})
    return list(groups.values())


def _held(
    messages: Sequence[Message], head: int, groups: list[set[int]], pinned_ids: set[str], unpinned_ids: set[str]
) -> set[int]:
    def group_of(i: int) -> set[int]:
        return next((g for g in groups if i in g), {i})

    held: set[int] = set()
    for g in groups:
        owner = min(g)
        answered = {messages[j].tool_call_id for j in g if j != owner}
        if any(c.id not in answered for c in messages[owner].tool_calls):
            held |= g  # a pending call
    for i in range(head, len(messages)):
        m = messages[i]
        if (m.is_pinned or m.id in pinned_ids) and m.id not in unpinned_ids:
            held |= group_of(i)
    return held
