"""The one clip function, and media placeholders.

Every place in cmdc that shortens text (the finalizer, skills, the summarizer's input, tail
clipping, recall, overflow messages, the simulated model, the extractive summarizer) goes
through `clip`: it measures and cuts in UTF-8 bytes, never splits a character, and its result
always fits the budget and is never longer than its input. Token budgets use `clip_tokens`,
which is `clip` at 4 bytes a token, the unit of cmdc's estimate.

`scrub_media` replaces encoded payloads (data URLs, long base64 runs) by a placeholder that
names the part, so media never enter a summary or a summarizer's input as text.
"""

from __future__ import annotations

import re
from typing import Literal

BYTES_PER_TOKEN = 4

MARKER = " [… {omitted} bytes clipped{note} …] "
"""The default marker; `{omitted}` is the number of UTF-8 bytes cut out."""


_SLICE = 256 * 1024  # characters encoded by one call when only a size is wanted


def utf8_len(text: str) -> int:
    """The size of `text` in UTF-8 (an ASCII text's is its length; a long one is encoded a
    slice at a time, never in one call)."""
    if text.isascii():
        return len(text)
    if len(text) <= _SLICE:
        return len(text.encode("utf-8", "surrogatepass"))
    return sum(len(text[i : i + _SLICE].encode("utf-8", "surrogatepass")) for i in range(0, len(text), _SLICE))


def _head(data: bytes, size: int) -> str:
    """The longest prefix of `data` of at most `size` bytes that ends on a character boundary."""
    return data[: max(0, size)].decode("utf-8", "ignore")


def _tail(data: bytes, size: int) -> str:
    return data[len(data) - max(0, size) :].decode("utf-8", "ignore") if size > 0 else ""


