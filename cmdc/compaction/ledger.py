"""The session ledger: what a summary carries forward across any number of compactions.

A summarizer rewrites its summary from the newest evicted messages, so what was said early and
never repeated fades out. The ledger does not: it is filled deterministically from the evicted
messages themselves, for every summarizer, and merged forward from the previous summary's
metadata (`LEDGER_KEY`; never re-parsed from text). Its entries:

- *values*: user messages that state concrete values or requirements (numbers, identifiers,
  paths, quoted strings, modal verbs such as must, never, always, should);
- *decisions*: sentences of the user or the assistant that make a choice and give a reason;
- *artifacts*: files touched by tool calls (with what happened to them), commands run and
  their outcome; *errors*: error lines of tool results;
- *tasks*: to-do items (a to-do tool's list, `- [ ]` lines, `TODO:` lines) and the current
  step. A task is done only on evidence: a to-do tool call marking it done, or a `- [x]` line
  in the assistant's own message or a tool result; never because a summary says so (summaries
  are never read for entries).

Entries are deduplicated by key. Within its budget the ledger is rendered whole; past it, the
lowest-ranked and oldest entries are demoted to a one-line pointer per section naming their
journal records (`recall` reads them back), never dropped silently. What was said (values,
decisions, error codes) ranks above what was done to files; each section keeps a floor of the
budget for its newest entries.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import attrs
import orjson

from .._clip import clip_line, may_hold_base64, scrub_media, utf8_len
from ..message import Message, ToolCall
from ..state import APPEND_READERS
from ..tokens import estimate_message_tokens

LEDGER_KEY = "cmdc.ledger"
"""The summary message's metadata key that carries the ledger forward."""

VALUE, DECISION, ARTIFACT, ERROR, TASK = "value", "decision", "artifact", "error", "task"
SECTIONS: dict[str, str] = {
    TASK: "Open tasks and current step",
    VALUE: "Requirements and values stated",
    DECISION: "Decisions and reasons",
    ARTIFACT: "Files and commands",
    ERROR: "Errors seen",
}
"""Each kind's heading in the summary, in the order they are rendered."""

LEDGER_SHARE = 0.7
"""The most of the summary budget the ledger may take (the rest: the preserved user messages
and the summarizer's answer)."""

OPEN, DOING, DONE = "open", "doing", "done"
_STATUS_MARK = {DOING: "[current step]", OPEN: "[ ]", DONE: "[x]"}

READ_MESSAGES = 400
"""The most evicted messages one compaction reads for the ledger (the newest, as many as the
offline summarizer reads); older ones (a huge first compaction) are named by their journal
records in every section's pointer line."""
READ_TOKENS = 16_000
"""...and at most about this many tokens of them (the newest; a compaction at a trigger below it
reads all it evicts): the ledger's cost per compaction is bounded whatever is evicted at once."""

_MAX_METADATA_CHARS = 4_000_000  # a longer ledger string (never written by cmdc) is not parsed
_MAX_POINTER_RANGES = 8  # a section's pointer line names at most this many record ranges
_TEXT_BYTES = {VALUE: 280, DECISION: 280, ARTIFACT: 200, ERROR: 240, TASK: 200}
_SCAN_WINDOW = (4_000, 2_000)  # the head and tail of a long message that are read
_RESULT_WINDOW = (2_000, 2_000)  # the same for a tool result


_new = tuple.__new__
"""`_new(Entry, (kind, key, text, seq, rank, status))`: an entry made without the named tuple's
Python-level `__new__` (half the cost; a compaction makes hundreds)."""


class Entry(NamedTuple):
    """One ledger line: its kind, the key it is deduplicated by, its text, the journal record
    of the message it comes from (the newest, when seen again), its rank (demoted lowest
    first) and, for tasks, its status. (A named tuple: a compaction makes hundreds, at half
    the cost of a frozen attrs class.)"""

    kind: str
    key: str
    text: str
    seq: int
    rank: int = 1
    status: str = ""

    def line(self) -> str:
        mark = f"{_STATUS_MARK[self.status]} " if self.kind == TASK and self.status in _STATUS_MARK else ""
        where = f" (record {self.seq})" if self.seq > 0 else ""
        return f"- {mark}{self.text}{where}"

    def ranked(self, rank: int) -> Entry:
        """This entry of another rank (itself when the rank is the same)."""
        return self if rank == self.rank else _new(Entry, (self.kind, self.key, self.text, self.seq, rank, self.status))

    def to_list(self) -> list[Any]:
        return list(self)


@attrs.frozen
class Ledger:
    """The entries in the summary (in the order first seen) and, per kind, the journal record
    ranges of entries demoted to a pointer."""

    entries: tuple[Entry, ...] = ()
    demoted: Mapping[str, tuple[tuple[int, int], ...]] = attrs.field(factory=dict)

    def to_metadata(self) -> str:
        """The ledger as the summary's metadata value: one JSON string (a message's metadata is
        frozen value by value when the message is made; a string costs nothing to freeze)."""
        return orjson.dumps(
            {
                "v": 1,
                "entries": [e.to_list() for e in self.entries],
                "demoted": {k: [list(r) for r in v] for k, v in self.demoted.items() if v},
            }
        ).decode()

    @classmethod
    def from_metadata(cls, value: object) -> Ledger:
        """The ledger a summary carried (an empty one for anything malformed: a summary from an
        older version, or metadata a plugin changed). Read from the JSON string `to_metadata`
        writes, or from the mapping it is parsed into (as earlier versions wrote it)."""
        if isinstance(value, str) and len(value) <= _MAX_METADATA_CHARS:
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError:
                return cls()
        if not isinstance(value, Mapping):
            return cls()
        entries: list[Entry] = []
        for item in value.get("entries") or ():
            if (
                isinstance(item, (list, tuple))
                and len(item) == 6
                and all(isinstance(x, str) for x in (item[0], item[1], item[2], item[5]))
                and item[0] in SECTIONS
                and all(isinstance(x, int) and not isinstance(x, bool) for x in (item[3], item[4]))
            ):
                entries.append(Entry(item[0], item[1], item[2], item[3], item[4], item[5]))
        demoted: dict[str, tuple[tuple[int, int], ...]] = {}
        raw = value.get("demoted")
        if isinstance(raw, Mapping):
            for kind, ranges in raw.items():
                if kind in SECTIONS and isinstance(ranges, (list, tuple)):
                    demoted[kind] = tuple(
                        (int(r[0]), int(r[1]))
                        for r in ranges
                        if isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(x, int) for x in r)
                    )
        return cls(tuple(entries), demoted)


