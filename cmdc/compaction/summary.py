"""Summaries: the summarizer protocol, calling a summarizer (bounded answers, rolling over
chunks), the sections a prompt asks for, and the summary and pointer messages.

The offline extractive summarizer lives in `cmdc.providers.extractive`, the transcript and the
scratchpad in `cmdc.providers.transcript`; their names are importable from here too."""

from __future__ import annotations

import copy
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from .._clip import clip_tokens, has_media, image_placeholder, scrub_media
from ..errors import SummarizerError
from ..message import KIND_KEY, SUMMARY_KIND, ImagePart, Message, TextPart
from ..providers.base import STOP_REASON_KEY, ModelRequest, Provider
from ..providers.extractive import ExtractiveSummarizer
from ..providers.transcript import parse_transcript, render_transcript, strip_scratchpad
from ..tokens import estimate_message_tokens, estimate_text_tokens
from .warm import record_usage

SummarizeFn = Callable[[Sequence[Message], str], Awaitable[str]]
Summarizer = Provider | SummarizeFn
"""A provider, or any async callable `(messages, instruction) -> str`."""


def summarizer_name(summarizer: object) -> str:
    name = getattr(summarizer, "name", None)
    if isinstance(name, str) and name:
        return name
    return getattr(summarizer, "__qualname__", None) or type(summarizer).__name__


ANSWER_MARKER = " [… {omitted} bytes of the summarizer's answer clipped: it was over its output budget{note} …] "
"""Marks an answer clipped to its budget (`SummaryAttempt.clipped` tells a `should_retry`)."""


def bound_answer(text: str, max_tokens: int | None) -> str:
    """A summarizer's answer within `max_tokens` (estimated): an analysis scratchpad is
    dropped first, then what is still over is clipped in the middle around `ANSWER_MARKER`
    (the head has the first sections, the tail the current work and the next step)."""
    if max_tokens is None or estimate_text_tokens(text) <= max_tokens:
        return text
    text = strip_scratchpad(text)
    note = f" of {max_tokens} tokens"
    return clip_tokens(text, max_tokens, marker=ANSWER_MARKER, note=note)


TRUNCATED_STOPS = frozenset({"length", "max_tokens", "model_context_window_exceeded"})
"""Stop reasons that mean the answer was cut off, not finished."""


async def call_summarizer(
    summarizer: Summarizer, messages: Sequence[Message], instruction: str, max_tokens: int | None = None
) -> str:
    """One summarizer call. A callable gets the messages themselves; a provider (an object with
    `complete` that is not callable) gets the instruction as system prompt and a transcript,
    and `max_tokens` as the request's output limit. The answer is bounded by `max_tokens`
    whatever the summarizer did (`bound_answer`); the offline `ExtractiveSummarizer` is asked
    to write within it."""
    text, _ = await call_summarizer_stop(summarizer, messages, instruction, max_tokens)
    return text


async def call_summarizer_stop(
    summarizer: Summarizer, messages: Sequence[Message], instruction: str, max_tokens: int | None = None
) -> tuple[str, str | None]:
    """`call_summarizer`, with the provider's stop reason (`cmdc.stop_reason`; None for a callable
    or a provider that gives none)."""
    if not callable(summarizer):
        request = ModelRequest(
            messages=(Message.system(instruction), Message.user(render_transcript(messages))),
            max_output_tokens=max_tokens,
            metadata={"cmdc.purpose": "summarize"},
        )
        reply = await summarizer.complete(request)
        if not isinstance(reply, Message):
            raise SummarizerError(f"summarizer provider returned {type(reply).__name__}, not a Message")
        record_usage(reply.usage)  # the compaction's report counts the summarizer's tokens
        stop = reply.metadata.get(STOP_REASON_KEY)
        return bound_answer(reply.text, max_tokens), stop if isinstance(stop, str) else None
    if isinstance(summarizer, ExtractiveSummarizer) and max_tokens is not None:
        chars = max(500, min(summarizer.max_chars, max_tokens * 4))
        if chars != summarizer.max_chars:  # a copy with the smaller bound (a subclass stays itself)
            summarizer = copy.copy(summarizer)
            summarizer.max_chars = chars
    text = await summarizer(messages, instruction)
    if not isinstance(text, str):
        raise SummarizerError(f"summarizer returned {type(text).__name__}, not text")
    return bound_answer(text, max_tokens), None


def chunk_messages(messages: Sequence[Message], limit: int) -> list[list[Message]]:
    """Greedy chunks of at most `limit` estimated tokens (a larger message stands alone)."""
    chunks: list[list[Message]] = [[]]
    size = 0
    for m in messages:
        cost = estimate_message_tokens(m)
        if chunks[-1] and size + cost > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(m)
        size += cost
    return chunks


async def summarize_rolling(
    summarizer: Summarizer,
    messages: Sequence[Message],
    instruction: str,
    chunk_tokens: int | None,
    max_tokens: int | None = None,
) -> str:
    """Summarize `messages`; past `chunk_tokens`, in chunks, each seeing the summary so far.
    Every answer, partial or final, is bounded by `max_tokens`."""
    text, _ = await summarize_chunks(summarizer, messages, instruction, chunk_tokens, max_tokens)
    return text


