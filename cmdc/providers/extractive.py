"""The offline extractive summarizer: cmdc's embedded default. No model, no network,
deterministic; one function per section of the default summary prompt, and a bounded read of
the history (its output is bounded, so only what can reach it is read)."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import attrs
import orjson
import trio

from .._check import integer
from .._clip import clip, clip_line, utf8_len
from ..message import Message, TokenUsage, ToolCall
from ..tokens import estimate_message_tokens, estimate_text_tokens
from .base import ModelRequest
from .transcript import parse_transcript, strip_scratchpad

_SECTIONS = (
    "Primary request and intent",
    "Key concepts",
    "Files and code",
    "Errors and fixes",
    "All user messages",
    "Pending tasks",
    "Current work",
    "Next step",
)
_TASK, _CONCEPTS, _FILES, _ERRORS, _USERS, _PENDING, _CURRENT, _NEXT = _SECTIONS

# Headings an earlier summary may use for our sections (the default prompt's, Claude Code's, and
# the first extractive format's), lower case, without numbering or emphasis.
_ALIASES: dict[str, str] = {name.lower(): name for name in _SECTIONS} | {
    "task": _TASK,
    "primary request": _TASK,
    "key technical concepts": _CONCEPTS,
    "files and code sections": _FILES,
    "files and identifiers": _FILES,
    "errors": _ERRORS,
    "problem solving": _ERRORS,
    "user messages": _USERS,
    "pending": _PENDING,
    "next steps": _NEXT,
    "optional next step": _NEXT,
}

# When the budget forces dropping: (section, how many of its newest items may stay), in order.
# The task and the identifiers go last; the user messages are trimmed before the identifiers.
_DROP_ORDER = (
    (_CONCEPTS, 5),
    (_ERRORS, 3),
    (_USERS, 1),
    (_CONCEPTS, 0),
    (_ERRORS, 0),
    (_USERS, 0),
    (_PENDING, 1),
    (_FILES, 0),
    (_PENDING, 0),
)

_CLIP_STEPS = (400, 200, 100, 60, 40, 30, 24)
_SCRATCHPAD_START = re.compile(r"\s*<(?:analysis|summary)\b", re.IGNORECASE)
_SUMMARY_HEADER = re.compile(r"\A\s*\[Conversation summary #\d+\][^\n]*(?:\n|\Z)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)[\s#]*$")
_BOLD_HEADING = re.compile(r"^\s*\*\*(.+?)\*\*\s*:?\s*$")
_BULLET = re.compile(r"^\s*(?:[-*+\u2022]|\d+[.)])\s+(.*)$")
_DROPPED = re.compile(r"^\((\d+) older entr(?:y is|ies are) in the journal\)$")
_PENDING_CALL = re.compile(r"^tool call \S+ \(([^()\s]+)\) has no result yet")

# Identifiers, in the order they are looked for: each kind's matches are masked before the next
# kind looks, so `src/InvoiceParser.py` is one path, not a path and a class.
_EXTS = (
    "py|pyi|pyx|ipynb|js|mjs|cjs|ts|tsx|jsx|json|jsonl|ya?ml|toml|ini|cfg|conf|md|rst|txt|csv|tsv|xml|html?|"
    "css|scss|sass|less|vue|svelte|rs|go|java|kts?|scala|swift|c|h|cc|cpp|cxx|hpp|hh|cs|fs|rb|php|pl|pm|"
    "sh|bash|zsh|fish|ps1|bat|sql|graphql|proto|lua|jl|exs?|erl|hrl|hs|ml|elm|clj|dart|zig|nim|tf|hcl|"
    "lock|log|pdf|png|jpe?g|gif|svg|webp|zip|gz|tgz|tar|whl|gradle|sbt|cmake|mk|sqlite|parquet|pem|crt|"
    "patch|diff|env|gitignore|dockerignore|editorconfig"
)
_URL = re.compile(r"\bhttps?://[^\s<>()\[\]{}\"'`]+")
_PATH = re.compile(r"(?<![\w/.:@-])(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]*")
_FILE = re.compile(rf"(?<![\w/.-])\.?[\w+-]+(?:\.[\w+-]+)*\.(?:{_EXTS})(?![\w(])", re.IGNORECASE)
_NAMED_FILE = re.compile(r"\b(?:Makefile|Dockerfile|Containerfile|Justfile|Procfile|Gemfile|Rakefile|Vagrantfile)\b")
_TICKET = re.compile(r"(?<![\w-])[A-Z][A-Z0-9]{1,9}-\d+(?![\w-])")
_ISSUE_REF = re.compile(r"(?<![\w&#])#\d+\b")
_FUNC = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\((?!s\))")
_DOTTED = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*){2,}(?![\w(])")
_CAMEL = re.compile(
    r"(?<![\w.])(?:[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+"
    r"|[A-Z]{2,}[a-z]{2,}[a-z0-9]*(?:[A-Z][a-z0-9]*)*)(?!\w)"
)
_SNAKE = re.compile(r"(?<!\w)_{0,2}[A-Za-z][A-Za-z0-9]*(?:_+[A-Za-z0-9]+)+_{0,2}(?![\w(])")
_KEBAB = re.compile(r"(?<![\w.-])[a-z][a-z0-9]*(?:-[a-z0-9]+)+(?![\w-])")
_CAMEL_HINT = re.compile(r"[a-z0-9][A-Z]|[A-Z]{2}[a-z]")  # in every CamelCase name (each branch of `_CAMEL`)
# (kind, pattern, what every match of the pattern holds: a text without it is not searched;
# each pattern's search tries every position, and most text holds few of these characters)
_STRONG_KINDS: tuple[tuple[str, re.Pattern[str], str | re.Pattern[str]], ...] = (
    ("url", _URL, "://"),
    ("path", _PATH, "/"),
    ("file", _FILE, "."),
    ("file", _NAMED_FILE, "file"),
    ("ticket", _TICKET, "-"),
)
_ALL_KINDS = (
    *_STRONG_KINDS,
    ("ticket", _ISSUE_REF, "#"),
    ("func", _FUNC, "("),
    ("name", _DOTTED, "."),
    ("name", _CAMEL, _CAMEL_HINT),
    ("name", _SNAKE, "_"),
    ("kebab", _KEBAB, "-"),
)
_THREAD_CHARS = 200_000  # larger inputs are summarized in a worker thread
_PER_TOOL_MESSAGE = 8  # identifiers taken from one tool result or one call's arguments
_TOOL_WINDOW = (2_000, 1_000)  # the head and tail of a tool result that are looked at
_TEXT_WINDOW = (40_000, 10_000)  # the same for a user or assistant message (a pasted file)
_LETTER = re.compile(r"[A-Za-z]")
_DIGIT = re.compile(r"\d")
_TWO_LOWER = re.compile(r"[a-z]{2}")

# Key concepts: capitalized words and phrases (not a sentence's first word), quoted terms.
_CAP_WORD = r"[A-Z](?:[a-z]+|[A-Z0-9]+)(?![\w(]|[-_./'\u2019]\w)"
_CAP_PHRASE = re.compile(rf"(?<![\w./'\u2019-]){_CAP_WORD}(?: {_CAP_WORD})*")
_QUOTED = re.compile(
    r"`([^`\n]{2,60})`|\"([^\"\n]{2,60})\"|\u201c([^\u201d\n]{2,60})\u201d|(?<!\w)'([^'\n]{2,60})'(?!\w)"
)
_STOPWORD_TEXT = (
    "a an and also are as at be but by can could do done for from he her here hi his how i if in is it its "
    "let me my no not now of ok okay on or our please she so some sure that the then there these they this "
    "those to todo we what when where which who why will with would yes you your thanks thank note next "
    "first finally after before again great good fine all any each every just only still"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_MAX_CONCEPTS = 12

_ERROR_LINE = re.compile(r"Traceback|Error|Exception|\bfailed\b|\bFAILED\b|\berror(?:\[\w+\])?:|\bfatal:")
_ERROR_WORDS = ("Traceback", "Error", "Exception", "failed", "FAILED", "error", "fatal:")  # a quick test first
_FIX_WORDS = ("fix", "patch", "resolv", "solv", "correct", "repair", "works", "pass")
_NOT_ERROR = re.compile(r"(?i)\b(?:no|0|zero|without)\s+(?:errors?|failures?|exceptions?)\b")
_FIX = re.compile(
    r"(?i)\b(?:fix(?:ed|es|ing)?|patch(?:ed|es|ing)?|resolv(?:e|ed|es|ing)|solv(?:e|ed|es)|correct(?:ed|s)?"
    r"|repair(?:ed|s)?|works now|now works|pass(?:es|ed|ing)?)\b"
)
_PLAN = re.compile(r"(?i)\b(?:next,? I(?:'ll| will)|I(?:'ll| will) (?:now|next)|next step)\b")
_OPEN_ITEM = re.compile(r"^\s*(?:[-*]\s*\[ \]|TODO\b:?)\s*(.+)$")


def _clip(text: str, limit: int) -> str:
    """`text` on one line, at most `limit` UTF-8 bytes: its head and tail around `…` if longer."""
    return clip_line(text, limit)


def _dedupe(items: list[str]) -> list[str]:
    return [item for item in dict.fromkeys(items) if item]


def _dropped_line(count: int) -> str:
    return f"({count} older entry is in the journal)" if count == 1 else f"({count} older entries are in the journal)"


def _args_text(call: ToolCall) -> str:
    return orjson.dumps(dict(call.to_dict()["arguments"])).decode()


# -- reading an earlier summary -----------------------------------------------------------------


def _section_name(label: str) -> str:
    """Our section called `label` in an earlier summary, or "" when it is not one of ours."""
    key = re.sub(r"^\d+[.)]\s*|[*_`]", "", label).strip().rstrip(":").strip().lower()
    return _ALIASES.get(key, "")


def _parse_summary(text: str) -> tuple[dict[str, list[str]], dict[str, int]]:
    """An earlier summary's sections, `## ` heading by heading: our section name -> its items,
    and the counts of entries it had already left in the journal. Items are `- ` lines (other
    list markers and plain lines are taken too, indented lines continue the item before them;
    parenthesized notes such as `(none)` are not items). Items of sections that are not ours go
    to the key concepts under their heading's name, and a summary with no headings at all is
    kept whole there, so nothing an earlier summary said is lost."""
    text = _SUMMARY_HEADER.sub("", text, count=1)
    if _SCRATCHPAD_START.match(text):  # a model's raw answer, scratchpad and all
        text = strip_scratchpad(text)
    sections: dict[str, list[str]] = {}
    dropped: dict[str, int] = {}
    target: list[str] | None = None
    name, prefix, level = "", "", 0
    free: list[str] = []
    headed = fence = False
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = not fence
            continue
        heading = None if fence else _HEADING.match(line)
        bold = None if fence or heading else _BOLD_HEADING.match(line)
        if heading is not None:
            label, depth = heading.group(2), len(heading.group(1))
        elif bold is not None and _section_name(bold.group(1)):
            label, depth = bold.group(1), 2
        else:
            label, depth = "", 0
        if depth:
            found = _section_name(label)
            headed = True
            if found:
                name, prefix, level = found, "", depth
                target = sections.setdefault(found, [])
            elif target is not None and name and depth > level:
                target.append(prefix + stripped.lstrip("#* ").rstrip("*: "))  # a sub-heading: an item
            else:
                label = re.sub(r"[*_`]", "", label).strip().rstrip(":")
                name, prefix, level = "", f"{label}: ", depth
                target = sections.setdefault(_CONCEPTS, [])
            continue
        if not stripped:
            continue
        if target is None:
            free.append(stripped)
            continue
        count = _DROPPED.match(stripped)
        if count is not None:
            if name:
                dropped[name] = dropped.get(name, 0) + int(count.group(1))
            continue
        if stripped.startswith("(") and stripped.endswith(")"):
            continue
        bullet = None if fence else _BULLET.match(line)
        if bullet is not None:
            target.append(prefix + bullet.group(1).strip())
        elif (fence or line[:1].isspace()) and target and (not prefix or target[-1].startswith(prefix)):
            target[-1] = f"{target[-1]} {stripped}"
        else:
            target.append(prefix + stripped)
    if not headed and free:
        sections.setdefault(_CONCEPTS, []).append("earlier summary: " + " ".join(free))
    return sections, dropped


# -- reading the messages -----------------------------------------------------------------------


def _mask(text: str, spans: list[tuple[int, int]]) -> str:
    parts: list[str] = []
    last = 0
    for start, end in spans:
        parts.append(text[last:start])
        parts.append(" " * (end - start))
        last = end
    parts.append(text[last:])
    return "".join(parts)


def _accept(kind: str, match: re.Match[str]) -> str | None:
    raw = match.group(1) if kind == "func" else match.group(0)
    if kind == "url":
        return raw.rstrip(".,;:!?")
    if kind == "path":
        path = raw.rstrip(".,;:")
        last = path.rstrip("/").rsplit("/", 1)[-1]
        first = path.lstrip("~./").split("/", 1)[0]
        if not _LETTER.search(path):
            return None
        if (
            _FILE.fullmatch(last)
            or path.startswith(("/", "./", "../", "~/"))
            or path.count("/") >= 2
            or path.endswith("/")
            or ("." in first.strip(".") and "/" in path)
        ):
            return path
        return None
    if kind == "file":
        return raw if _LETTER.search(raw.rsplit(".", 1)[0]) else None
    if kind == "func":
        return raw + "()"
    if kind == "kebab":
        return raw if _DIGIT.search(raw) and _TWO_LOWER.search(raw) else None
    return raw


def _identifiers(text: str, *, strong: bool) -> list[str]:
    """Identifiers in `text`, in the order they appear (repeats included): paths, file names,
    URLs, ticket ids; unless `strong`, also `name()` calls, CamelCase, snake_case and dotted
    names, issue references and kebab-case ids with a digit."""
    found: list[tuple[int, str]] = []
    for kind, pattern, hint in _STRONG_KINDS if strong else _ALL_KINDS:
        if (hint not in text) if isinstance(hint, str) else (hint.search(text) is None):
            continue
        spans: list[tuple[int, int]] = []
        for match in pattern.finditer(text):
            key = _accept(kind, match)
            if key:
                found.append((match.start(), key))
                spans.append(match.span())
        if spans:
            text = _mask(text, spans)
    found.sort(key=lambda pair: pair[0])
    return [key for _, key in found]


def _sentence_start(text: str, index: int) -> bool:
    i = index - 1
    while i >= 0 and text[i] in " \t":
        i -= 1
    return i < 0 or text[i] in ".!?:;\n-*>#|()[]\"'`\u201c"


def _capitalized_terms(text: str) -> list[str]:
    terms: list[str] = []
    for match in _CAP_PHRASE.finditer(text):
        words = match.group(0).split(" ")
        if _sentence_start(text, match.start()) and words[0][1:].islower():
            words = words[1:]
        while words and words[0].lower() in _STOPWORDS:
            words = words[1:]
        while words and words[-1].lower() in _STOPWORDS:
            words = words[:-1]
        if words:
            terms.append(" ".join(words))
    return terms


def _concepts(texts: list[str], idents: list[list[str]]) -> list[str]:
    """Recurring capitalized terms and identifiers, and quoted terms, most frequent first
    (ties: first seen first)."""
    counts: dict[str, int] = {}
    quoted: set[str] = set()

    def note(term: str, weight: int = 1) -> None:
        counts[term] = counts.get(term, 0) + weight

    for text, found in zip(texts, idents, strict=True):
        mentioned = set(found)
        for match in _QUOTED.finditer(text):
            term = " ".join(next(g for g in match.groups() if g is not None).split())
            if term and len(term.split()) <= 6 and any(ch.isalnum() for ch in term):
                quoted.add(term)
                note(term, 0 if term in mentioned else 1)
        for term in _capitalized_terms(text):
            note(term)
        for key in found:
            note(key)
    ranked = [t for t in counts if counts[t] >= 2 or t in quoted]
    order = {t: i for i, t in enumerate(counts)}
    ranked.sort(key=lambda t: (-counts[t], order[t]))
    return ranked[:_MAX_CONCEPTS]


def _label(m: Message, names: dict[str, str]) -> str:
    if m.role == "tool":
        name = names.get(m.tool_call_id or "")
        return f"{name} ({m.tool_call_id})" if name else f"tool result {m.tool_call_id}"
    return m.role


def _window(text: str, window: tuple[int, int]) -> str:
    """The head and tail of a long `text` (what is looked at for identifiers and errors)."""
    head, tail = window
    return text if len(text) <= head + tail else f"{text[:head]}\n{text[len(text) - tail :]}"


def _error_text(m: Message) -> str | None:
    """The error lines of `m` (the first and the last), or None when it reports no error."""
    if m.role not in ("tool", "user"):
        return None
    text = _window(m.text, _TEXT_WINDOW)
    lines: list[str] = []
    if any(word in text for word in _ERROR_WORDS) and _ERROR_LINE.search(text):
        lines = [ln.strip() for ln in text.splitlines() if _ERROR_LINE.search(ln) and not _NOT_ERROR.search(ln)]
    if not lines:
        if not (m.role == "tool" and m.is_error):
            return None
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()][:1] or ["(no message)"]
    chosen = lines if len(lines) <= 2 else [lines[0], lines[-1]]
    return " … ".join(dict.fromkeys(chosen))


def _fix_text(m: Message, error: str | None) -> str | None:
    """The line of `m` that mentions a fix, or None (`error`: what `_error_text` says of `m`)."""
    if m.role == "system" or (m.role == "tool" and m.is_error) or error is not None:
        return None
    text = _window(m.text, _TEXT_WINDOW)
    lower = text.lower()
    if not any(word in lower for word in _FIX_WORDS) or not _FIX.search(text):
        return None
    for line in text.splitlines():
        if _FIX.search(line):
            return line.strip()
    return None


# -- the summarizer -----------------------------------------------------------------------------

_READ_MESSAGES = 400  # the newest messages read, at most ...
_READ_FACTOR = 8  # ... and only until their text is this many times the output budget (characters)


class ExtractiveSummarizer:
    """Offline, deterministic summarizer: no model, no network. It writes every section of the
    default structured prompt, under the same headings and in the same order, from the messages
    themselves: the task (the first user message), key concepts (recurring capitalized terms and
    identifiers, quoted terms), files and code (every path, file, URL, ticket id and code name
    mentioned, with the tools that touched it), errors and what fixed them, the user messages,
    pending requests and tool calls, the last assistant text and the next step. Pending tasks
    and the next step refer to the latest user messages (quoted once, under "All user
    messages") rather than repeat them.

    Its cost is bounded, whatever the history's length: the output stays within `max_chars`,
    so only what can reach it is read: earlier summaries at the start, the first user message
    (the task), and the newest messages (at most 400, and only until their text is eight times
    `max_chars`). Everything older is in the journal, as the summary's header says.

    An earlier summary among the messages is folded in section by section, its items before the
    new ones, so nothing it said is lost. Past `max_chars`, the oldest items of the long
    sections are dropped first (key concepts, errors, then user messages, and only then
    identifiers), each section saying how many of its entries are left to the journal; the task
    is never dropped."""

    name = "extractive"

    def __init__(self, max_chars: int = 6_000) -> None:
        self.max_chars = integer(max_chars, "max_chars", minimum=500)

    async def __call__(self, messages: Sequence[Message], instruction: str) -> str:
        reading = _read(messages, self.max_chars)
        if reading.size > _THREAD_CHARS:  # keep the event loop responsive
            return await trio.to_thread.run_sync(self._summarize, reading)
        return self._summarize(reading)

    async def complete(self, request: ModelRequest) -> Message:
        """Provider form: summarizes the request's messages (a transcript written by
        `render_transcript` is read back into its messages)."""
        messages = [m for m in request.messages if m.role != "system"]
        if len(messages) == 1 and messages[0].role == "user" and not messages[0].is_summary:
            messages = parse_transcript(messages[0].text) or messages
        text = await self(messages, "")
        usage = TokenUsage(
            input_tokens=sum(estimate_message_tokens(m) for m in request.messages),
            output_tokens=estimate_text_tokens(text),
        )
        return Message.assistant(text, usage=usage)

    def summarize(self, messages: Sequence[Message]) -> str:
        """The summary of `messages`, synchronously."""
        return self._summarize(_read(messages, self.max_chars))

    def _summarize(self, r: _Reading) -> str:
        caps = _caps(self.max_chars)
        said = [_identifiers(_window(m.text, _TEXT_WINDOW), strong=False) for m in r.spoken]
        sections = {
            _TASK: _task(r),
            _CONCEPTS: r.prior[_CONCEPTS] + _concepts([m.text for m in r.spoken], said),
            _FILES: _files(r, said),
            _ERRORS: _errors(r, caps[_ERRORS]),
            _USERS: r.prior[_USERS] + [m.text for _, m in r.users],
            _PENDING: _pending(r),
            _CURRENT: _current(r),
            _NEXT: _next_step(r),
        }
        for name in _SECTIONS:
            sections[name] = _dedupe([_clip(item, caps[name]) for item in sections[name]])
        return _fit(sections, r.dropped, self.max_chars)


@attrs.frozen
class _Reading:
    """What the sections read, gathered once: the earlier summaries' sections, the messages
    read (`real`: the newest non-summary, non-system ones), and indexes over them."""

    prior: dict[str, list[str]]
    dropped: dict[str, int]
    real: list[Message]
    task: Message | None  # the first user message, even when it is older than `real`
    size: int  # characters of text in `real`

    @functools.cached_property
    def spoken(self) -> list[Message]:
        """The user and assistant messages (where identifiers and concepts are looked for)."""
        return [m for m in self.real if m.role in ("user", "assistant")]

    @functools.cached_property
    def names(self) -> dict[str, str]:
        return {c.id: c.name for m in self.real for c in m.tool_calls}

    @functools.cached_property
    def results(self) -> dict[str, Message]:
        return {m.tool_call_id: m for m in self.real if m.role == "tool" and m.tool_call_id}

    @functools.cached_property
    def users(self) -> list[tuple[int, Message]]:
        return [(i, m) for i, m in enumerate(self.real) if m.role == "user" and m.text.strip()]

    @functools.cached_property
    def last_reply(self) -> int:
        """The index in `real` of the last assistant message with text, or -1."""
        return next(
            (
                i
                for i in range(len(self.real) - 1, -1, -1)
                if self.real[i].role == "assistant" and self.real[i].text.strip()
            ),
            -1,
        )

    @functools.cached_property
    def unanswered(self) -> list[Message]:
        """The user messages after the last assistant reply."""
        return [m for i, m in self.users if i > self.last_reply]

    @functools.cached_property
    def waiting(self) -> list[ToolCall]:
        """The tool calls with no result among the messages read."""
        return [c for m in self.real for c in m.tool_calls if c.id not in self.results]


def _read(messages: Sequence[Message], max_chars: int) -> _Reading:
    """The part of `messages` the summary can use (see `ExtractiveSummarizer`): the earlier
    summaries that lead them, the first user message, and the newest messages within bounds."""
    prior: dict[str, list[str]] = {name: [] for name in _SECTIONS}
    dropped: dict[str, int] = {}

    def fold(summary: Message) -> None:
        sections, counts = _parse_summary(summary.text)
        for name, items in sections.items():
            prior[name].extend(items)
        for name, count in counts.items():
            dropped[name] = dropped.get(name, 0) + count

    start = 0
    while start < len(messages) and (messages[start].is_summary or messages[start].role == "system"):
        if messages[start].is_summary:
            fold(messages[start])
        start += 1
    budget, size, first = _READ_FACTOR * max_chars, 0, len(messages)
    while first > start and len(messages) - first < _READ_MESSAGES and size < budget:
        first -= 1
        size += len(messages[first].text)
    real: list[Message] = []
    for m in messages[first:]:
        if m.is_summary:  # a summary among the newest messages is folded too
            fold(m)
        elif m.role != "system":
            real.append(m)
    task = next((m for m in real if m.role == "user" and m.text.strip()), None)
    if first > start and not prior[_TASK]:  # the task may be older than the messages read
        task = next((m for m in messages[start:first] if m.role == "user" and m.text.strip()), task)
    return _Reading(prior, dropped, real, task, size)


def _caps(max_chars: int) -> dict[str, int]:
    """The longest an item of each section may be, in characters."""
    m = max_chars
    return {
        _TASK: max(120, min(2_000, m // 5)),
        _CONCEPTS: 80,
        _FILES: 200,
        _ERRORS: max(100, min(400, m // 20)),
        _USERS: max(80, min(600, m // 12)),
        _PENDING: max(80, min(400, m // 20)),
        _CURRENT: max(100, min(1_000, m // 8)),
        _NEXT: max(80, min(500, m // 12)),
    }


# -- the sections, one function each ------------------------------------------------------------


def _task(r: _Reading) -> list[str]:
    """The task: an earlier summary's, else the first user message."""
    return r.prior[_TASK] or ([r.task.text] if r.task is not None else [])


