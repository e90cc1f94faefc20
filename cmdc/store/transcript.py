"""The journal as Markdown, for people and for the model's own file tools: one renderer, used by
both stores (`OffloadStore.write_transcript`, `Store.transcript`). A batch is a heading per
compaction, a message a heading per record, texts fenced so no text can close its fence."""

from __future__ import annotations

import re
from collections.abc import Sequence

import orjson

from ..message import Message

_BACKTICKS = re.compile(r"`+")
_NOT_BACKTICK = re.compile(r"[^`]")
_TEXT_SLICE = 64 * 1024  # characters of a text one regex call looks at


def _longest_backticks(text: str) -> int:
    """The longest run of backticks in `text`, a slice at a time (cut where no run is)."""
    best, start, n = 0, 0, len(text)
    while start < n:
        end = min(n, start + _TEXT_SLICE)
        if text.find("`", start, end) < 0:  # the common case: no backtick at all
            start = end
            continue
        if end < n and text[end - 1] == "`":
            m = _NOT_BACKTICK.search(text, end)
            end = m.start() if m is not None else n
        best = max(best, max((len(run) for run in _BACKTICKS.findall(text, start, end)), default=0))
        start = end
    return best


def md_code(text: str) -> str:
    """`text` as inert inline Markdown code on one line, whatever backticks it holds."""
    text = " ".join(text.split())
    fence = "`" * (_longest_backticks(text) + 1)
    return f"{fence} {text} {fence}" if text else "` `"


def md_fenced(text: str) -> str:
    """`text` in a fenced code block longer than any backtick run inside it: headings, HTML,
    links and fences in it stay inert text."""
    return b"".join(_fenced(text)).decode()


def _fenced(text: str) -> list[bytes]:
    """`md_fenced(text)` encoded, in pieces: a huge text a slice at a time."""
    fence = "`" * max(3, _longest_backticks(text) + 1)
    end = len(text)
    while end and text[end - 1] == "\n":
        end -= 1
    body = [text[i : min(end, i + _TEXT_SLICE * 4)].encode() for i in range(0, end, _TEXT_SLICE * 4)]
    return [f"{fence}text\n".encode(), *body, f"\n{fence}\n".encode()]


def transcript_pieces(compaction: int, records: Sequence[tuple[int, Message]]) -> list[bytes]:
    """Markdown for people, in pieces (a huge text is many): only the headings are Markdown;
    every text that came from a model, a tool or a user is fenced or inline code, so nothing in
    it renders (a `# Title`, `<script>`)."""
    out = [f"## Compaction {compaction} — records {records[0][0]}\N{EN DASH}{records[-1][0]}\n\n".encode()]
    for seq, msg in records:
        head = f"### {seq} · {msg.role}"
        if msg.tool_call_id is not None:
            head += f" (call {md_code(msg.tool_call_id)}{', error' if msg.is_error else ''})"
        out.append((head + "\n\n").encode())
        for call in msg.tool_calls:
            args = orjson.dumps(call.to_dict()["arguments"]).decode()
            out.append(f"- tool call {md_code(call.name)} (id {md_code(call.id)}): {md_code(args)}\n\n".encode())
        if msg.text:
            out += _fenced(msg.text)
            out.append(b"\n")
    return out


__all__ = ["md_code", "md_fenced", "transcript_pieces"]