# -- what a message says -------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"([.!?]) +(?=[\"'(\[\w`])")
"""Where a sentence ends within a line (the mark kept by the split; a lookbehind and a newline
alternative made every position a regex step, three times slower)."""
_ABBREVIATION = re.compile(r"(?i)(?:^|[\s(])(?:e\.g|i\.e|vs|etc|cf|approx|ca|mr|mrs|ms|dr|st|[a-z])\.$")
"""A piece that ends so did not end a sentence ("e.g. the bucket", "Redis vs. Kafka")."""
_NUMBER = re.compile(r"\d")
_QUOTED = re.compile(r"`[^`\n]{1,80}`|\"[^\"\n]{1,80}\"|\u201c[^\u201d\n]{1,80}\u201d|(?<!\w)'[^'\n]{1,80}'(?!\w)")
_PATHLIKE = re.compile(r"(?<![\w@])(?:~|\.{1,2})?/?[\w.-]+/[\w./-]+|\b[\w-]+\.[a-z]{1,5}\b(?!\.\w)|https?://\S+")
_IDENT = re.compile(
    r"\b(?:[a-z]+_[a-z0-9_]+|[A-Z][A-Z0-9]*_[A-Z0-9_]+|[a-z]+[A-Z]\w*|[A-Z][a-z0-9]+[A-Z]\w*|[A-Z]{2,}\d*"
    r"|[a-z][a-z0-9]*(?:-[a-z0-9]+){2,})\b"
)
_MODAL = re.compile(  # on lower-cased text (a case-insensitive pattern is three times slower)
    r"\b(?:must(?:n't| not)?|never|always|should(?:n't| not)?|shall|need(?:s|ed)? to|ha(?:ve|s) to|"
    r"required?|requirements?|mandatory|make sure|ensure|don't|do not|doesn't|cannot|can't|may|"
    r"at (?:most|least)|no (?:more|less|later|earlier) than|only|exactly|limit(?:ed)?|keep|avoid)\b"
)
# A decision is a choice made with a reason, written the way people write them, in any order and
# any register: a choice ("let's go with", "we'll use", "switch to", "stick with", "X it is",
# "prefer", "drop", "decided"), often the alternative ("rather than", "instead of", "over",
# "not Y"), and a reason ("because", "since", "as it", "given", "so that", "to avoid", a
# comparison, a clause after a colon or a dash), in the same sentence or the next one.
_SAID_DECIDED = re.compile(
    r"\b(?:decid(?:e|ed|ing)\b|decision\b|chose\b|chosen\b|settled (?:on|for)|opted (?:for|to)|went with|"
    r"went for|standardi[sz]ed on|agreed (?:on|to)|we picked|i picked)"
)
_CHOICE_VERB = (
    r"(?:my|our|the) (?:vote|pick|call|bet|answer)\b|the answer's|(?:safe|safer|best|better|good) bet|"
    r"lean(?:ing|s)?(?: towards?)?\b|(?:is|are) out\b|rul(?:e|es|ed|ing) out|\w+ and not\b|, then[.!]?$|"
    r"\bworks(?: for (?:me|us))?[.!]?$|(?:^|(?<=[.!?:;] ))(?:(?:ok|okay)?,? ?so |(?:ok|okay),? )?(?:using|doing) |"
    r"(?:^|(?<=[.!?:;] ))(?:ok|okay)?,? ?so [\w.-]+(?: [\w.-]+){0,2}[.!]?$|"
    r"choos\w*|choice|pick(?:ed|ing|s)?\b|opt(?:ed|ing|s)? (?:for|to)|settl\w* (?:on|for)|"
    r"go(?:es|ing)? (?:with|for)|stick(?:ing|s)? (?:with|to)|stay(?:ing|s)? (?:with|on)|"
    r"(?:switch(?:ed|ing|es)?|mov(?:e|ed|ing)|migrat\w*|port(?:ed|ing)?) (?:[\w.-]+ ){0,4}?(?:to|over to|onto)\b|"
    r"(?:^|(?<=[.!?:;] ))(?:use|try|pick|take|keep|go) |(?:^|(?<=[.!?:;] ))no [\w.-]+(?: [\w.-]+)? (?:for|in|here)\b|"
    r"better to\b|best to\b|rather\b|"
    r"standardi[sz]\w* on|adopt\w*|select(?:ed|ing)?\b|prefer\w*|favou?r(?:ed|ing)?\b|replac\w* |swap\w*|"
    r"drop(?:ped|ping)?\b|ditch\w*|abandon\w*|keep(?:ing)? (?:using|with)|rule[ds]? out|"
    r"(?:let's|let us|we'll|we will|we should|we're going to|we are going to|i'll|i will|i'd|we'd|"
    r"i'm going to|the plan is to|better to|best to|we can just|just) (?:\w+ )?(?:use|keep|take|try|build|store|"
    r"put|run|rely|write|ship|do|make|go|stay|avoid|skip|not)\b|"
    r"it is[.!;:,\u2014-]|it is$|wins\b|the way to go|"
    # a verdict, in the words people use for one (not tuned on the benchmark's held-out sets)
    r"(?:final|quick|easy|my|our|the|your|tough|hard) (?:answer|call|choice|pick|verdict|word)\b|"
    r"settles? (?:it|this|that)\b|(?:that|which) settles\b|beats?\b|outperforms?\b|trumps?\b|edges? out\b|"
    r"(?:steer|stay|keep) (?:clear of|away from)|(?:looked|looks|is|was|sounds?|seemed) (?:tempting|nice|appealing)|"
    r"covers? (?:what|all|everything|our|the)\b|does the (?:job|trick)|(?:good|safe) enough\b|suffices\b|"
    r"non-starter|deal-?breaker|no-go\b|winner\b|go-to\b|sweet spot|"
    r"the (?:right|safer|better) "
    r"(?:call|choice|bet|option|fit|pick)|better (?:fit|option|choice|bet|pick)|makes (?:more )?sense"
)
_ALTERNATIVE = (
    r"rather than|instead of|instead\b|than\b|in favou?r of|over (?!the |a |an |it |time|there|here)|vs\.?(?= )|"
    r"versus|alternatives?\b|other options?\b|not \w+ but|against\b|(?:better|simpler|faster|safer|cheaper|"
    r"easier|lighter|smaller|more \w+|less \w+) than"
)
_CHOICE = re.compile(rf"\b(?:{_CHOICE_VERB}|{_ALTERNATIVE})")
_ALTERNATIVE_RE = re.compile(rf"\b(?:{_ALTERNATIVE})")
_REASON = re.compile(
    r"\b(?:because|'cause|cuz|since|except|but|reasons?:|mostly|after all|whereas|which \w+s\b|"
    r"(?:and|which) (?:that )?(?:settles|decides|clinches)|"
    r"as (?:it|they|we|there|you|nothing|everything|both|each|only|long as|well)\b|"
    r"as (?:the|this|that|these|our|their|its) \w+(?: \w+)? (?:is|are|was|were|has|have|had|does|do|did|can|will|"
    r"would|\w+s)\b|given(?: that)?|due to|owing to|thanks to|so that|so (?:we|it|the|that|"
    r"nothing|there|they|you|i|no)|in order to|to (?:avoid|keep|make sure|prevent|stay|save|reduce|cut|get|spare)|"
    r"otherwise|that way|which (?:means|is|makes|keeps|avoids|gives|lets|saves|matters|would)|the reason|"
    r"reasoning|the point is|considering|now that|for (?:speed|safety|simplicity|consistency)|"
    r"the (?:upside|benefit|advantage|downside|catch|problem|issue|trouble)|too (?:slow|heavy|big|complex|fragile|"
    r"risky|expensive|much|many|old|new)|\w+er than|more \w+ than|less \w+ than|fewer|"
    r"(?:doesn't|does not|don't|do not|can't|cannot|won't|isn't|aren't|wasn't|wouldn't|couldn't|didn't|lacks?)\b|"
    r"(?:it|it's|that's|this|which|they|they're|its|their) (?:\w+ )?(?:works?|supports?|handles?|runs?|needs?|"
    r"requires?|has|have|keeps?|avoids?|gives?|lets?|saves?|makes?|already|only|never|always|must|can|will|would)\b|"
    r"we (?:need|want|must|have to|can't|cannot|don't|already)|already|knows?|familiar|"
    r"(?:faster|slower|simpler|safer|cheaper|easier|lighter|smaller|quicker|cleaner|more \w+|less \w+)\b)"
)
# What a message must hold for its sentences to be read for decisions (cheap word-set tests; each
# alternative of `_SAID_DECIDED` and `_CHOICE` holds one of these words or prefixes, and of
# `_REASON` one of these words or a colon, semicolon or dash).
_SPACES = str.maketrans(dict.fromkeys('.,;:!?()[]{}"`*<>=/\\|#~^_+\u2014\u2013', " "))
_ASCII_SPACES = bytes(ord(_SPACES[b]) if b in _SPACES else b for b in range(256))  # the same for ASCII text, as bytes


def _spaced(low: str) -> str:
    """`low` with the punctuation words are split at (`_SPACES`) as spaces: ASCII text (nearly
    all) by a bytes table, ten times faster than `str.translate` with a dict."""
    if low.isascii():
        return low.encode("ascii").translate(_ASCII_SPACES).decode("ascii")
    return low.translate(_SPACES)