def _files(r: _Reading, said: list[list[str]]) -> list[str]:
    """Identifiers: everything said by the user or the assistant; from tool calls and tool
    results only paths, files, URLs and tickets, a few per message (they can be long); each
    with the tools that touched it."""
    files: dict[str, list[str]] = {}
    for item in r.prior[_FILES]:
        key, _, used_by = item.partition(" \u2014 ")
        files.setdefault(key, []).extend(t for t in used_by.split(", ") if t)
    spoken = iter(said)
    for m in r.real:
        if m.role in ("user", "assistant"):
            for key in next(spoken):
                files.setdefault(key, [])
        if m.role == "tool":
            tool_text = _window(m.text, _TOOL_WINDOW)
            for key in list(dict.fromkeys(_identifiers(tool_text, strong=True)))[:_PER_TOOL_MESSAGE]:
                files.setdefault(key, [])
        for c in m.tool_calls:
            args_text = _window(_args_text(c), _TOOL_WINDOW)
            for key in list(dict.fromkeys(_identifiers(args_text, strong=True)))[:_PER_TOOL_MESSAGE]:
                users_of = files.setdefault(key, [])
                if c.name not in users_of:
                    users_of.append(c.name)
    return [f"{key} \u2014 {', '.join(dict.fromkeys(used))}" if used else key for key, used in files.items()]


