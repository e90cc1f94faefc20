"""What a compaction clips, all through the one clip function (`cmdc._clip`): the summarizer's
input (media as placeholders, huge parts cut with a pointer to the journal), the inserted
messages stepped down to their budget (the contraction rule), and trailing tool results too
large for the model. The journal always holds the originals whole."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress
from operator import attrgetter
from typing import Any

import attrs

from .._clip import MEDIA_MIN_BYTES, clip_tokens, may_hold_base64
from ..message import Message
from ..store.records import AppendResult
from ..tokens import IMAGE_TOKENS, estimate_message_tokens, estimate_text_tokens
from .finalize import USER_MESSAGES_KEY
from .summary import without_media

Count = Callable[[Message], int]

MIN_SUMMARY_TEXT = 32
"""A summary clipped below this many tokens says too little: the contraction steps down."""

_CLIPPED_NOTE = "; the evicted messages are whole in the journal"
_TAIL_MARKER = "\n[… {omitted} more bytes clipped to fit the context; {note}]"
_INPUT_MARKER = "\n[… {omitted} more bytes clipped; {note}]"

# A message below this estimate holds no image part and no base64 run worth a placeholder.
_MEDIA_MIN_TOKENS = min(IMAGE_TOKENS, MEDIA_MIN_BYTES // 4)
_CACHED_TOKENS = attrgetter("_tokens")


# -- the summarizer's input ---------------------------------------------------------------------


def reduced(messages: Sequence[Message], limit: int | None, written: AppendResult) -> Sequence[Message]:
    """What the summarizer reads: media as placeholders naming the part, tool results and
    tool-call arguments longer than `limit` tokens cut to a head with a pointer to the journal
    (which holds them whole)."""
    where = f"journal {written.path}, records {written.first_seq}-{written.last_seq}"
    # One pass over the cached encodings: only a message that may hold media (a data URL, or
    # long enough for a base64 run) is looked at closely, only a large one is clipped.
    out: list[Message] | None = None
    large: list[int] = []
    cap = limit if limit is not None else 1 << 62
    tokens_of = list(map(_CACHED_TOKENS, messages))
    try:
        top = max(tokens_of, default=0)  # (one C pass of int comparisons; a None raises)
    except TypeError:  # an estimate not cached yet
        tokens_of = [m._tokens or estimate_message_tokens(m) for m in messages]
        top = max(tokens_of, default=0)
    # Smaller ones cannot hold an image part or a base64 run, nor pass the limit (picked out
    # in C: no loop here). A limit below the media floor lowers the floor of the size check.
    floor = min(_MEDIA_MIN_TOKENS, cap + 1)
    if top < floor:  # (the common case) none of them: nothing to look at
        return messages
    for i in compress(range(len(tokens_of)), map(floor.__le__, tokens_of)):
        m, tokens = messages[i], tokens_of[i]
        if tokens < _MEDIA_MIN_TOKENS:
            large.append(i)  # below the media floor, so above the limit
            continue
        encoded = m._json or m._encoded()  # a message not encoded yet (`cmdc compact`'s) stays so
        if b"base64," in encoded or may_hold_base64(encoded):
            plain = without_media(m, where)
            if plain is not m:
                if out is None:
                    out = list(messages)
                out[i] = m = plain
                tokens = estimate_message_tokens(m)
        if tokens > cap:
            large.append(i)
    if out is not None:
        messages = out
    if not large:
        return messages
    assert limit is not None
    pointer = f"the full text is in the {where}"
    out = list(messages)
    for i in large:
        m = out[i]
        if m.role == "tool":
            out[i] = m.evolve(content=clip_tokens(m.text, limit, keep="head", marker=_INPUT_MARKER, note=pointer))
        elif m.tool_calls:
            out[i] = _calls_clipped(m, limit, pointer)
        elif not m.is_summary:  # a huge user or assistant message: head and tail
            out[i] = m.evolve(content=clip_tokens(m.text, limit * 4, note=f"; {pointer}"))
    return out


def within(message: Message, cap: int) -> Message:
    """`message` cut to about `cap` tokens for a summarizer's window (a summary keeps its header)."""
    if estimate_message_tokens(message) <= cap:
        return message
    note = "; whole in the journal"
    head, sep, body = _header_split(message)
    room = max(16, cap - estimate_message_tokens(Message.user(head)) - 16)
    clipped = _calls_clipped(message, max(16, cap // 4), note)
    return clipped.evolve(content=head + sep + clip_tokens(body, room, note=note))


def largest_message(messages: Sequence[Message]) -> int:
    return max((estimate_message_tokens(m) for m in messages), default=0)


def _calls_clipped(message: Message, limit: int, pointer: str) -> Message:
    calls = tuple(
        attrs.evolve(c, arguments={k: _clip_value(v, limit, pointer) for k, v in c.arguments.items()})
        for c in message.tool_calls
    )
    return message.evolve(tool_calls=calls) if calls else message


def _clip_value(value: Any, limit: int, pointer: str) -> Any:
    if isinstance(value, str):
        return clip_tokens(value, limit, keep="head", marker=_INPUT_MARKER, note=pointer)
    return value


def _header_split(message: Message) -> tuple[str, str, str]:
    """(header, separator, body): a summary's header (where the evicted messages went) is kept
    whole when it is clipped; any other message is all body."""
    head, sep, body = message.text.partition("\n\n") if message.is_summary else ("", "", message.text)
    return (head, sep, body) if sep else ("", "", message.text)


# -- the contraction rule -----------------------------------------------------------------------


def contract(
    inserted: list[Message], limit: int, pointer: Callable[[], Message], count: Count
) -> tuple[list[Message], str | None]:
    """The inserted messages within `limit` tokens, stepping down as needed: (messages, the
    fallback used or None). "clipped": the summary message clipped; "summary only": other
    inserted messages dropped and the summary clipped; "pointer only": a summary that only
    names the journal records (`pointer()`, built only then); "skipped": not even that fits."""
    cost = sum(count(m) for m in inserted)
    if cost <= limit:
        return inserted, None
    at = next((i for i, m in enumerate(inserted) if m.is_summary), None)
    if at is not None:
        shrunk = _shrunk(inserted[at], limit - (cost - count(inserted[at])), count)
        if shrunk is not None:
            return [*inserted[:at], shrunk, *inserted[at + 1 :]], "clipped"
        alone = inserted[at].evolve(metadata={k: v for k, v in inserted[at].metadata.items() if k != USER_MESSAGES_KEY})
        shrunk = _shrunk(alone, limit, count)
        if shrunk is not None and len(inserted) > 1:
            return [shrunk], "summary only"
    smallest = pointer()
    if count(smallest) <= limit:
        return [smallest], "pointer only"
    return inserted, "skipped"


def _shrunk(message: Message, room: int, count: Count) -> Message | None:
    """`message` with its text clipped so that it counts at most `room` tokens, or None."""
    cost = count(message)
    if cost <= room:
        return message
    head, sep, text = _header_split(message)
    target = room - (cost - estimate_text_tokens(text)) - 1
    for _ in range(4):
        if target < MIN_SUMMARY_TEXT:
            return None
        clipped = message.evolve(content=head + sep + clip_tokens(text, target, note=_CLIPPED_NOTE))
        got = count(clipped)
        if got <= room:
            return clipped
        target = target * room // max(1, got) - 1
    return None


# -- the tail -----------------------------------------------------------------------------------


def trailing_tool_results(messages: Sequence[Message]) -> int:
    """Where the run of tool results that ends `messages` starts."""
    start = len(messages)
    while start > 0 and messages[start - 1].role == "tool":
        start -= 1
    return start


def clipped_result(message: Message, limit: int, written: AppendResult) -> Message:
    """A tool result cut to its head within `limit` tokens, pointing at its journal record."""
    pointer = f"the full result is in the journal {written.path}, records {written.first_seq}-{written.last_seq}"
    return Message.tool_result(
        message.tool_call_id or "",
        clip_tokens(message.text, limit, keep="head", marker=_TAIL_MARKER, note=pointer),
        is_error=message.is_error,
        metadata={**message.metadata, "cmdc.clipped_from": message.id},
    )