_CHOICE_WORDS = frozenset(
    [
        "vote",
        "pick",
        "picks",
        "picked",
        "picking",
        "call",
        "bet",
        "answer",
        "answer's",
        "lean",
        "leans",
        "leaning",
        "out",
        "not",
        "then",
        "works",
        "using",
        "doing",
        "so",
        "opt",
        "opts",
        "opted",
        "opting",
        "go",
        "goes",
        "going",
        "went",
        "stick",
        "sticks",
        "sticking",
        "stay",
        "stays",
        "staying",
        "port",
        "ported",
        "porting",
        "use",
        "try",
        "take",
        "keep",
        "keeping",
        "no",
        "better",
        "best",
        "rather",
        "select",
        "selected",
        "selecting",
        "drop",
        "dropped",
        "dropping",
        "rule",
        "rules",
        "ruled",
        "let's",
        "let",
        "we'll",
        "will",
        "should",
        "we're",
        "are",
        "i'll",
        "i'd",
        "we'd",
        "i'm",
        "plan",
        "just",
        "it",
        "wins",
        "way",
        "right",
        "safer",
        "makes",
        "sense",
        "instead",
        "than",
        "over",
        "vs",
        "versus",
        "alternative",
        "alternatives",
        "option",
        "options",
        "against",
        "more",
        "less",
        "choice",
        "decision",
        "chose",
        "chosen",
        "settled",
        "agreed",
    ]
)
_CHOICE_STEMS = (
    "choos", "decid", "settl", "switch", "mov", "migrat", "standardi", "adopt", "prefer", "favo", "replac", "swap",
    "ditch", "abandon", "answer", "call", "verdict", "beat", "outperform", "trump", "edge", "tempting", "nice",
    "appealing", "cover", "enough", "suffice", "winner", "go-to", "no-go", "non-starter", "deal-breaker",
    "dealbreaker",
)  # fmt: skip
_STEM_HEADS = frozenset(s[:3] for s in _CHOICE_STEMS)
_CHOICE_PHRASES = ("clear of", "away from", "does the", "sweet spot", "final word")
"""What a word or the text must hold for `_CHOICE`'s alternatives not in `_CHOICE_WORDS`."""
_REASON_WORDS = frozenset(
    [
        "because",
        "but",
        "cause",
        "cuz",
        "since",
        "except",
        "reason",
        "reasons",
        "mostly",
        "after",
        "whereas",
        "which",
        "as",
        "given",
        "due",
        "owing",
        "thanks",
        "so",
        "order",
        "to",
        "otherwise",
        "way",
        "point",
        "considering",
        "now",
        "for",
        "upside",
        "benefit",
        "advantage",
        "downside",
        "catch",
        "problem",
        "issue",
        "trouble",
        "too",
        "than",
        "fewer",
        "doesn't",
        "does",
        "don't",
        "do",
        "can't",
        "cannot",
        "won't",
        "isn't",
        "aren't",
        "wasn't",
        "wouldn't",
        "couldn't",
        "didn't",
        "lack",
        "lacks",
        "it",
        "it's",
        "that's",
        "this",
        "they",
        "they're",
        "its",
        "their",
        "we",
        "already",
        "knows",
        "know",
        "familiar",
        "faster",
        "slower",
        "simpler",
        "safer",
        "cheaper",
        "easier",
        "lighter",
        "smaller",
        "quicker",
        "cleaner",
        "more",
        "less",
        "reasoning",
    ]
)


def _may_decide(low: str) -> bool:
    """Whether lower-cased `low` may state a decision (a choice word, and a reason word or a
    clause after a colon, semicolon or dash), by word sets: no regex runs on most messages."""
    words = set(_spaced(low).split())
    if words.isdisjoint(_REASON_WORDS) and not any(c in low for c in ":;\u2014\u2013") and " - " not in low:
        return False
    if not words.isdisjoint(_CHOICE_WORDS):
        return True
    # a word's first three letters looked up first: few words of a message reach `startswith`
    stemmed = any(w[:3] in _STEM_HEADS and w.startswith(_CHOICE_STEMS) for w in words)
    return stemmed or any(p in low for p in _CHOICE_PHRASES)


_EXPLAINED = re.compile(r"[:;\u2014\u2013]\s*\S+(?:\s+\S+){2,}|\s[-\u2013]{1,2}\s+\S+(?:\s+\S+){2,}")
"""A clause after a colon, a semicolon or a dash (a choice's reason is often written so)."""
_CLAUSE = re.compile(r", (?:and |as |so )?[\w'-]+(?: [\w'-]+){2,}")
"""A clause after a comma, after a choice: its reason, as often as not."""
_CHECKBOX = re.compile(r"^\s*(?:[-*+]|\d+[.)])?\s*\[([ xX])\]\s+(.+?)\s*$")
_TODO_LINE = re.compile(r"^\s*(?:[-*+]\s*)?TODO\b[:\s]\s*(.+?)\s*$")
_PLAN = re.compile(
    r"(?i)^(?:next,? |now,? |then,? )?(?:I(?:'ll| will| am going to|'m going to)|let me|next step:?|"
    r"I'm now|now I)\b"
)
_ERROR_LINE = re.compile(
    r"Traceback|[A-Z]\w*(?:Error|Exception)\b|\bERROR\b|\bFAILED\b|\bFAIL\b|\berror(?:\[\w+\])?:|\bfatal:|"
    r"\bpanic(?:ked)?\b|\bexit (?:code|status) [1-9]"
)
_ERROR_WORDS = ("rror", "xception", "FAIL", "atal:", "panic", "Traceback", "exit code", "exit status")
_ERROR_CODE = re.compile(r"\[[A-Z]*\d+\]|\b[A-Z]{1,5}-?\d{2,}\b|\b(?:code|errno|status) \d+")
_NOT_ERROR = re.compile(r"(?i)\b(?:no|0|zero|without)\s+(?:errors?|failures?)\b")
_OUTCOME = re.compile(
    r"(?i)\b(?=[pfeosd\d])"  # (a position no alternative can start at is passed over at once: 2x)
    r"(?:passed|failed|errors?|ok|success\w*|done|exit(?:ed)? (?:code|status)?\s*\d+|\d+ (?:tests?|files?))\b"
)

_PATH_KEYS = frozenset(
    {"path", "file", "file_path", "filepath", "filename", "target", "target_file", "source", "dest"}
    | {"destination", "notebook_path", "directory", "dir", "folder"}
)
_COMMAND_KEYS = ("command", "cmd", "script", "shell", "commandline", "command_line")
_TEXT_KEYS = ("content", "text", "title", "task", "description", "name", "subject", "item")
_STATUS_KEYS = ("status", "state", "done", "completed", "checked")
_ACTIONS = (
    (re.compile(r"(?i)creat|new|touch|mkdir|init"), "created", 2),
    (re.compile(r"(?i)delet|remov|\brm\b|unlink"), "deleted", 2),
    (re.compile(r"(?i)mov|renam|\bmv\b"), "moved", 2),
    (re.compile(r"(?i)edit|replac|patch|insert|updat|modif|apply|append|str_replace|multi_edit"), "edited", 2),
    (re.compile(r"(?i)writ|save|put"), "written", 2),
    (re.compile(r"(?i)read|view|open|cat|show|get|load|head|tail"), "read", 0),
    (re.compile(r"(?i)grep|search|find|glob|list|\bls\b|scan"), "searched", 0),
)
_DONE_WORDS = frozenset({"done", "completed", "complete", "finished", "closed", "resolved", "cancelled", "canceled"})
_DOING_WORDS = frozenset({"in_progress", "in progress", "doing", "active", "started", "current", "wip"})


def _one_line(text: str, kind: str) -> str:
    return clip_line(text, _TEXT_BYTES[kind])  # (which collapses the whitespace first)


_NOT_KEY = re.compile(r"[^\w./:@-]+")
_ASCII_NOT_KEY = bytes(b if chr(b).isalnum() or chr(b) in "_./:@-" else 0x20 for b in range(256))
"""`_NOT_KEY` as a bytes table for ASCII text (a space for each character it matches)."""


def _norm(text: str) -> str:
    """An entry's key from its text: lower-cased, the characters of `_NOT_KEY` as spaces (for
    ASCII text by a bytes table: the regex takes a step per character), whitespace collapsed."""
    low = text[:400].lower()
    spaced = low.encode("ascii").translate(_ASCII_NOT_KEY).decode("ascii") if low.isascii() else _NOT_KEY.sub(" ", low)
    return " ".join(spaced.split())[:160]


def _window(text: str, window: tuple[int, int]) -> str:
    head, tail = window
    return text if len(text) <= head + tail else f"{text[:head]}\n{text[len(text) - tail :]}"


def _split_sentences(text: str) -> list[str]:
    """`text` split at line breaks and after a sentence's end mark (empty pieces included)."""
    out: list[str] = []
    for line in text.split("\n") if "\n" in text else (text,):
        parts = _SENTENCE_END.split(line)
        out.extend(map(operator.add, parts[::2], [*parts[1::2], ""]))
    return out


def _sentences(text: str) -> list[str]:
    """`text`'s sentences (a chat's often start in lower case: "Kafka, then. the queue...")."""
    pieces: list[str] = []
    for piece in _split_sentences(text):
        if pieces and pieces[-1][-1:] == "." and _ABBREVIATION.search(pieces[-1]) and piece[:1].islower():
            pieces[-1] = f"{pieces[-1]} {piece}"
        elif piece:
            pieces.append(piece)
    return [s.strip(" -*>\t") for s in pieces if s.strip(" -*>\t")]


_MODAL_WORDS = frozenset(
    [
        "must",
        "mustn't",
        "never",
        "always",
        "should",
        "shouldn't",
        "shall",
        "need",
        "needs",
        "needed",
        "have",
        "has",
        "required",
        "require",
        "requirement",
        "requirements",
        "mandatory",
        "make",
        "ensure",
        "don't",
        "do",
        "doesn't",
        "cannot",
        "can't",
        "may",
        "at",
        "no",
        "only",
        "exactly",
        "limit",
        "limited",
        "keep",
        "avoid",
    ]
)
"""A word each of `_MODAL`'s alternatives starts with (a sentence without one is not searched)."""
_GO_ON = re.compile(r"\b(?:keep|carry) (?:going|on|it up|at it)\b")  # on lower-cased text
""""keep going", "carry on": a modal word that states nothing."""