def _errors(r: _Reading, cap: int) -> list[str]:
    """Errors, each with the first later message that mentions a fix."""
    real = r.real
    found = [_error_text(m) for m in real]
    fixes = [_fix_text(m, e) for m, e in zip(real, found, strict=True)]
    fix_after: list[int] = [-1] * len(real)
    following = -1
    for i in range(len(real) - 1, -1, -1):
        fix_after[i] = following
        if fixes[i] is not None:
            following = i
    errors: list[str] = []
    for i, (m, error) in enumerate(zip(real, found, strict=True)):
        if error is None:
            continue
        item = f"{_label(m, r.names)}: {_clip(error, cap * 3 // 5)}"
        if fix_after[i] >= 0:
            j = fix_after[i]
            item += f" -> fix ({_label(real[j], r.names)}): {_clip(fixes[j] or '', cap * 2 // 5)}"
        errors.append(item)
    return r.prior[_ERRORS] + errors


def _pending(r: _Reading) -> list[str]:
    """Earlier pending items not settled since, the user messages after the last assistant
    reply (referred to, not repeated), tool calls with no result, open items of the last reply."""
    pending: list[str] = []
    for item in r.prior[_PENDING]:
        call = _PENDING_CALL.match(item)
        if call is not None and call.group(1) in r.results:
            continue
        if call is None and r.last_reply >= 0 and item.startswith(_SETTLED_BY_A_REPLY):
            continue
        pending.append(item)
    if r.unanswered:
        pending.append(_UNANSWERED + _latest_users(len(r.unanswered)))
    for c in r.waiting:
        pending.append(f"tool call {c.name} ({c.id}) has no result yet: {_args_text(c)}")
    if r.last_reply >= 0:
        for line in r.real[r.last_reply].text.splitlines():
            open_item = _OPEN_ITEM.match(line)
            if open_item is not None:
                pending.append(f"open item: {open_item.group(1)}")
    return pending


