"""Summaries: calling a summarizer, rolling over chunks, the summary message, and the
offline extractive summarizer that is cmdc's embedded default."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence

import orjson

from ..errors import SummarizerError
from ..message import KIND_KEY, SUMMARY_KIND, Message
from ..providers.base import ModelRequest, Provider
from ..tokens import estimate_message_tokens

SummarizeFn = Callable[[Sequence[Message], str], Awaitable[str]]
Summarizer = Provider | SummarizeFn
"""A provider, or any async callable `(messages, instruction) -> str`."""


def summarizer_name(summarizer: object) -> str:
    name = getattr(summarizer, "name", None)
    if isinstance(name, str) and name:
        return name
    return getattr(summarizer, "__qualname__", None) or type(summarizer).__name__


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


async def call_summarizer(summarizer: Summarizer, messages: Sequence[Message], instruction: str) -> str:
    """One summarizer call. A callable gets the messages themselves; a provider (an object with
    `complete` that is not callable) gets the instruction as system prompt and a transcript."""
    if not callable(summarizer):
        request = ModelRequest(
            messages=(Message.system(instruction), Message.user(render_transcript(messages))),
            metadata={"cmdc.purpose": "summarize"},
        )
        reply = await summarizer.complete(request)
        if not isinstance(reply, Message):
            raise SummarizerError(f"summarizer provider returned {type(reply).__name__}, not a Message")
        return reply.text
    text = await summarizer(messages, instruction)
    if not isinstance(text, str):
        raise SummarizerError(f"summarizer returned {type(text).__name__}, not text")
    return text


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
    summarizer: Summarizer, messages: Sequence[Message], instruction: str, chunk_tokens: int | None
) -> str:
    """Summarize `messages`; past `chunk_tokens`, in chunks, each seeing the summary so far."""
    if chunk_tokens is None:
        return await call_summarizer(summarizer, messages, instruction)
    partial: str | None = None
    for chunk in chunk_messages(messages, chunk_tokens):
        seed = [] if partial is None else [Message.user(partial, metadata={KIND_KEY: SUMMARY_KIND})]
        partial = await call_summarizer(summarizer, seed + chunk, instruction)
        if not partial.strip():
            return partial
    return partial or ""


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
        header + text.strip(),
        metadata={
            KIND_KEY: SUMMARY_KIND,
            "cmdc.compaction": compaction,
            "cmdc.evicted": evicted,
            "cmdc.offload_path": offload_path,
            "cmdc.first_seq": first_seq,
            "cmdc.last_seq": last_seq,
        },
    )


# -- the offline extractive summarizer --------------------------------------------------------

_SECTIONS = (
    "Primary request and intent",
    "All user messages",
    "Tool calls and outcomes",
    "Files and identifiers",
    "Errors",
    "Current work",
)
_IDENT = re.compile(r"(?:[\w.-]*/[\w./-]*\w|\b[\w-]+\.[A-Za-z]{1,5}\b|\b[A-Z][A-Z0-9]+-\d+\b)")


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _parse_sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        elif current is not None and line.startswith("- "):
            current.append(line[2:])
    return sections


def _fit(items: list[str], budget: int) -> list[str]:
    """The newest items whose total length fits `budget` characters, in original order."""
    out: list[str] = []
    used = 0
    for item in reversed(items):
        if used + len(item) > budget and out:
            break
        out.append(item)
        used += len(item)
    out.reverse()
    return out


class ExtractiveSummarizer:
    """Offline, deterministic summarizer: no model, no network. It extracts the task, the user
    messages, the tool calls and their outcomes, identifiers and errors, and the last assistant
    text, within `max_chars`, and folds an earlier summary's sections forward."""

    name = "extractive"

    def __init__(self, max_chars: int = 6_000) -> None:
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 500:
            raise ValueError(f"max_chars must be an integer >= 500, got {max_chars!r}")
        self.max_chars = max_chars

    async def __call__(self, messages: Sequence[Message], instruction: str) -> str:
        return self.summarize(messages)

    async def complete(self, request: ModelRequest) -> Message:
        """Provider form: summarizes the request's messages (a rendered transcript is taken as is)."""
        text = self.summarize([m for m in request.messages if m.role != "system"])
        return Message.assistant(text)

    def summarize(self, messages: Sequence[Message]) -> str:
        s: dict[str, list[str]] = {name: [] for name in _SECTIONS}
        calls: dict[str, str] = {}
        for m in messages:
            if m.is_summary:
                for name, items in _parse_sections(m.text).items():
                    if name in s:
                        s[name].extend(items)
                continue
            text = m.text
            if m.role == "user":
                if not s["Primary request and intent"]:
                    s["Primary request and intent"].append(_clip(text, 600))
                s["All user messages"].append(_clip(text, 400))
            elif m.role == "assistant":
                if text.strip():
                    s["Current work"] = [_clip(text, 600)]
                for c in m.tool_calls:
                    args = orjson.dumps(dict(c.to_dict()["arguments"])).decode()
                    calls[c.id] = f"{c.name}({_clip(args, 160)})"
                    s["Tool calls and outcomes"].append(f"{calls[c.id]} -> (no result yet)")
            elif m.role == "tool":
                outcome = ("ERROR: " if m.is_error else "") + _clip(text, 200)
                call = calls.get(m.tool_call_id or "", f"call {m.tool_call_id}")
                line = f"{call} -> {outcome}"
                pending = f"{call} -> (no result yet)"
                items = s["Tool calls and outcomes"]
                if pending in items:
                    items[items.index(pending)] = line
                else:
                    items.append(line)
                if m.is_error:
                    s["Errors"].append(f"{call}: {_clip(text, 200)}")
            for ident in _IDENT.findall(text):
                if ident not in s["Files and identifiers"]:
                    s["Files and identifiers"].append(ident)
        s["Primary request and intent"] = s["Primary request and intent"][:1]
        s["Current work"] = s["Current work"][-1:]
        shares = {
            "Primary request and intent": 0.12,
            "All user messages": 0.33,
            "Tool calls and outcomes": 0.25,
            "Files and identifiers": 0.1,
            "Errors": 0.08,
            "Current work": 0.12,
        }
        out: list[str] = []
        for name in _SECTIONS:
            items = list(dict.fromkeys(s[name]))
            kept = _fit(items, int(self.max_chars * shares[name]))
            out.append(f"## {name}")
            if len(kept) < len(items):
                out.append(f"({len(items) - len(kept)} older entries are in the journal)")
            out.extend(f"- {item}" for item in kept)
            if not items:
                out.append("(none)")
            out.append("")
        return "\n".join(out).strip()
