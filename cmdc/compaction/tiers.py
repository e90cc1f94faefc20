"""The cheap tiers before a summary: caps at arrival, masking of old tool results, and the
thrash guard's diagnosis. Settings: `TierConfig` (in `config`).

**Caps.** A tool result over its limit (`TierConfig.limit_for`) is journaled whole, durably,
before the context sees it; the context gets a head/tail preview naming its size and its
journal record, which `recall(record=N, line_start=..., ...)` reads back in parts. The result
message stays (a new one, same `tool_call_id`): a tool-call pair is never split.

**Masking.** Past the soft threshold, the results of tool uses older than the newest
`mask_keep` are journaled and replaced by a one-line placeholder naming the tool, its
arguments' gist and the journal record, all in one batch, and only when the batch frees at
least `mask_at_least` tokens (a cache break must be worth it). A placeholder is a pure function
of the original message, its call and its record number: the same input gives the same bytes,
so the requests after it share their prefix again.

**The journal.** Capped and masked results are appended as ordinary committed batches
(`append(commit=True)`: durable and visible when it returns), numbered with the state's current
compaction count (`state.compactions`): they belong to no compaction, and a reader sees each
message once, at its first committed record, like any other. A later compaction that evicts
the preview or the placeholder journals that message too (a new id: a record of its own), and
its summary names those records; the original stays at the record the placeholder names.
Nothing is ever uncommitted here, so no commit is owed and no summary needs to carry the
batch's attempt (the exactly-once rules hold as for a committed `append`). An original that an
abandoned compaction attempt (uncommitted: its state was thrown away) also holds gets a record
of its own, and that attempt is superseded, never committed (see docs/journal.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import orjson

from .._clip import clip, utf8_len
from .._frozen import thaw
from ..message import Message, ToolCall
from ..state import State
from ..store.protocol import Store
from ..store.records import AppendResult, JournalRef
from .config import CompactConfig
from .cutoff import split_messages

CAPPED_KEY = "cmdc.capped"
"""Metadata of a capped result's preview: {"record", "from", "tool", "tokens", "bytes"}."""
MASKED_KEY = "cmdc.masked"
"""Metadata of a masked result's placeholder: {"record", "from", "tool"}."""

Count = Callable[[Message], int]
_WIDE_RECORD = 10**12  # a record number wider than any real one: placeholders' costs are upper bounds


def tool_names(state: State) -> dict[str, ToolCall]:
    """Each tool call of the context, by its id."""
    return {c.id: c for m in state.messages if m.tool_calls for c in m.tool_calls}


def gist(call: ToolCall | None) -> str:
    """The arguments of `call` in one short line, keys sorted: a pure function of them."""
    if call is None:
        return ""
    parts = []
    for key in sorted(call.arguments):
        value = thaw(call.arguments[key])
        text = value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        parts.append(f"{key}={clip(' '.join(text.split()), 60, keep='head', marker='…')}")
    return clip(", ".join(parts), 160, keep="head", marker="…")


# -- caps at arrival ----------------------------------------------------------------------------


def preview_text(message: Message, tool: str, record: int, limit: int, preview: int, tokens: int) -> str:
    """What the context gets for a capped result: its size, its record, its head and tail."""
    text = message.text
    size, lines = utf8_len(text), text.count("\n") + 1
    intro = (
        f"[{tool} result capped at arrival: {size} bytes, {lines} lines, ~{tokens} tokens, over the "
        f"{limit}-token limit. The whole result is journal record {record}; read any part of it with "
        f"recall(record={record}, line_start=..., line_end=...) or byte_start/byte_end.]\n"
    )
    marker = "\n[… {omitted} bytes not shown: recall(record=" + str(record) + ", …) …]\n"
    return intro + clip(text, preview * 4, marker=marker)


def to_cap(config: CompactConfig, calls: dict[str, ToolCall], results: Sequence[Message], count: Count) -> list[int]:
    """The indices of `results` over their tool's limit (text results only)."""
    trigger = config.token_trigger
    out = []
    for i, m in enumerate(results):
        if m.role != "tool" or not isinstance(m.content, str) or CAPPED_KEY in m.metadata:
            continue
        call = calls.get(m.tool_call_id or "")
        limit = config.tiers.limit_for(call.name if call else "", trigger)
        if limit is not None and count(m) > limit:
            out.append(i)
    return out