def _current(r: _Reading) -> list[str]:
    """The last assistant text and the tool calls made since (else the earlier summary's)."""
    last = r.last_reply
    current = [r.real[last].text] if last >= 0 else list(r.prior[_CURRENT])
    recent = [c for m in r.real[max(last, 0) :] for c in m.tool_calls][-3:]
    for c in recent:
        result = r.results.get(c.id)
        if result is None:
            outcome = "(no result yet)"
        else:
            outcome = ("error: " if result.is_error else "") + _clip(result.text, 100)
        current.append(f"tool call {c.name}({_clip(_args_text(c), 100)}) -> {outcome}")
    return current


def _next_step(r: _Reading) -> list[str]:
    """In line with the latest user message (referred to, not repeated) and what is pending."""
    latest = _latest_users(1) if r.users else ""
    reply_lines = r.real[r.last_reply].text.splitlines() if r.last_reply >= 0 else []
    plan = next((ln for ln in reply_lines if _PLAN.search(ln)), "")
    step = ""
    if r.waiting:
        step = "Wait for the result of " + ", ".join(f"{c.name} ({c.id})" for c in r.waiting)
        step += f", then continue with {latest}" if latest else ", then continue."
    elif r.unanswered:
        step = f"Answer {latest}"
    elif plan:
        step = f"Continue as planned: {plan.strip()}"
    elif latest:
        step = f"Continue in line with {latest}"
    return [step] if step else list(r.prior[_NEXT])


