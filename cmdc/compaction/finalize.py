"""Finalizers: from the summarizer's answer to the messages that replace the evicted ones.

The default finalizer strips an analysis scratchpad, replaces the summary's user-messages
section with the real user messages (newest first within a budget, carried forward across
compactions) and builds the summary message. A custom `finalize` replaces it; `finalizer(...)`
composes steps, `default_summary` being the default as a step and `preserve_skills(...)` one
that re-injects skills the agent had loaded.
"""

from __future__ import annotations

import inspect
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import attrs

from .._clip import clip_tokens
from ..message import Message
from ..tokens import estimate_message_tokens, estimate_text_tokens
from .ledger import LEDGER_KEY, SECTIONS, Ledger, render
from .summary import strip_scratchpad, summary_message, without_media

USER_MESSAGES_KEY = "cmdc.user_messages"
USER_MESSAGES_HEADING = "All user messages"


@attrs.frozen
class FinalizeContext:
    """What a finalizer knows: the summarizer's answer, the evicted messages (the previous
    summary among them), the state before compaction, where the evicted messages went, and the
    budget and filter for preserved user messages."""

    summary: str
    evicted: tuple[Message, ...]
    state: Any
    compaction: int
    offload_path: str
    first_seq: int
    last_seq: int
    user_message_budget: int
    user_message_filter: Callable[[Message], bool] | None = None
    kept: tuple[Message, ...] = ()  # what stays verbatim beside the summary (pins, the tail)
    task_id: str | None = None  # the pinned task, when it is among `kept`
    ledger: Ledger | None = None  # the session ledger carried forward, fitted to its budget
    task_before: bool = True  # whether the pinned task sits before the summary (else after it)


Finalize = Callable[[FinalizeContext], "Sequence[Message] | Awaitable[Sequence[Message]]"]
Step = Callable[[FinalizeContext, list[Message]], "list[Message] | Awaitable[list[Message]]"]


def _clip_middle(text: str, budget_tokens: int) -> str:
    """`text` cut to its head and tail around a marker, within `budget_tokens`."""
    return clip_tokens(text, budget_tokens)


def preserved_user_messages(ctx: FinalizeContext) -> list[str]:
    """The user messages to keep verbatim: the evicted ones and those the previous summary
    carried, newest first within the budget; the first that does not fit is cut to its head
    and tail; the result is in chronological order. Only as far back as the budget reaches is
    looked at."""
    chosen: list[str] = []
    left = ctx.user_message_budget

    def take(text: str, cost: int) -> bool:
        nonlocal left
        if cost <= left:
            chosen.append(text)
            left -= cost
            return True
        if left >= 40:
            chosen.append(_clip_middle(text, left - 4))
        return False

    def candidates() -> Iterator[tuple[str, int]]:
        for m in reversed(ctx.evicted):
            if m.is_summary:
                carried = [t for t in m.metadata.get(USER_MESSAGES_KEY, ()) if isinstance(t, str)]
                for text in reversed(carried):
                    yield text, estimate_text_tokens(text) + 4
            elif m.role == "user" and (ctx.user_message_filter is None or ctx.user_message_filter(m)):
                plain = without_media(m, f"journal {ctx.offload_path}, message {m.id}")
                yield plain.text, estimate_message_tokens(plain)

    for text, cost in candidates():
        if not take(text, cost):
            break
    chosen.reverse()
    return chosen


_HEADING = re.compile(r"^(#{1,6})\s*(?:\d+[.)]\s*)?(.+?)\s*:?\s*$")


def _has_section(text: str, heading: str) -> bool:
    return any(
        (m := _HEADING.match(line)) is not None and m.group(2).strip().lower() == heading.lower()
        for line in text.splitlines()
        if line.startswith("#")
    )