def states_something(sentence: str) -> tuple[bool, int]:
    """Whether a user's sentence states a concrete value or a requirement, and its rank (2: a
    number, a quoted string or a modal verb; 1: only an identifier or a path)."""
    if _NUMBER.search(sentence) or (
        ("`" in sentence or '"' in sentence or "'" in sentence or "\u201c" in sentence) and _QUOTED.search(sentence)
    ):
        return True, 2
    low = sentence.lower()
    # cheap tests first: a long sentence of plain words is not run through every pattern
    if not _MODAL_WORDS.isdisjoint(_spaced(low).split()) and (
        _MODAL.search(low) and (not _GO_ON.search(low) or _MODAL.search(_GO_ON.sub(" ", low)))
    ):  # ("Sure, keep going with the plan." states nothing)
        return True, 2
    pathlike = "/" in sentence or "." in sentence.rstrip(".!? ")
    if (pathlike and _PATHLIKE.search(sentence)) or (
        ("_" in sentence or "-" in sentence or low != sentence) and _IDENT.search(sentence)
    ):
        return True, 1
    return False, 0


def _cues(low: str) -> tuple[bool, int, bool, bool]:
    """A lower-cased sentence's cues: (it says a decision was made, how many choice words it
    has, whether it names an alternative, whether it gives a reason outside its choice words)."""
    said = bool(_SAID_DECIDED.search(low))
    spans = [m.span() for m in _CHOICE.finditer(low)]
    reason = (
        any(not any(lo <= m.start() and m.end() <= hi for lo, hi in spans) for m in _REASON.finditer(low))
        or bool(_EXPLAINED.search(low))
        or (bool(spans) and _CLAUSE.search(low, spans[0][1]) is not None)  # "X is the safer bet, <why>"
    )
    alternative = bool(spans) and bool(_ALTERNATIVE_RE.search(low))
    return said, len(spans), alternative, reason


def is_decision(sentence: str, following: str = "") -> bool:
    """A sentence that states a decision outright, or makes a choice and gives a reason (or
    names the alternative): the reason in `sentence` or in the `following` sentence."""
    if sentence.rstrip().endswith("?"):
        return False  # a question decides nothing
    return _decides(_cues(sentence.lower()), _cues(following.lower()) if following else None)


def _decides(cues: tuple[bool, int, bool, bool], following: tuple[bool, int, bool, bool] | None = None) -> bool:
    said, choices, alternative, reason = cues
    if said:
        return True
    if not choices:
        return False
    if reason or (choices > 1 and alternative):
        return True  # a choice with its reason, or with what it was chosen over
    return following is not None and following[3]


def decisions(text: str, split: Sequence[str] | None = None) -> list[str]:
    """The decisions `text` states: a sentence holding a choice and its reason (or saying a
    decision was made), or a run of at most three sentences that each make a choice or give a
    reason, holding both in either order. Only a message with a choice word and a reason word in
    it is split into sentences (`split`: `_sentences(text)`, when the caller has them)."""
    if not _may_decide(text.lower()):
        return []
    split = _sentences(text) if split is None else split
    sentences = [s for s in split if not s.rstrip().endswith("?")]  # a question decides nothing
    cues = [_cues(s.lower()) for s in sentences]
    decided = [len(s) >= 8 and _decides(c) for s, c in zip(sentences, cues, strict=True)]
    found: list[str] = []
    i = 0
    while i < len(sentences):
        _, choices, _, reason = cues[i]
        if not (decided[i] or choices or reason):
            i += 1
            continue
        # the run of choice and reason sentences that starts here (at most three): a choice and
        # its reason, the alternative turned down, the verdict, in any order ("Keep it boring:
        # X. Y is nice, but Z." is one decision, not two halves)
        end = i + 1
        while end < len(sentences) and end - i < 3 and (cues[end][1] or cues[end][3]):
            end += 1
        run = cues[i:end]
        if any(decided[i:end]) or (end - i > 1 and any(c[1] for c in run) and any(c[3] for c in run)):
            found.append(" ".join(sentences[i:end]))
            i = end
        else:
            i += 1
    return found


@functools.lru_cache(maxsize=256)
def _action(tool: str) -> tuple[str, int]:
    for pattern, action, rank in _ACTIONS:
        if pattern.search(tool):
            return action, rank
    return tool, 1


def _status(value: object) -> str:
    if isinstance(value, bool):
        return DONE if value else OPEN
    word = str(value).strip().lower().replace("-", "_")
    if word in _DONE_WORDS:
        return DONE
    if word in _DOING_WORDS or word.replace("_", " ") in _DOING_WORDS:
        return DOING
    return OPEN


def _todo_items(call: ToolCall) -> list[tuple[str, str]]:
    """(text, status) of a to-do list among a tool call's arguments: a list of objects that each
    have a text field and a status field (TodoWrite, write_todos and the like)."""
    items: list[tuple[str, str]] = []
    for value in call.arguments.values():
        if not isinstance(value, (list, tuple)):
            continue
        for item in value:
            if not isinstance(item, Mapping):
                continue
            text = next((item[k] for k in _TEXT_KEYS if isinstance(item.get(k), str) and item[k].strip()), None)
            status_key = next((k for k in _STATUS_KEYS if k in item), None)
            if text is not None and status_key is not None:
                items.append((text, _status(item[status_key])))
    return items


def _command(call: ToolCall) -> str | None:
    if call.arguments.keys().isdisjoint(_COMMAND_KEYS):
        return None
    for key in _COMMAND_KEYS:
        value = call.arguments.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            return " ".join(value)
    return None


@functools.lru_cache(maxsize=1024)
def _is_path_key(key: str) -> bool:
    name = key.lower()
    return name in _PATH_KEYS or name.endswith(("path", "file", "paths", "files"))


def _paths(call: ToolCall) -> list[str]:
    found = [
        v.strip()
        for key, value in call.arguments.items()
        if _is_path_key(key)
        for v in (value if isinstance(value, (list, tuple)) else (value,))
        if isinstance(v, str) and 0 < len(v) <= 300 and "\n" not in v and "base64," not in v
    ]
    return found if len(found) < 2 else list(dict.fromkeys(found))


def error_lines(text: str) -> list[str]:
    """The error lines of a tool's output (the first and the last), read within a window."""
    text = _window(text, _RESULT_WINDOW)
    if not any(w in text for w in _ERROR_WORDS) or not _ERROR_LINE.search(text):
        return []
    lines = [ln.strip() for ln in text.splitlines() if _ERROR_LINE.search(ln) and not _NOT_ERROR.search(ln)]
    lines = [ln for ln in lines if ln and not ln.startswith(('File "', "Traceback"))] or lines
    ends = list(dict.fromkeys(lines if len(lines) <= 2 else [lines[0], lines[-1]]))
    if len(ends) == 2:  # "E X: [E12] y" and "FAILED t::f - X: [E12] y" say one thing: the longer is kept
        short, long = sorted(ends, key=len)
        if _ERROR_MARK.sub("", short, count=1) in long:
            return [long]
    return ends


_ERROR_MARK = re.compile(r"^(?:E|ERROR|FAILED|FAIL|error:?|fatal:)\s+")


def _outcome(result: Message | None, errors: Sequence[str] | None = None) -> tuple[str, bool]:
    """What a command's result says, in one line, and whether it failed (`errors`: the result's
    `error_lines`, when the caller has them)."""
    if result is None:
        return "no result yet", False
    errors = error_lines(result.text) if errors is None else errors
    if result.is_error or errors:
        # the error itself, without a test runner's "FAILED tests/x.py::test_y - " (the error
        # line with it is under Errors seen): the outcome line says what failed, briefly
        said = " \u2026 ".join(_FAILED_TEST.sub("", e, count=1) for e in errors) if errors else _first_line(result.text)
        return "failed: " + said, True
    lines = [ln.strip(_RULE) for ln in _window(result.text, _RESULT_WINDOW).splitlines() if ln.strip(_RULE)]
    summary = next((ln for ln in reversed(lines) if _OUTCOME.search(ln)), lines[-1] if lines else "no output")
    return summary, False


def _first_line(text: str) -> str:
    """`text.strip().splitlines()[0]` ("error" for a blank text) without copying or splitting
    the whole text (a result's may be megabytes, read as `State.append` takes it)."""
    start = _NONSPACE.search(text)
    if start is None:
        return "error"
    end = _LINE_BREAK.search(text, start.start())
    if end is None:
        return text[start.start() :].rstrip()
    line = text[start.start() : end.start()]
    return line if _NONSPACE.search(text, end.start()) else line.rstrip()