def clip(
    text: str,
    max_bytes: int,
    *,
    keep: Literal["middle", "head"] = "middle",
    marker: str = MARKER,
    note: str = "",
) -> str:
    """`text` unchanged when its UTF-8 encoding fits `max_bytes`; otherwise its head (and, with
    `keep="middle"`, its tail) around `marker` (`{omitted}`: bytes cut, `{note}`: `note`), the
    whole result at most `max_bytes` bytes and shorter than `text` in bytes and in characters.
    When the budget cannot hold the marker, the bare head is returned."""
    max_bytes = max(0, max_bytes)
    if len(text) > max_bytes:  # too long, whatever its bytes: only its ends are encoded
        size = utf8_len(text)
        first = text[:max_bytes].encode("utf-8", "surrogatepass")  # at least max_bytes bytes
        last = text[len(text) - max_bytes :].encode("utf-8", "surrogatepass") if max_bytes else b""
    else:
        first = last = text.encode("utf-8", "surrogatepass")
        size = len(first)
        if size <= max_bytes:
            return text
    if max_bytes <= 0:
        return ""
    # The marker with the largest count it could show is an upper bound on its size.
    widest = marker.format(omitted=size, note=note)
    room = max_bytes - utf8_len(widest)
    if room <= 0:
        return _head(first, max_bytes)
    if keep == "head":
        head = _head(first, room)
        out = head + marker.format(omitted=size - utf8_len(head), note=note)
    else:
        head = _head(first, room - room // 2)
        tail = _tail(last, room // 2)
        out = head + marker.format(omitted=size - utf8_len(head) - utf8_len(tail), note=note) + tail
    # Multi-byte text can need fewer characters than its marker: then the bare head.
    return out if len(out) < len(text) else _head(first, max_bytes)


def clip_tokens(text: str, tokens: int, **options: object) -> str:
    """`clip` to a token budget (at 4 bytes a token, so cmdc's estimate of the result is at most
    `tokens`)."""
    return clip(text, tokens * BYTES_PER_TOKEN, **options)  # type: ignore[arg-type]


def clip_line(text: str, max_bytes: int) -> str:
    """`text` on one line (whitespace collapsed), clipped in the middle around `…`."""
    return " ".join(clip(" ".join(text.split()), max_bytes, marker=" … ").split())


# -- media ------------------------------------------------------------------------------------

_MIN_PAYLOAD = 512  # shorter base64 runs are left alone (hashes, ids, tokens)
MEDIA_MIN_BYTES = _MIN_PAYLOAD
_BASE64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-"
_BASE64_MARKS = bytes(0x61 if b in _BASE64_ALPHABET else 0x20 for b in range(256))  # a base64 byte -> "a"
_BASE64_RUN_MARKS = b"a" * _MIN_PAYLOAD
_STEP = 1 << 20  # bytes `may_hold_base64` looks at per call
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?((?:;[\w.+-]+=[\w.+-]+)*);base64,([A-Za-z0-9+/=_-]{16,})")
_BASE64_RUN = re.compile(rf"[A-Za-z0-9+/_-]{{{_MIN_PAYLOAD},}}={{0,2}}")


def _looks_encoded(run: str) -> bool:
    """Base64 of binary data mixes upper case, lower case and digits all along."""
    sample = run[:256]
    return any(c.isupper() for c in sample) and any(c.islower() for c in sample) and any(c.isdigit() for c in sample)


def size_text(n: int) -> str:
    """A byte count for people: 812 B, 4.2 KB, 3.1 MB."""
    if n < 1_000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1_000:.1f} KB"
    return f"{n / 1_000_000:.1f} MB"


def media_placeholder(kind: str, size: int, where: str = "") -> str:
    """`[image/png, 400.0 KB omitted; ...where]`: names the part without its payload."""
    return f"[{kind}, {size_text(size)} omitted{f'; {where}' if where else ''}]"


def image_placeholder(source: str, media_type: str | None, where: str = "") -> str:
    """The text that stands for an image part: a URL is kept when short, a data URL never."""
    if source.startswith("data:"):
        match = _DATA_URL.match(source)
        kind = media_type or (match.group(1) if match and match.group(1) else "image")
        payload = len(match.group(3)) if match else len(source)
        return media_placeholder(kind, payload * 3 // 4, where)
    shown = clip(source, 200, marker="…")
    return f"[image{f' {media_type}' if media_type else ''}: {shown}{f'; {where}' if where else ''}]"


def may_hold_base64(encoded: bytes) -> bool:
    """A quick test on encoded bytes (a message's JSON): False when no base64 run could be there
    (no `MEDIA_MIN_BYTES` base64 bytes in a row). A megabyte per step, in two C calls that scan
    it once each (a regex trying every position took seconds on 50 MB, in one call)."""
    overlap = _MIN_PAYLOAD - 1
    for start in range(0, max(1, len(encoded) - overlap), _STEP):
        if _BASE64_RUN_MARKS in encoded[start : start + _STEP + overlap].translate(_BASE64_MARKS):
            return True
    return False


def has_media(text: str) -> bool:
    """True when `text` may hold an encoded payload (a cheap test first, on long text only)."""
    if len(text) < 64:
        return False
    if "base64," in text:
        return True
    return len(text) >= _MIN_PAYLOAD and any(_looks_encoded(m.group(0)) for m in _BASE64_RUN.finditer(text))


def scrub_media(text: str, where: str = "") -> str:
    """`text` with every data URL and every long base64 run replaced by a placeholder."""
    if not has_media(text):
        return text

    def data_url(m: re.Match[str]) -> str:
        return media_placeholder(m.group(1) or "data", len(m.group(3)) * 3 // 4, where)

    def run(m: re.Match[str]) -> str:
        payload = m.group(0)
        if not _looks_encoded(payload):  # a long word, a row of one letter: text, not a payload
            return payload
        return media_placeholder("binary data (base64)", len(payload) * 3 // 4, where)

    text = _DATA_URL.sub(data_url, text)
    return _BASE64_RUN.sub(run, text) if len(text) >= _MIN_PAYLOAD else text