def replace_section(text: str, heading: str, body: str) -> str:
    """`text` with the Markdown section called `heading` replaced by `body` (appended as a
    `## heading` section when the text has none)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _HEADING.match(line)
        if m and m.group(2).strip().lower() == heading.lower():
            level = len(m.group(1))
            end = i + 1
            while end < len(lines):
                n = _HEADING.match(lines[end])
                if n and len(n.group(1)) <= level:
                    break
                end += 1
            return "\n".join([*lines[: i + 1], body, "", *lines[end:]]).rstrip() + "\n"
    return f"{text.rstrip()}\n\n## {heading}\n{body}\n"


def _without_section(text: str, heading: str) -> str:
    """`text` without its Markdown section called `heading` (the same text when it has none)."""
    if not _has_section(text, heading):
        return text
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _HEADING.match(line)
        if m and m.group(2).strip().lower() == heading.lower():
            level, end = len(m.group(1)), i + 1
            while end < len(lines) and not ((n := _HEADING.match(lines[end])) and len(n.group(1)) <= level):
                end += 1
            return "\n".join([*lines[:i], *lines[end:]])
    return text


TASK_HEADING = "Primary request and intent"
TASK_REFERENCE = "The task is the session's first user message, kept verbatim right {where} this summary."


def task_reference(before: bool) -> str:
    """What the request section says when the task is kept verbatim: where it is."""
    return TASK_REFERENCE.format(where="before" if before else "after")


def with_ledger(text: str, ledger: Ledger | None) -> str:
    """`text` (the summarizer's answer) with the ledger's sections after its first section (the
    request), before the others: a section of the answer under a ledger heading is replaced by
    the ledger's (the deterministic part wins)."""
    if ledger is None or not (ledger.entries or ledger.demoted):
        return text
    for heading in SECTIONS.values():
        text = _without_section(text, heading)
    text = text.strip()
    # after the answer's first section (the request: what the summary is about), before the rest
    first = text.find("\n## ", 1) if text.startswith("## ") else -1
    if first < 0:
        return f"{render(ledger)}\n\n{text}"
    return f"{text[:first].rstrip()}\n\n{render(ledger)}\n\n{text[first:].lstrip()}"


def default_finalize(ctx: FinalizeContext) -> list[Message]:
    """The default post-processing: one summary message. The ledger's sections come after the
    request section (carried in the metadata too, for the next compaction). Nothing kept verbatim is restated:
    the user-messages section holds the preserved user messages (none of them kept), and when
    the task is kept the request section refers to it, where it sits."""
    users = preserved_user_messages(ctx)
    body = "\n".join(f"- {' '.join(t.split())}" for t in users) if users else "(none)"
    # A line stands for the user messages while the answer's sections are looked for (not tens
    # of kB of them, once per heading); it ends as they do (a space when the last is blank), so
    # what is stripped around it is what would be stripped around them.
    tail = body[len(body.rstrip()) :]
    mark = f"\x00{uuid.uuid4().hex}\x00"
    text = replace_section(strip_scratchpad(ctx.summary), USER_MESSAGES_HEADING, mark + tail)
    if ctx.task_id is not None and _has_section(text, TASK_HEADING):
        text = replace_section(text, TASK_HEADING, task_reference(ctx.task_before))
    text = _with_users(with_ledger(text, ctx.ledger), mark, tail, body)
    message = summary_message(
        text,
        compaction=ctx.compaction,
        evicted=len(ctx.evicted),
        offload_path=ctx.offload_path,
        first_seq=ctx.first_seq,
        last_seq=ctx.last_seq,
    )
    extra: dict[str, object] = {USER_MESSAGES_KEY: users}
    if ctx.ledger is not None:
        extra[LEDGER_KEY] = ctx.ledger.to_metadata()
    return [message.evolve(metadata={**message.metadata, **extra})]


def _with_users(text: str, mark: str, tail: str, body: str) -> str:
    """`text` with the user messages (`body`) where `mark` (then `tail`, unless stripped) is."""
    at = text.find(mark)
    if at < 0:  # (their section was under one the ledger replaced)
        return text
    end = at + len(mark)
    if text.startswith(tail, end):
        return f"{text[:at]}{body}{text[end + len(tail) :]}"
    return f"{text[:at]}{body[: len(body) - len(tail)]}{text[end:]}"


async def default_summary(ctx: FinalizeContext, messages: list[Message]) -> list[Message]:
    """`default_finalize` as a step of `finalizer(...)`."""
    return [*messages, *default_finalize(ctx)]


def finalizer(*steps: Step) -> Finalize:
    """A finalizer that runs `steps` in order, each taking and returning the message list
    (starting empty). Include `default_summary` to keep the default summary message."""

    async def run(ctx: FinalizeContext) -> list[Message]:
        messages: list[Message] = []
        for step in steps:
            result = step(ctx, messages)
            messages = list(await result if inspect.isawaitable(result) else result)
        return messages

    return run


def preserve_skills(
    tool_name: str = "skill", *, max_skills: int = 5, max_tokens: int = 5_000, max_total: int = 25_000
) -> Step:
    """A step that re-injects the skills the agent loaded through the tool `tool_name` (their
    tool results among the evicted messages): newest first, at most `max_skills`, each cut to
    `max_tokens`, `max_total` in all, as user messages after the summary."""

    def step(ctx: FinalizeContext, messages: list[Message]) -> list[Message]:
        calls = {c.id: c for m in ctx.evicted for c in m.tool_calls if c.name == tool_name}
        loaded = [m for m in ctx.evicted if m.role == "tool" and m.tool_call_id in calls and not m.is_error]
        seen: set[str] = set()
        picked: list[Message] = []
        total = 0
        for result in reversed(loaded):
            if len(picked) >= max_skills:
                break
            key = result.text
            if key in seen:
                continue
            seen.add(key)
            text = _clip_middle(result.text, max_tokens)
            cost = estimate_text_tokens(text)
            if total + cost > max_total:
                break
            total += cost
            args = dict(calls[result.tool_call_id or ""].arguments)
            picked.append(
                Message.user(
                    f"[Skill re-loaded after compaction: {tool_name}({args})]\n{text}",
                    metadata={"cmdc.kind": "skill", "cmdc.skill_call": result.tool_call_id},
                )
            )
        picked.reverse()
        return [*messages, *picked]

    return step


async def run_finalize(finalize: Finalize, ctx: FinalizeContext) -> list[Message]:
    """Run a finalizer and check what it returned."""
    result = finalize(ctx)
    messages = list(await result if inspect.isawaitable(result) else result)
    if not messages or not all(isinstance(m, Message) for m in messages):
        raise TypeError("a finalizer must return a non-empty list of Messages")
    return messages
