"""What a summarizing model reads and writes: the transcript of the messages it summarizes
(`render_transcript`, and `parse_transcript` to read one back), and the analysis scratchpad a
model may write before its answer (`strip_scratchpad`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import orjson

from ..errors import InvalidMessage
from ..message import KIND_KEY, SUMMARY_KIND, Message, ToolCall


def render_transcript(messages: Sequence[Message]) -> str:
    """A plain-text transcript of `messages`, as a summarizing model reads it."""
    lines: list[str] = []
    for m in messages:
        if m.is_summary:
            lines.append(f"[earlier summary]\n{m.text}")
        elif m.role == "tool":
            flag = " (error)" if m.is_error else ""
            lines.append(f"[tool result {m.tool_call_id}{flag}]\n{m.text}")
        else:
            lines.append(f"[{m.role}]\n{m.text}" if m.text else f"[{m.role}]")
            for c in m.tool_calls:
                args = orjson.dumps(dict(c.to_dict()["arguments"])).decode()
                lines.append(f"  -> call {c.name} (id {c.id}) {args}")
    return "\n\n".join(lines)


_TRANSCRIPT_HEADER = re.compile(
    r"(?:\A|\n\n)\[(user|assistant|system|earlier summary|tool result (\S+?)( \(error\))?)\](?:\n|\Z)"
)
_TRANSCRIPT_CALL = re.compile(r"  -> call (\S+) \(id (.+?)\) (\{.*\})")


def parse_transcript(text: str) -> list[Message] | None:
    """The messages of a transcript written by `render_transcript`, or None if `text` is not one."""
    headers = list(_TRANSCRIPT_HEADER.finditer(text))
    if not headers or headers[0].start() != 0:
        return None
    out: list[Message] = []
    try:
        for i, h in enumerate(headers):
            body = text[h.end() : headers[i + 1].start() if i + 1 < len(headers) else len(text)]
            kind = h.group(1)
            if kind == "earlier summary":
                out.append(Message.user(body, metadata={KIND_KEY: SUMMARY_KIND}))
            elif h.group(2) is not None:
                out.append(Message.tool_result(h.group(2), body, is_error=h.group(3) is not None))
            elif kind == "assistant":
                paragraphs = body.split("\n\n")
                if paragraphs[0].startswith("\n"):  # no text, then the calls
                    paragraphs[:1] = ["", paragraphs[0][1:]]
                calls: list[ToolCall] = []
                while paragraphs and (m := _TRANSCRIPT_CALL.fullmatch(paragraphs[-1])) is not None:
                    paragraphs.pop()
                    args = orjson.loads(m.group(3))
                    calls.insert(0, ToolCall(id=m.group(2), name=m.group(1), arguments=args))
                out.append(Message.assistant("\n\n".join(paragraphs), tool_calls=calls))
            elif kind == "user":
                out.append(Message.user(body))
    except (InvalidMessage, orjson.JSONDecodeError):
        return None
    return out


# -- the analysis scratchpad ------------------------------------------------------------------

_ANALYSIS_BLOCK = re.compile(r"<analysis\b[^>]*>.*?</analysis\s*>", re.IGNORECASE | re.DOTALL)
_ANALYSIS_OPEN = re.compile(r"<analysis\b[^>]*>", re.IGNORECASE)
_ANALYSIS_CLOSE = re.compile(r"</analysis\s*>", re.IGNORECASE)
_SUMMARY_BLOCK = re.compile(r"<summary\b[^>]*>(.*?)(?:</summary\s*>|\Z)", re.IGNORECASE | re.DOTALL)


def strip_scratchpad(text: str) -> str:
    """`text` without the analysis scratchpad a summarizing model may write before its answer:
    `<analysis>...</analysis>` blocks go (an unclosed one runs to the end, a stray closing tag
    takes what precedes it along), and when a `<summary>...</summary>` wrapper is present only
    its inside is kept. Surrounding whitespace is stripped. If nothing would be left, the
    original text is returned, stripped: this never invents content."""
    rest = _ANALYSIS_BLOCK.sub("", text)
    closes = list(_ANALYSIS_CLOSE.finditer(rest))
    if closes:
        rest = rest[closes[-1].end() :]
    inside = [m.group(1).strip() for m in _SUMMARY_BLOCK.finditer(rest)]
    if inside:
        rest = "\n\n".join(part for part in inside if part)
    else:
        opened = _ANALYSIS_OPEN.search(rest)
        if opened is not None:
            rest = rest[: opened.start()]
    return rest.strip() or text.strip()
