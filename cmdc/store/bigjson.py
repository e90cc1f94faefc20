"""Reading a huge message's JSON in short steps.

A message whose JSON is megabytes long is mostly one string: its text (`"content":"..."`).
Parsing it with one `orjson.loads`, or copying it once, is one C call that holds the GIL from
start to end: a worker thread doing it stops the trio thread for as long (tens to hundreds of
milliseconds for 50 MB). Here the text is found, checked and decoded `PIECE` bytes at a time,
so the GIL changes hands between two calls; the rest of the message (id, role, tool calls,
metadata), small, is parsed as usual. A caller that only shows a message's head reads the
head and counts the rest (`max_chars`), never building the whole text.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence

import orjson

from ..errors import InvalidMessage
from ..message import Message
from .search import count_words

PIECE = 256 * 1024
"""Bytes handled by one C call."""

BIG = 1024 * 1024
"""A message's JSON longer than this many bytes is read in pieces."""

_CONTENT = re.compile(rb'\{"id":"(?:[^"\\]|\\.){0,4000}","role":"[a-z]{1,16}","content":"')
_STEP_BACK = 16  # bytes a cut may move back to land between two characters (an escape is at most 12)


class _BadJSON(ValueError):
    """The text is not a valid JSON string."""


def find(data: bytes, needle: bytes, start: int, end: int) -> int:
    """`data.find(needle, start, end)` (a one-byte needle), `PIECE` bytes per call."""
    pos = start
    while pos < end:
        stop = min(end, pos + PIECE)
        i = data.find(needle, pos, stop)
        if i >= 0:
            return i
        pos = stop
    return -1


def crc32(data: bytes, start: int, end: int, crc: int = 0) -> int:
    """CRC-32 of `data[start:end]`, continuing `crc`, without copying it."""
    view = memoryview(data)
    for pos in range(start, end, PIECE):
        crc = zlib.crc32(view[pos : min(end, pos + PIECE)], crc)
    return crc


def content_span(data: bytes, start: int, end: int) -> tuple[int, int] | None:
    """Where the text of the message object at `data[start:end]` is: (first byte after the
    opening quote, the closing quote), when the object starts `{"id":...,"role":...,"content":"`
    (the order `Message.to_json` writes); None for any other shape. `_BadJSON` if the string
    does not end before `end`."""
    m = _CONTENT.match(data, start, min(end, start + 4200))
    if m is None:
        return None
    first = pos = m.end()
    while True:
        q = find(data, b'"', pos, end)
        if q < 0:
            raise _BadJSON("the message's text never ends")
        k = q
        while k > first and data[k - 1] == 0x5C:  # backslashes before the quote
            k -= 1
        if (q - k) % 2 == 0:
            return first, q
        pos = q + 1


def _decode(data: bytes, start: int, end: int) -> str | None:
    try:
        text = orjson.loads(b'"' + data[start:end] + b'"')
    except orjson.JSONDecodeError:
        return None
    assert isinstance(text, str)
    return text


def pieces(data: bytes, start: int, end: int) -> Iterator[str]:
    """The JSON string text `data[start:end]` (inside its quotes), decoded `PIECE` bytes at a
    time. A cut lands between two characters: the first place, going back from the piece's
    end, where what comes before decodes (a cut inside a UTF-8 sequence, an escape or a
    surrogate pair does not); `_BadJSON` if none does (the text is damaged)."""
    pos = start
    while pos < end:
        cut = min(end, pos + PIECE)
        back = range(cut, max(pos, cut - _STEP_BACK), -1)
        ahead = range(cut + 1, min(end, cut + _STEP_BACK) + 1)  # a piece shorter than a character
        for c in (*back, *ahead) if cut < end else (cut,):
            if c < end and 0x80 <= data[c] < 0xC0:  # inside a UTF-8 sequence
                continue
            text = _decode(data, pos, c)
            if text is not None:
                break
        else:
            raise _BadJSON(f"the message's text is not a valid JSON string (bytes {pos}-{cut})")
        yield text
        pos = c


def read_text(
    data: bytes, start: int, end: int, max_chars: int | None, words: Sequence[str] | None
) -> tuple[str, int, Counter[str] | None]:
    """The JSON string text `data[start:end]`: (the text, or its first `max_chars` characters;
    its length in characters; how often each word occurs in it, casefolded, when `words` is
    given: exact for those words). Only the head is kept with `max_chars`: the whole text is
    never built."""
    kept: list[str] = []
    have = total = 0
    counts: Counter[str] | None = Counter() if words is not None else None
    carry = ""
    for text in pieces(data, start, end):
        total += len(text)
        if max_chars is None:
            kept.append(text)
        elif have < max_chars:
            kept.append(text[: max_chars - have])
            have += len(kept[-1])
        if counts is not None:
            carry = count_words(carry + text, counts, words)
    if counts is not None and carry:
        count_words(carry + " ", counts, words)
    return "".join(kept), total, counts


def message_from_json(data: bytes, max_chars: int | None = None) -> tuple[Message, int]:
    """The message whose JSON is `data` (as `Message.from_json`), and how many characters of
    its text were left out: with `max_chars`, a text longer than that comes cut to it. JSON
    past `BIG` bytes is read in short steps. `InvalidMessage` for anything malformed."""
    text: str | None = None
    total = 0
    try:
        span = content_span(data, 0, len(data)) if len(data) > BIG else None
        if span is not None:
            text, total, _ = read_text(data, span[0], span[1], max_chars, None)
            fields = orjson.loads(data[: span[0]] + data[span[1] :])
        else:
            fields = orjson.loads(data)
    except (_BadJSON, orjson.JSONDecodeError) as exc:
        raise InvalidMessage(f"message is not valid JSON: {exc}") from None
    if text is not None and isinstance(fields, dict):
        fields["content"] = text
    message = Message.from_dict(fields)
    if not isinstance(message.content, str) or max_chars is None:
        return message, 0
    if text is None:
        total = len(message.content)
        if total > max_chars:
            message = message.evolve(content=message.content[:max_chars])
    return message, total - len(message.content)