async def cap_results(
    store: Store,
    state: State,
    config: CompactConfig,
    calls: dict[str, ToolCall],
    results: Sequence[Message],
    count: Count,
) -> tuple[list[Message], State, list[dict[str, Any]]]:
    """`results` with each one over its limit replaced by a preview, after the originals are
    journaled (durable when this returns); the state with the journal's identity; one dict
    per capped result (for events). Raises the store's error, having changed nothing."""
    chosen = to_cap(config, calls, results, count)
    if not chosen:
        return list(results), state, []
    originals = [results[i] for i in chosen]
    written = await store.append(
        state.agent_id, originals, compaction=state.compactions, expect=JournalRef(state.journal_id, state.journal_seq)
    )
    seqs = _seqs(written, len(originals))
    out = list(results)
    capped: list[dict[str, Any]] = []
    for i, seq in zip(chosen, seqs, strict=True):
        m = results[i]
        call = calls.get(m.tool_call_id or "")
        name = call.name if call else "tool"
        limit = config.tiers.limit_for(call.name if call else "", config.token_trigger) or 1
        tokens = count(m)
        text = preview_text(m, name, seq, limit, config.tiers.preview_for(limit), tokens)
        meta = {"record": seq, "from": m.id, "tool": name, "tokens": tokens, "bytes": utf8_len(m.text)}
        out[i] = Message.tool_result(
            m.tool_call_id or "", text, is_error=m.is_error, metadata={**m.metadata, CAPPED_KEY: meta}
        )
        capped.append({"tool": name, "call_id": m.tool_call_id, "tokens": tokens, "limit": limit, "record": seq})
    return out, state.evolve(**journal_fields(state, written)), capped


def journal_fields(state: State, written: AppendResult) -> dict[str, Any]:
    return {"journal_id": written.journal or state.journal_id, "journal_seq": max(state.journal_seq, written.last_seq)}


def _seqs(written: AppendResult, n: int) -> list[int]:
    if len(written.seqs) == n:
        return list(written.seqs)
    return list(range(written.first_seq, written.first_seq + n))


# -- masking ------------------------------------------------------------------------------------


def placeholder(message: Message, call: ToolCall | None, record: int) -> Message:
    """The one-line stand-in for a masked result: byte-stable for the same message, call and record."""
    name = call.name if call is not None else "tool"
    capped = message.metadata.get(CAPPED_KEY)
    size = capped["bytes"] if capped is not None else utf8_len(message.text)
    text = f"[masked {name}({gist(call)}): {size} bytes; recall(record={record})]"  # the record, by its number
    meta = {"record": record, "from": message.metadata.get(CAPPED_KEY, {}).get("from", message.id), "tool": name}
    return Message.tool_result(message.tool_call_id or "", text, is_error=message.is_error, metadata={MASKED_KEY: meta})


@attrs.frozen
class MaskPlan:
    """What a masking would do: the indices to mask and a lower bound of the tokens it frees."""

    indices: tuple[int, ...]
    freed: int


def plan_mask(state: State, config: CompactConfig, count: Count) -> MaskPlan:
    """Every tool result older than the newest `mask_keep` tool uses, not excluded, not masked,
    and seen by the model already (the results after its last reply never are masked)."""
    tiers = config.tiers
    messages = state.messages
    seen = len(messages)
    while seen > 0 and messages[seen - 1].role != "assistant":
        seen -= 1
    results = [i for i, m in enumerate(messages) if m.role == "tool"]
    older = [i for i in results[: max(0, len(results) - tiers.mask_keep)] if i < seen]
    calls = tool_names(state) if older else {}
    chosen: list[int] = []
    freed = 0
    for i in older:
        m = state.messages[i]
        if MASKED_KEY in m.metadata:
            continue
        call = calls.get(m.tool_call_id or "")
        if call is not None and call.name in tiers.mask_exclude:
            continue
        gain = count(m) - count(placeholder(m, call, _WIDE_RECORD))
        if gain > 0:
            chosen.append(i)
            freed += gain
    return MaskPlan(tuple(chosen), freed)