async def summarize_chunks(
    summarizer: Summarizer,
    messages: Sequence[Message],
    instruction: str,
    chunk_tokens: int | None,
    max_tokens: int | None = None,
) -> tuple[str, str | None]:
    """`summarize_rolling`, with a stop reason: the first one that says an answer was cut off
    (`TRUNCATED_STOPS`: a partial summary cut off spoils what is rolled forward), else the last."""
    if chunk_tokens is None:
        return await call_summarizer_stop(summarizer, messages, instruction, max_tokens)
    partial: str | None = None
    stop: str | None = None
    for chunk in chunk_messages(messages, chunk_tokens):
        seed = [] if partial is None else [Message.user(partial, metadata={KIND_KEY: SUMMARY_KIND})]
        partial, last = await call_summarizer_stop(summarizer, seed + chunk, instruction, max_tokens)
        if stop not in TRUNCATED_STOPS:
            stop = last
        if not partial.strip():
            return partial, stop
    return partial or "", stop


_ASKED_HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_ANSWER_HEADING = re.compile(r"^\s*(?:#{1,6}\s+|\*\*|\d+[.)]\s+)(.+?)(?:\*\*)?\s*:?\s*$", re.MULTILINE)


def _heading_key(text: str) -> str:
    return re.sub(r"[^a-z0-9 ]+", "", re.sub(r"^\d+[.)]\s*", "", text.strip().lower())).strip()


def missing_sections(answer: str, instruction: str) -> list[str]:
    """The Markdown headings (`## Name` lines) `instruction` asks for that `answer` lacks (a
    heading counts as `#`-heading, bold line or numbered line, case and punctuation aside).
    Empty when the instruction asks for none."""
    asked = [m.group(1) for m in _ASKED_HEADING.finditer(instruction)]
    if not asked:
        return []
    given = {_heading_key(m.group(1)) for m in _ANSWER_HEADING.finditer(answer)}
    return [h for h in asked if _heading_key(h) not in given]


def summary_message(
    text: str, *, compaction: int, evicted: int, offload_path: str, first_seq: int, last_seq: int
) -> Message:
    """The message that replaces evicted messages: role user, marked as a summary, naming the
    journal and the range of records that hold what it replaces."""
    header = (
        f"[Conversation summary #{compaction}] {evicted} earlier messages were moved out of the context "
        f"into the journal {offload_path} (records {first_seq}-{last_seq}). Everything they said is "
        "still there and can be read back; the summary below replaces them.\n\n"
    )
    return Message.user(
        header + text.strip(), metadata=_summary_metadata(compaction, evicted, offload_path, first_seq, last_seq)
    )


def _summary_metadata(
    compaction: int, evicted: int, offload_path: str, first_seq: int, last_seq: int
) -> dict[str, Any]:
    """What marks a summary and names the journal range it replaces."""
    return {
        KIND_KEY: SUMMARY_KIND,
        "cmdc.compaction": compaction,
        "cmdc.evicted": evicted,
        "cmdc.offload_path": offload_path,
        "cmdc.first_seq": first_seq,
        "cmdc.last_seq": last_seq,
    }


def _scrub_value(value: Any, where: str) -> Any:
    if isinstance(value, str):
        return scrub_media(value, where)
    if isinstance(value, Mapping):
        return {k: _scrub_value(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub_value(v, where) for v in value]
    return value


def _any_media(value: Any) -> bool:
    if isinstance(value, str):
        return has_media(value)
    if isinstance(value, Mapping):
        return any(_any_media(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_any_media(v) for v in value)
    return False


def without_media(message: Message, where: str = "") -> Message:
    """`message` with its media as placeholders that name each part (kind, size, where the
    original is): image parts become text, data URLs and long base64 runs in text and in
    tool-call arguments are replaced. The same message when it has none (the common case
    costs a length check)."""
    content = message.content
    changes: dict[str, Any] = {}
    if isinstance(content, str):
        scrubbed = scrub_media(content, where)
        if scrubbed != content:
            changes["content"] = scrubbed
    elif any(isinstance(p, ImagePart) or has_media(p.text) for p in content):
        changes["content"] = tuple(
            TextPart(image_placeholder(p.source, p.media_type, where))
            if isinstance(p, ImagePart)
            else TextPart(scrub_media(p.text, where))
            for p in content
        )
    if message.tool_calls and any(_any_media(c.arguments) for c in message.tool_calls):
        changes["tool_calls"] = tuple(
            attrs.evolve(c, arguments=_scrub_value(dict(c.arguments), where)) for c in message.tool_calls
        )
    return message.evolve(**changes) if changes else message


def pointer_message(*, compaction: int, evicted: int, offload_path: str, first_seq: int, last_seq: int) -> Message:
    """The smallest summary, when a real one would not be smaller than what it replaces: it
    only says where the evicted messages went."""
    return Message.user(
        f"[Conversation summary #{compaction}] {evicted} messages moved to the journal {offload_path}, "
        f"records {first_seq}-{last_seq}; use recall to read them.",
        metadata={
            **_summary_metadata(compaction, evicted, offload_path, first_seq, last_seq),
            "cmdc.pointer_only": True,
        },
    )


__all__ = [
    "ANSWER_MARKER",
    "TRUNCATED_STOPS",
    "ExtractiveSummarizer",
    "SummarizeFn",
    "Summarizer",
    "bound_answer",
    "call_summarizer",
    "call_summarizer_stop",
    "chunk_messages",
    "missing_sections",
    "parse_transcript",
    "pointer_message",
    "render_transcript",
    "strip_scratchpad",
    "summarize_chunks",
    "summarize_rolling",
    "summarizer_name",
    "summary_message",
    "without_media",
]