_UNANSWERED = "unanswered: "
_SETTLED_BY_A_REPLY = (_UNANSWERED, "user request: ", "open item: ")  # "user request: " is the older form


def _latest_users(n: int) -> str:
    """A reference to the newest `n` user messages, which the summary quotes once."""
    which = "the latest user message" if n == 1 else f"the latest {n} user messages"
    return f"{which} (quoted under {_USERS})"


# -- laying the sections out within the budget ------------------------------------------------


def _fit(sections: dict[str, list[str]], dropped: dict[str, int], max_chars: int) -> str:
    layout = _Layout(sections, dropped, max_chars)
    for name, floor in _DROP_ORDER:
        layout.drop_oldest(name, floor)
    # Every list is empty by now: the last assistant text alone, shorter items, the task last.
    layout.keep_first(_CURRENT)
    for cap in _CLIP_STEPS:
        for name in (_CURRENT, _NEXT):
            layout.clip(name, cap)
    for cap in _CLIP_STEPS:
        layout.clip(_TASK, cap)
    layout.keep_first(_TASK)
    text = layout.render()
    if len(text.encode()) > max_chars:  # a last resort (CJK: bytes > characters): whole lines
        text = clip(text, max_chars, keep="head", marker="").rsplit("\n", 1)[0]
    return text