async def apply_mask(store: Store, state: State, plan: MaskPlan) -> tuple[State, tuple[int, ...]]:
    """The state with the planned results masked, after the ones not journaled yet (a capped
    preview's original is) are appended, durably; and the records the placeholders name."""
    calls = tool_names(state)
    fresh = [i for i in plan.indices if CAPPED_KEY not in state.messages[i].metadata]
    records: dict[int, int] = {}
    fields: dict[str, Any] = {}
    if fresh:
        batch = [state.messages[i] for i in fresh]
        written = await store.append(
            state.agent_id, batch, compaction=state.compactions, expect=JournalRef(state.journal_id, state.journal_seq)
        )
        records.update(zip(fresh, _seqs(written, len(batch)), strict=True))
        fields = journal_fields(state, written)
    messages = list(state.messages)
    for i in plan.indices:
        m = messages[i]
        record = records.get(i, m.metadata.get(CAPPED_KEY, {}).get("record", 0))
        messages[i] = placeholder(m, calls.get(m.tool_call_id or ""), record)
    new = state.evolve(messages=tuple(messages), usage_floor=len(messages), **fields)
    return new, tuple(records.get(i, messages[i].metadata[MASKED_KEY]["record"]) for i in plan.indices)


# -- the thrash guard's diagnosis ---------------------------------------------------------------


def diagnose(
    state: State, config: CompactConfig, count: Count, summary_budget: int, task_id: str | None
) -> tuple[str, str, dict[str, int]]:
    """What a compaction cannot remove, and which part is too big: (culprit, advice, figures)."""
    split = split_messages(
        state.messages,
        config.keep,
        context_window=config.context_window,
        count=count,
        pinned_ids=frozenset(() if task_id is None else (task_id,)),
        index=state.call_index,
    )
    held = {m.id for m in split.held}
    pins = sum(count(m) for m in split.pinned) + sum(count(m) for m in split.held)
    kept = sum(count(m) for m in split.kept if m.id not in held)
    system = {m.id for m in split.pinned}  # the system prompt counts as pins; any other message may be "one huge"
    largest = max((m for m in state.messages if m.id not in system), key=count, default=None)
    big = 0 if largest is None else count(largest)
    trigger = config.token_trigger or 0
    figures = {
        "trigger": trigger,
        "tokens": sum(count(m) for m in state.messages),
        "pins": pins,
        "kept": kept,
        "largest_message": big,
        "summary_budget": summary_budget,
    }
    if trigger and big * 2 >= trigger:
        assert largest is not None
        what = largest.role + (" (a tool result)" if largest.role == "tool" else "")
        return (
            "message",
            f"one message ({what}, {big} tokens) takes half the trigger or more: lower tool_result_limit, "
            "split the input, or raise compact_trigger",
            figures,
        )
    shares = {"pins": pins, "kept": kept, "summary": summary_budget}
    culprit = max(shares, key=lambda k: shares[k])
    advice = {
        "pins": f"the system prompt and pinned messages ({pins} tokens) are too big for the trigger: shorten them, "
        "lower pin_budget, or raise compact_trigger",
        "kept": f"the messages compact_keep keeps ({kept} tokens) are too big for the trigger: lower compact_keep "
        "or raise compact_trigger",
        "summary": f"the summary budget ({summary_budget} tokens) is too large a share of the trigger: lower "
        "summary_budget or raise compact_trigger",
    }[culprit]
    return culprit, advice, figures


def evictable_gain(state: State, config: CompactConfig, count: Count, summary_budget: int) -> int:
    """An estimate of what a compaction would free now: what it evicts, less the summary's
    likely size (a third of that, at most the summary budget)."""
    split = split_messages(
        state.messages, config.keep, context_window=config.context_window, count=count, index=state.call_index
    )
    evicted = sum(count(m) for m in split.evicted)
    return max(0, evicted - min(summary_budget, evicted // 3))


__all__ = [
    "CAPPED_KEY",
    "MASKED_KEY",
    "MaskPlan",
    "apply_mask",
    "cap_results",
    "diagnose",
    "evictable_gain",
    "gist",
    "placeholder",
    "plan_mask",
    "preview_text",
]