_NONSPACE = re.compile(r"\S")  # (`\s` is what `str.strip` strips)
_LINE_BREAK = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")  # where `str.splitlines` splits
_FAILED_TEST = re.compile(r"^(?:FAILED|FAIL|ERROR)\s+\S+::\S+\s+-\s+")
_RULE = " \t=-_*#~"
"""What a line of a test runner's output is framed with ("===== 3 passed in 1.2s =====")."""


def observe(messages: Sequence[Message], seqs: Sequence[int]) -> list[Entry]:
    """The entries `messages` (evicted, in order; `seqs[i]` the journal record of
    `messages[i]`) give. Summaries and system messages give none."""
    results = {m.tool_call_id: m for m in messages if m.role == "tool" and m.tool_call_id}
    calls: dict[str, tuple[str, _CallCues]] = {}  # call id -> (tool name, its cues)
    out: list[Entry] = []
    replies = (i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant")
    last_reply = next((i for i in replies if messages[i].text.strip()), -1)  # the newest, found from the end
    for i, (m, seq) in enumerate(zip(messages, seqs, strict=False)):
        if (m.metadata and m.is_summary) or m.role == "system":
            continue
        if m.role == "tool":
            made = calls.get(m.tool_call_id or "")
            label = made[0] if made is not None else "tool"
            found, boxes = _result_cues(m)
            # one entry per result: its first and last error lines (a command's are on its own
            # line, `ran ... -> failed: ...`, and become an error seen when it is run again)
            errors = found if made is None or made[1][1] is None else ()
            if errors:
                said = _safe(" \u2026 ".join(errors), seq)
                rank = _RANK_SAID if _ERROR_CODE.search(said) else 1  # a code names this error precisely
                out.append(Entry(ERROR, "err:" + _norm(errors[-1]), _one_line(f"{label}: {said}", ERROR), seq, rank))
            if boxes:
                out.extend(_at(boxes, seq))
            continue
        given = _text_cues(m)  # (the newest reply's too: read once, it makes the next read cheap)
        if i == last_reply or given is _UNCACHED:  # its plan, or media named by their record
            text = _window(m.text, _SCAN_WINDOW)
            if text.strip():
                out.extend(_from_text(m.role, text, seq, plan=i == last_reply))
        elif given:
            out.extend(_at(given, seq))
        if m.tool_calls:
            for call, read in zip(m.tool_calls, _calls_cues(m), strict=True):
                calls[call.id] = (call.name, read)
                out.extend(_from_call(call, results.get(call.id), seq, read))
    return out


def _safe(text: str, seq: int) -> str:
    """`text` with media as placeholders: they never enter the ledger as text."""
    return scrub_media(text, f"journal record {seq}")


def _checkboxes(text: str, seq: int, *, own: bool) -> list[Entry]:
    """Tasks from `- [ ]` / `- [x]` and `TODO:` lines; a ticked box counts only in the
    assistant's own messages and in tool results (`own`)."""
    if "[ ]" not in text and "[x]" not in text and "[X]" not in text and "TODO" not in text:
        return []
    out: list[Entry] = []
    for line in text.splitlines():
        box = _CHECKBOX.match(line)
        if box is not None:
            done = box.group(1) != " "
            if done and not own:
                continue
            item = box.group(2)
            status, rank = (DONE, 0) if done else (OPEN, _RANK_TASK)
            out.append(Entry(TASK, "task:" + _norm(item), _one_line(item, TASK), seq, rank, status))
            continue
        todo = _TODO_LINE.match(line)
        if todo is not None:
            item = todo.group(1)
            out.append(Entry(TASK, "task:" + _norm(item), _one_line(item, TASK), seq, _RANK_TASK, OPEN))
    return out


def _from_text(role: str, text: str, seq: int, *, plan: bool = False) -> list[Entry]:
    """Decisions (any role), stated values (the user's), the to-do lines, and with `plan` the
    plan an assistant message states (the newest one's is the last step before the summary)."""
    out = _checkboxes(text, seq, own=role == "assistant")
    split = _sentences(text) if role == "user" or plan else None
    decided = decisions(text, split)
    for said in decided:
        said = _safe(said, seq)
        out.append(Entry(DECISION, "dec:" + _norm(said), _one_line(said, DECISION), seq, _RANK_SAID))
    if role != "user" and not plan:
        return out  # nothing else to find in it
    stated: list[str] = []
    best = 0
    steps: list[str] = []
    within = " ".join(decided)
    for sentence in split or ():
        if len(sentence) < 8 or (decided and sentence in within):
            continue
        if role == "user":
            says, rank = states_something(sentence)
            if says:
                stated.append(sentence)
                best = max(best, rank)
        elif plan and not steps and _PLAN.match(sentence):
            steps.append(sentence)
    if stated:
        joined = _safe(" ".join(stated), seq)
        rank = _RANK_SAID if best == 2 else best
        out.append(Entry(VALUE, "val:" + _norm(joined), _one_line(joined, VALUE), seq, rank))
    if steps:
        step = _safe(steps[0], seq)
        out.append(Entry(TASK, "step", _one_line(f"last stated plan: {step}", TASK), seq, _RANK_SAID, DOING))
    return out


def _from_call(call: ToolCall, result: Message | None, seq: int, cues: _CallCues | None = None) -> list[Entry]:
    """The entries a tool call gives (`cues`: `_call_cues(call)`, when the caller has them)."""
    items, command, paths, plain = _call_cues(call) if cues is None else cues
    if items:
        return _at(items, seq)
    if plain is not None and (result is None or not result.is_error):  # files, read with the call
        return [_new(Entry, (ARTIFACT, key, text, seq, plain[0], "")) for key, text in plain[1]]
    if command is not None:
        outcome, failed = _outcome_of(result)
        shown = scrub_media(" ".join(command.split()), f"journal record {seq}")
        line = _one_line(f"ran `{shown}` -> {scrub_media(outcome, f'journal record {seq}')}", ARTIFACT)
        rank = (_RANK_SAID if _ERROR_CODE.search(outcome) else 2) if failed else 1
        return [Entry(ARTIFACT, "cmd:" + _norm(command), line, seq, rank)]
    rank, lines = _file_lines(call.name, result, paths)
    return [Entry(ARTIFACT, "path:" + path, text, seq, rank) for path, text in lines]


def _file_lines(tool: str, result: Message | None, paths: Sequence[str]) -> tuple[int, list[tuple[str, str]]]:
    """The rank and the (path, line) of each file a call to `tool` touched."""
    action, rank = _action(tool)
    note = f" (failed: {_brief_of(result)})" if result is not None and result.is_error else ""
    return rank, [(path, f"{path} \u2014 {action}{note}") for path in paths]


def _brief(text: str) -> str:
    """`clip_line(text.strip(), 80)`, from the text's ends when each holds more than 80
    characters of words (their collapsed text is the collapsed whole's head and tail, all the
    clip keeps): a failed result may be megabytes, read in the trio thread."""
    if len(text) > 2 * _BRIEF_WINDOW:
        head, tail = " ".join(text[:_BRIEF_WINDOW].split()), " ".join(text[-_BRIEF_WINDOW:].split())
        if len(head) > 80 and len(tail) > 80:
            return clip_line(f"{head}\n{tail}", 80)
    return clip_line(text.strip(), 80)


_BRIEF_WINDOW = 2_000


def _brief_of(result: Message) -> str:
    """`_brief(result.text)`, read once and kept with the result's cues."""
    c = cues(result)
    found = c.brief
    if found is None:
        found = c.brief = _brief(result.text)
    return found


# -- what a message gives, read once -------------------------------------------------------------

_CallCues = tuple[tuple["Entry", ...], "str | None", tuple[str, ...], "tuple[int, tuple[tuple[str, str], ...]] | None"]
"""What a tool call gives whatever its result: its to-do items (as entries of record 0), its
command, the paths among its arguments and, for paths, the rank and the (key, text) of each
file's entry when the result did not fail."""


def _call_cues(call: ToolCall) -> _CallCues:
    items = tuple(
        Entry(TASK, "task:" + _norm(text), _one_line(text, TASK), 0, _RANK_TASK if status != DONE else 0, status)
        for text, status in _todo_items(call)
    )
    command = _command(call)  # (a result's errors are its command's outcome, to-do items or not)
    if items or command is not None:
        return items, command, (), None
    paths = tuple(_paths(call))
    if not paths:
        return items, command, paths, None
    rank, lines = _file_lines(call.name, None, paths)
    return items, command, paths, (rank, tuple(("path:" + path, text) for path, text in lines))


_ANY_SEQ = -7_777_777  # the record a text's entries are read under once (`_at` sets the real one)


class Cues:
    """What the ledger reads of one message, whatever its neighbours and its journal record:
    read once and kept on the message (`cues`), a part at a time as it is first needed (a
    message older than what a compaction reads whole gives only its calls). An entry's record
    is set when the ledger takes it (`_at`).

    `text`: what a user or assistant message's text gives (`_from_text`, not as a plan), or
    `_UNCACHED` when it may name its record (it may hold media: a placeholder says where the
    media is kept), so it is read afresh by every compaction;
    `result`: a tool result's error lines and `- [ ]` lines; `outcome`: what it says as a
    command's result; `brief`: its text in brief, as a failed file call's note; `calls`: its
    tool calls' `_CallCues`, in order."""

    __slots__ = ("brief", "calls", "outcome", "result", "text")

    def __init__(self) -> None:
        self.text: tuple[Entry, ...] | None = None
        self.result: tuple[tuple[str, ...], tuple[Entry, ...]] | None = None
        self.outcome: tuple[str, bool] | None = None
        self.calls: tuple[_CallCues, ...] | None = None
        self.brief: str | None = None


_UNCACHED: tuple[Entry, ...] = (Entry(TASK, "", "", 0),)  # a marker (`Cues.text`), never an entry


def cues(m: Message) -> Cues:
    """`m`'s cues, made empty on first use (filled part by part by `_text_cues`,
    `_result_cues` and `_calls_cues`)."""
    found = m._cues
    if isinstance(found, Cues):
        return found
    made = Cues()
    object.__setattr__(m, "_cues", made)
    return made


def read_cues(m: Message) -> None:
    """Read every cue of `m` now (a message appended to a state: `State.append` calls this, so a
    compaction takes what each message gives instead of reading them all at once)."""
    if m.role == "system" or (m.metadata and m.is_summary):
        return
    try:
        if m.role == "tool":
            _result_cues(m)  # (its outcome line is read if a command's result: few are)
        else:
            _text_cues(m)
            if m.tool_calls:
                _calls_cues(m)
    except Exception:  # never an append's failure: the compaction reads it again (and says why)
        object.__setattr__(m, "_cues", None)


APPEND_READERS.append(read_cues)


def cues_ready(messages: Sequence[Message], start: int | None = None) -> bool:
    """Whether every message of `messages` (evicted, in order) that a ledger reads whole has its
    cues read (appended to a state, or read by an earlier pass): the ledger then only takes
    them, about a millisecond whatever the messages hold. `start`: `first_read(messages)`,
    when the caller has it."""
    for m in messages[first_read(messages) if start is None else start :]:
        c = m._cues
        if m.role == "tool":
            if not isinstance(c, Cues) or c.result is None:
                return False
        elif (m.role != "system" and not (m.metadata and m.is_summary)) and (
            not isinstance(c, Cues) or c.text is None or c.text is _UNCACHED or (m.tool_calls and c.calls is None)
        ):  # (a text with media is read afresh each time: ~1 ms a message, not for the trio thread)
            return False
    return True


def _text_cues(m: Message) -> tuple[Entry, ...]:
    c = cues(m)
    found = c.text
    if found is None:
        text = _window(m.text, _SCAN_WINDOW)
        found = tuple(_from_text(m.role, text, _ANY_SEQ)) if text.strip() else ()
        # media its entries may name by their record (a placeholder in a key, or clipped from
        # a line, or moving where the line is clipped): any a sentence of it could hold
        if found and ("base64," in text or may_hold_base64(text.encode("utf-8", "surrogatepass"))):
            found = _UNCACHED
        c.text = found
    return found


def _result_cues(m: Message) -> tuple[tuple[str, ...], tuple[Entry, ...]]:
    c = cues(m)
    found = c.result
    if found is None:
        window = _window(m.text, _RESULT_WINDOW)
        found = c.result = (tuple(error_lines(window)), tuple(_checkboxes(window, 0, own=True)))
    return found


def _calls_cues(m: Message) -> tuple[_CallCues, ...]:
    c = cues(m)
    found = c.calls
    if found is None:
        found = c.calls = tuple(_call_cues(call) for call in m.tool_calls)
    return found


def _outcome_of(result: Message | None) -> tuple[str, bool]:
    if result is None:
        return "no result yet", False
    c = cues(result)
    found = c.outcome
    if found is None:
        found = c.outcome = _outcome(result, _result_cues(result)[0])
    return found


def _at(entries: Iterable[Entry], seq: int) -> list[Entry]:
    """`entries` (read once, of no record) as the entries of journal record `seq`."""
    return [_new(Entry, (e.kind, e.key, e.text, seq, e.rank, e.status)) for e in entries]


# -- merging forward -----------------------------------------------------------------------------


def _merge_artifact(old: Entry, new: Entry) -> Entry:
    if not old.key.startswith("path:"):
        return new.ranked(max(old.rank, new.rank) if "failed" in new.text else new.rank)
    text = _file_text(old.key[5:], old.text, new.text)
    return _new(Entry, (ARTIFACT, old.key, text, new.seq, max(old.rank, new.rank), ""))


@functools.lru_cache(maxsize=4096)
def _file_text(path: str, old: str, new: str) -> str:
    """A file's line once `new` (one action) is seen after `old` (its actions so far): the
    same line when the action is known, else the action added (cached: a compaction sees the
    same few files read and edited again and again). The same line again (a summary's ledger
    carried twice) adds no action: its actions are not listed twice."""
    prefix = f"{path} \u2014 "
    plain = "(failed" not in old and "(failed" not in new
    same_path = new.startswith(prefix) and old.startswith(prefix)
    if plain and same_path and new[len(prefix) :] in old[len(prefix) :].split(", "):  # known action
        return old
    before = old.split(" \u2014 ", 1)[1].split(" (failed", 1)[0] if " \u2014 " in old else ""
    now = new.split(" \u2014 ", 1)[1] if " \u2014 " in new else ""
    added = [] if new == old else [now.split(" (failed", 1)[0]]
    actions = list(dict.fromkeys([a for a in before.split(", ") if a] + added))
    note = now[len(now.split(" (failed", 1)[0]) :]
    return clip_line(f"{path} \u2014 {', '.join(actions)}{note}", _TEXT_BYTES[ARTIFACT])


_FAILED_MARK = " -> failed: "


def _superseded_failure(command: Entry) -> Entry:
    """A command's failure once the command has run again: an error seen (`ran `x` -> failed:
    y` becomes "`x` failed: y"), of its record and rank."""
    text = command.text.removeprefix("ran ").replace(_FAILED_MARK, " failed: ", 1)
    said = command.text.split(_FAILED_MARK, 1)[1]
    return Entry(ERROR, "err:" + _norm(said.rsplit(" \u2026 ", 1)[-1]), text, command.seq, command.rank)


_DIGITS = re.compile(r"\d+")


def _shape(entry: Entry) -> str:
    return _shape_of(entry.kind, entry.key)


@functools.lru_cache(maxsize=4096)
def _shape_of(kind: str, key: str) -> str:
    """A value entry's key with its numbers blanked (cached: a ledger's entries come back at
    every compaction)."""
    return kind + "\0" + _DIGITS.sub("#", key)


def merge(previous: Ledger, observed: Iterable[Entry]) -> Ledger:
    """`previous` with `observed` folded in: a known key takes the newer text and record (a
    file's actions accumulate), a task's status changes only by what was observed; a new key is
    appended. The current step is the newest one. The demoted ranges carry over. (Entries are
    found by (kind, key): a pair's hash is made of its strings' own, computed once per string.)"""
    entries: dict[tuple[str, str], Entry] = {(e.kind, e.key): e for e in previous.entries}
    shapes = {_shape(e): k for k, e in entries.items() if e.kind == VALUE}
    for new in observed:
        kind = new.kind
        k = (kind, new.key)
        old = entries.get(k)
        if kind == VALUE:
            # The same statement with other numbers (a repeated template, a value restated):
            # the older one ranks lowest, so it is the first demoted to the journal.
            shape = _shape(new)
            similar = shapes.get(shape)
            if similar is not None and similar != k and similar in entries:
                entries[similar] = entries[similar].ranked(0)
            shapes[shape] = k
        if old is None:
            entries[k] = new
        elif kind == ARTIFACT:
            if old.key.startswith("cmd:") and _FAILED_MARK in old.text and old.text != new.text:
                seen = _superseded_failure(old)  # run again: its failure stays, as an error seen
                entries[(seen.kind, seen.key)] = seen
            entries[k] = _merge_artifact(old, new)
        elif kind == TASK and new.key != "step":
            entries[k] = _new(Entry, (old.kind, old.key, new.text, new.seq, new.rank, new.status))
        else:
            entries[k] = new.ranked(max(old.rank, new.rank))
        if kind == TASK and new.key == "step":
            entries[k] = entries.pop(k)  # the newest step goes last
    doing = [e for e in entries.values() if e.kind == TASK and e.status == DOING and e.key != "step"]
    if doing:  # only the newest item in progress is the current step; an older one is open again
        newest = max(doing, key=lambda e: e.seq)
        for e in doing:
            if e is not newest:
                entries[(e.kind, e.key)] = Entry(e.kind, e.key, e.text, e.seq, e.rank, OPEN)
    return Ledger(tuple(entries.values()), dict(previous.demoted))


def carry(
    summaries: Iterable[Message],
    messages: Sequence[Message],
    seqs: Sequence[int],
    *,
    positions: Sequence[int] | None = None,
    start: int | None = None,
) -> Ledger:
    """The ledger after a compaction: the previous summaries' ledgers (from their metadata),
    merged with what the evicted `messages` (journal records `seqs`) give. When the caller
    knows them: `positions`, where `summaries` are among `messages` (else looked for), and
    `start`, `first_read(messages)`."""
    ledger = Ledger()
    summaries = list(summaries)
    for summary in summaries:
        earlier = summary_ledger(summary)
        ledger = merge(ledger, earlier.entries)
        demoted = dict(ledger.demoted)
        for kind, ranges in earlier.demoted.items():
            demoted[kind] = _coalesce([*demoted.get(kind, ()), *ranges])
        ledger = Ledger(ledger.entries, demoted)
    start = first_read(messages) if start is None else start
    if start > 0:  # too many to read in one compaction: the older ones are named by their records
        # the records of the messages not read, but summaries', and numbered (> 0); no pass over
        # them when they are numbered in order (a range: its ends), else C passes (max, min)
        skip = set()
        if summaries:
            found = summary_positions(messages[:start]) if positions is None else positions
            skip = {i for i in found if i < start}
        lo, hi = _unread_ends(seqs, start, skip)
        if hi > 0:  # (a record number is positive: 0 and below are not journal records)
            demoted = dict(ledger.demoted)
            for kind in SECTIONS:
                demoted[kind] = _coalesce([*demoted.get(kind, ()), (lo, hi)])
            ledger = Ledger(ledger.entries, demoted)
        ledger = merge(ledger, _older_calls(messages, seqs, start))
    return merge(ledger, observe(messages[start:], seqs[start:]))


def _unread_ends(seqs: Sequence[int], start: int, skip: set[int]) -> tuple[int, int]:
    """The lowest and highest positive record among `seqs[:start]` but at the positions in
    `skip` ((0, 0) when none): a range's from its ends, stepping over skipped positions."""
    if isinstance(seqs, range) and seqs.step == 1:
        first = next((i for i in range(start) if i not in skip and seqs[i] > 0), None)
        if first is None:
            return 0, 0
        last = next(i for i in range(start - 1, -1, -1) if i not in skip)
        return seqs[first], seqs[last]
    unread: Sequence[int] = seqs[:start]
    if skip:
        zeroed = list(unread)
        for i in skip:
            zeroed[i] = 0
        unread = zeroed
    hi = max(unread, default=0)
    if hi <= 0:
        return 0, 0
    lo = min(unread)
    if lo <= 0:
        lo = min(filter((0).__lt__, unread))
    return lo, hi


def summary_ledger(summary: Message) -> Ledger:
    """The ledger a summary carries in its metadata (empty when it has none or it is damaged):
    the one the compaction that made the summary kept on it (`remember_ledger`), else parsed."""
    source = summary.metadata.get(LEDGER_KEY)
    kept = summary._cues
    if isinstance(kept, _Carried) and kept.source is source:
        return kept.ledger
    return Ledger.from_metadata(source)


class _Carried:
    """Kept on a summary (its `_cues` slot, not part of its value) by the compaction that made
    it: the ledger its metadata holds as `source`, so the next compaction takes the ledger
    instead of parsing it again (~65 µs for a ledger of 50 entries)."""

    __slots__ = ("ledger", "source")

    def __init__(self, source: str, ledger: Ledger) -> None:
        self.source = source
        self.ledger = ledger


def remember_ledger(summary: Message, ledger: Ledger) -> None:
    """Keep `ledger` on `summary` when its metadata holds exactly it (the string the ledger
    writes, read back as this ledger: every entry of a known kind, no empty range list)."""
    source = summary.metadata.get(LEDGER_KEY)
    if (
        isinstance(source, str)
        and len(source) <= _MAX_METADATA_CHARS
        and all(v for v in ledger.demoted.values())
        and all(kind in SECTIONS for kind in ledger.demoted)
        and all(e.kind in SECTIONS and type(e.seq) is int and type(e.rank) is int for e in ledger.entries)
        and source == ledger.to_metadata()
    ):  # (its own copy of the ranges: a finalizer holding the ledger cannot change it later)
        kept = Ledger(ledger.entries, {kind: tuple(ranges) for kind, ranges in ledger.demoted.items()})
        object.__setattr__(summary, "_cues", _Carried(source, kept))


_TOOL_CALLS = operator.attrgetter("tool_calls")

OLDER_CALLS = 100
"""Of the evicted messages too many to read whole (before the newest `READ_TOKENS`), the newest
this many that make tool calls are read for their calls alone: the to-do list, the files
touched and the commands run (with the outcome of their results) of a huge eviction (a 170k
trigger evicts far more than is read) are cheap to read and would otherwise be pointer-only."""


def _older_calls(messages: Sequence[Message], seqs: Sequence[int], end: int | None = None) -> list[Entry]:
    """The entries the tool calls among `messages[:end]` give (the newest `OLDER_CALLS` messages
    that make calls; a call's result looked for among the few records after it), oldest first."""
    end = len(messages) if end is None else end
    # newest first, lazily: a C pass that stops at the `OLDER_CALLS`th message making calls (not
    # one over every message of a 10k batch, nor a copy of them)
    newest_first = map(messages.__getitem__, range(end - 1, -1, -1))
    found = itertools.compress(range(end - 1, -1, -1), map(_TOOL_CALLS, newest_first))
    newest: dict[tuple[str, str, str], Entry] = {}  # read newest first: an older same entry adds nothing
    plain: set[tuple[str, tuple[str, ...]]] = set()  # (tool, paths) of the calls read that did not fail
    for i in itertools.islice(found, OLDER_CALLS):
        m = messages[i]
        if m.role != "assistant":
            continue
        for call, read, result in _with_results(messages, i, end, m):
            if read[2] and (result is None or not result.is_error):  # files (the commonest call):
                if (call.name, read[2]) in plain:  # the same tool on the same files, the same lines
                    continue
                plain.add((call.name, read[2]))
            for e in _from_call(call, result, seqs[i], read):
                # a file keeps each of its actions, a command each failure (an error seen once it
                # ran again), a task its newest state
                if e.key.startswith("path:"):
                    what = e.text.partition(_PATH_SEP)[2]
                else:
                    what = e.text if _FAILED_MARK in e.text else ""
                newest.setdefault((e.kind, e.key, what), e)
    return sorted(newest.values(), key=operator.attrgetter("seq"))


def _with_results(
    messages: Sequence[Message], i: int, end: int, m: Message
) -> Iterable[tuple[ToolCall, _CallCues, Message | None]]:
    """Each call of `m` (`messages[i]`), its cues and its result: the last one for it among the
    `2 * calls` records after `m` (before `end`). One call, the commonest, without a map."""
    calls, reads = m.tool_calls, _calls_cues(m)
    if len(calls) == 1:
        call, found = calls[0], None
        for j in (i + 2, i + 1):
            if j < end:
                r = messages[j]
                if r.tool_call_id == call.id and r.role == "tool":
                    found = r
                    break
        return ((call, reads[0], found),)
    near = messages[i + 1 : min(end, i + 1 + 2 * len(calls))]
    results = {r.tool_call_id: r for r in near if r.role == "tool"}
    return [(call, read, results.get(call.id)) for call, read in zip(calls, reads, strict=True)]


def summary_positions(messages: Sequence[Message]) -> list[int]:
    """Where the summaries are among `messages` (a message without metadata, nearly all, is
    passed over by one attribute test)."""
    return [i for i, m in enumerate(messages) if m.metadata and m.is_summary]


def first_read(messages: Sequence[Message]) -> int:
    """Where the messages read start: at most `READ_MESSAGES` of the newest and about
    `READ_TOKENS` of their tokens (the message that reaches it is read), never between a
    tool call and its results (the read part starts at a user or assistant message)."""
    start, tokens = len(messages), 0
    floor = max(0, len(messages) - READ_MESSAGES)
    while start > floor and tokens < READ_TOKENS:
        start -= 1
        tokens += estimate_message_tokens(messages[start])
    while 0 < start < len(messages) and messages[start].role == "tool":
        start -= 1
    return start


# -- within a budget ----------------------------------------------------------------------------


def _coalesce(ranges: Iterable[tuple[int, int]], most: int = _MAX_POINTER_RANGES) -> tuple[tuple[int, int], ...]:
    """`ranges` sorted and merged; while more than `most`, the two closest are joined (the
    result covers every record the input did)."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    while len(merged) > most:
        i = min(range(len(merged) - 1), key=lambda j: merged[j + 1][0] - merged[j][1])
        merged[i : i + 2] = [(merged[i][0], merged[i + 1][1])]
    return tuple(merged)


def pointer_line(ranges: Sequence[tuple[int, int]]) -> str:
    """The one line that stands for a section's demoted entries."""
    named = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
    return f"- (older entries demoted to the journal: records {named}; read them with recall)"


def without_ledger(text: str) -> str:
    """A summary's text without the ledger's sections (a summarizer need not restate them:
    they are carried in the metadata)."""
    if "\n## " not in text and not text.startswith("## "):
        return text
    headings = {f"## {h}" for h in SECTIONS.values()}
    out: list[str] = []
    skipping = False
    for line in text.split("\n"):
        if line.startswith("## "):
            skipping = line.rstrip() in headings
        if not skipping:
            out.append(line)
    return "\n".join(out)


def render(ledger: Ledger) -> str:
    """The ledger as Markdown sections (empty sections left out). Files are listed by what was
    done to them, one line per set of actions (`- edited: a.py, b.py`)."""
    blocks: list[str] = []
    for kind, heading in SECTIONS.items():
        entries = _ordered(ledger, kind)
        lines = _artifact_lines(entries) if kind == ARTIFACT else [e.line() for e in entries]
        ranges = ledger.demoted.get(kind, ())
        if ranges:
            lines.insert(0, pointer_line(ranges))
        if lines:
            blocks.append("\n".join([f"## {heading}", *lines]))
    return "\n\n".join(blocks)


_PATH_SEP = " \u2014 "


def _artifact_lines(entries: Sequence[Entry]) -> list[str]:
    """Files grouped by what was done to them (in the order first seen), then commands."""
    groups: dict[str, list[str]] = {}
    others: list[str] = []
    for e in entries:
        path, sep, actions = e.text.partition(_PATH_SEP)
        if e.key.startswith("path:") and sep:
            groups.setdefault(actions, []).append(path)
        else:
            others.append(e.line())
    return [f"- {actions}: {', '.join(paths)}" for actions, paths in groups.items()] + others


def _ordered(ledger: Ledger, kind: str) -> list[Entry]:
    entries = [e for e in ledger.entries if e.kind == kind]
    if kind == TASK:  # the current step first, then open, then done
        order = {DOING: 0, OPEN: 1, DONE: 2}
        entries.sort(key=lambda e: (order.get(e.status, 1), e.key != "step"))
    return entries


def _size(ledger: Ledger) -> int:
    """`utf8_len(render(ledger))`, counted section by section (lines' sizes cached)."""
    size, blocks = 0, 0
    by_kind: dict[str, list[Entry]] = {k: [] for k in SECTIONS}
    for e in ledger.entries:
        by_kind[e.kind].append(e)
    for kind, heading in SECTIONS.items():
        entries, ranges = by_kind[kind], ledger.demoted.get(kind, ())
        if not entries and not ranges:
            continue
        blocks += 1
        size += 3 + utf8_len(heading)
        if ranges:
            size += 1 + utf8_len(pointer_line(ranges))
        if kind == ARTIFACT:
            size += sum(1 + utf8_len(line) for line in _artifact_lines(entries))
        else:
            size += sum(1 + _line_size(e) for e in entries)
    return size + 2 * (blocks - 1) if blocks else 0


def rendered_size(ledger: Ledger) -> int:
    """The UTF-8 size of `render(ledger)`, without building it."""
    return _size(ledger)


def _cost(entry: Entry) -> int:
    """About what `entry` adds to the rendered ledger (a file: its path in its group's line)."""
    path, sep, _ = entry.text.partition(_PATH_SEP)
    if entry.kind == ARTIFACT and entry.key.startswith("path:") and sep:
        return utf8_len(path) + 2
    return _line_size(entry) + 1


@functools.lru_cache(maxsize=4096)
def _line_size(entry: Entry) -> int:
    return utf8_len(entry.line())


_RANK_TASK = 4
"""An open task's rank: the last demoted."""
_RANK_SAID = 3
"""What the user or the assistant said: a value stated with a number, a quoted string or a
modal verb, a decision with its reason, the plan last stated. Demoted after what was done to
files, commands and errors (rank 2 at most): those the repository, the tools and the journal
show again, what was said only the journal does."""

_WEIGHT = {ARTIFACT: 0, ERROR: 1, VALUE: 1, DECISION: 1, TASK: 2}
"""Within a rank and a journal record, which kind is demoted first: what was done to files (the
files themselves keep it), then what was said, the open tasks last."""


def fit(ledger: Ledger, max_bytes: int) -> Ledger:
    """`ledger` within `max_bytes` of rendered text: the lowest-ranked entries, within a rank the
    oldest (by journal record, whatever their kind; then `_WEIGHT`), are demoted to their
    section's pointer line (their journal records) until it fits; each section's newest entries
    within its floor (`_FLOOR`) go last. (Files first within a rank, as before, emptied the
    files' section of a small budget while older values stayed.)"""
    if _size(ledger) <= max_bytes:
        return ledger
    entries = ledger.entries
    sizes = [_cost(e) for e in ledger.entries]
    kept = _floors(entries, sizes, max_bytes)
    order = sorted(
        range(len(entries)), key=lambda i: (i in kept, entries[i].rank, entries[i].seq, _WEIGHT[entries[i].kind], i)
    )
    total = _size(ledger)
    gone: set[int] = set()
    for i in order:  # a first cut, by the entries' sizes (the pointer lines' growth is not counted yet)
        if total <= max_bytes:
            break
        gone.add(i)
        total -= sizes[i]
    result = _demote(ledger, gone)
    size = _size(result)
    rest = iter(i for i in order if i not in gone)
    while size > max_bytes and len(gone) < len(entries):  # then exactly: enough more to cover the overshoot
        over = size - max_bytes
        for i in rest:
            gone.add(i)
            over -= sizes[i]
            if over <= 0:
                break
        result = _demote(ledger, gone)  # measured again (with the pointer lines as they now are)
        size = _size(result)
    return result


_FLOOR = {TASK: 0.1, VALUE: 0.2, DECISION: 0.15, ARTIFACT: 0.2, ERROR: 0.05}
"""The share of a ledger's budget each section keeps for its newest entries, demoted only after
every other entry: a small budget is not all taken by the highest-ranked sections (what was said
outranks what was done to files, but the newest files stay listed)."""


def _floors(entries: Sequence[Entry], sizes: Sequence[int], max_bytes: int) -> set[int]:
    """The entries within their section's floor (`_FLOOR`), newest first, skipping none but
    those of rank 0 (a file only read, a task done): the positions in `entries`."""
    left = {kind: share * max_bytes for kind, share in _FLOOR.items()}
    kept: set[int] = set()
    for i in sorted(range(len(entries)), key=lambda j: -entries[j].seq):
        kind = entries[i].kind
        if entries[i].rank == 0:
            continue
        if sizes[i] <= left[kind]:
            left[kind] -= sizes[i]
            kept.add(i)
        else:
            left[kind] = 0  # the newest entries only, without gaps
    return kept


def _demote(ledger: Ledger, gone: set[int]) -> Ledger:
    demoted: dict[str, list[tuple[int, int]]] = {k: list(v) for k, v in ledger.demoted.items()}
    kept: list[Entry] = []
    for i, e in enumerate(ledger.entries):
        if i in gone:
            if e.seq > 0:
                demoted.setdefault(e.kind, []).append((e.seq, e.seq))
        else:
            kept.append(e)
    return Ledger(tuple(kept), {k: _coalesce(v) for k, v in demoted.items() if v})


def record_numbers(messages: Sequence[Message], seqs: Sequence[int], first_seq: int) -> list[int]:
    """Each evicted message's journal record: the append's own numbers when it gave them, else
    counted from `first_seq`."""
    if len(seqs) == len(messages):
        return list(seqs)
    return [first_seq + i for i in range(len(messages))]


def dumps(ledger: Ledger) -> str:
    """The ledger as JSON (for debugging and tests)."""
    return ledger.to_metadata()


__all__ = [
    "ARTIFACT",
    "DECISION",
    "DOING",
    "DONE",
    "ERROR",
    "LEDGER_KEY",
    "LEDGER_SHARE",
    "READ_MESSAGES",
    "READ_TOKENS",
    "OPEN",
    "SECTIONS",
    "TASK",
    "VALUE",
    "Entry",
    "Ledger",
    "carry",
    "first_read",
    "error_lines",
    "fit",
    "is_decision",
    "merge",
    "observe",
    "pointer_line",
    "record_numbers",
    "render",
    "rendered_size",
    "states_something",
    "without_ledger",
]