class _Layout:
    """The sections being fitted into `limit` UTF-8 bytes; `total` is always the length of
    `render()`, kept up to date in O(1) per dropped item."""

    def __init__(self, sections: dict[str, list[str]], dropped: dict[str, int], limit: int) -> None:
        self.items = {n: list(sections.get(n, ())) for n in _SECTIONS}
        self.start = dict.fromkeys(_SECTIONS, 0)
        self.dropped = {n: dropped.get(n, 0) for n in _SECTIONS}
        self.sizes = {n: sum(utf8_len(i) for i in self.items[n]) for n in _SECTIONS}
        self.limit = limit
        self.total = sum(self._block(n) for n in _SECTIONS) + 2 * (len(_SECTIONS) - 1)

    def _kept(self, name: str) -> int:
        return len(self.items[name]) - self.start[name]

    def _block(self, name: str) -> int:
        size = 3 + len(name)
        if self.dropped[name]:
            size += 1 + len(_dropped_line(self.dropped[name]))
        kept = self._kept(name)
        if kept:
            size += self.sizes[name] + 3 * kept
        elif not self.dropped[name]:
            size += len("\n(none)")
        return size

    def drop_oldest(self, name: str, floor: int) -> None:
        while self.total > self.limit and self._kept(name) > floor:
            before = self._block(name)
            self.sizes[name] -= utf8_len(self.items[name][self.start[name]])
            self.start[name] += 1
            self.dropped[name] += 1
            self.total += self._block(name) - before

    def clip(self, name: str, cap: int) -> None:
        if self.total <= self.limit:
            return
        before = self._block(name)
        self.items[name] = [_clip(i, cap) for i in self.items[name][self.start[name] :]]
        self.start[name] = 0
        self.sizes[name] = sum(utf8_len(i) for i in self.items[name])
        self.total += self._block(name) - before

    def keep_first(self, name: str) -> None:
        """Only the section's first item: for the single-valued sections, past every other measure."""
        if self.total <= self.limit or self._kept(name) <= 1:
            return
        before = self._block(name)
        self.items[name] = self.items[name][self.start[name] : self.start[name] + 1]
        self.start[name] = 0
        self.sizes[name] = utf8_len(self.items[name][0])
        self.total += self._block(name) - before

    def render(self) -> str:
        blocks: list[str] = []
        for name in _SECTIONS:
            lines = [f"## {name}"]
            if self.dropped[name]:
                lines.append(_dropped_line(self.dropped[name]))
            lines.extend(f"- {item}" for item in self.items[name][self.start[name] :])
            if len(lines) == 1:
                lines.append("(none)")
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)
