"""Word search over journal records, in small pieces.

Scoring grows with the journal and with each record's size. Text is scanned in slices of
`SLICE` characters, so no single call is long (a worker thread holds the GIL for the whole of
any one C call): a 50 MB record is many calls, not one. The file store ranks in its worker
thread (`rank`), over the records whose lines can match; `rank_in_bites` runs the same on the
trio thread in bites of at most `BITE` seconds, with a checkpoint between two bites.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

import orjson
import trio

if TYPE_CHECKING:
    from ..message import Message
    from .file.journal import JournalRecord

T = TypeVar("T")

SLICE = 16 * 1024
"""Characters of text handed to one regex call."""
BITE = 0.002
"""Seconds of scoring between two checkpoints."""
MAX_QUERY_CHARS = 4_000
"""Characters of a query that are read."""
MAX_QUERY_WORDS = 64
"""Distinct words of a query that count; the rest are ignored."""

_WORD = re.compile(r"\w+")
_BREAK = re.compile(r"\W")


def query_words(query: str) -> list[str]:
    """The distinct words of `query`, casefolded, in order, at most `MAX_QUERY_WORDS`."""
    words: dict[str, None] = {}
    for piece in slices(query):
        for w in _WORD.findall(piece.casefold()):
            words.setdefault(w)
            if len(words) == MAX_QUERY_WORDS:
                return list(words)
    return list(words)


def slices(text: str) -> Iterable[str]:
    """`text` in pieces of about `SLICE` characters, cut where a word ends (a word longer than
    a slice is cut anyway)."""
    start, n = 0, len(text)
    while start < n:
        end = start + SLICE
        if end < n:
            m = _BREAK.search(text, end, min(n, end + SLICE))
            end = m.start() if m is not None else end
        yield text[start:end]
        start = end


def _pieces(message: Message) -> Iterator[str]:
    yield from slices(message.text)
    yield from _call_pieces(message)


def _call_pieces(message: Message) -> Iterator[str]:
    for call in message.tool_calls:
        yield call.name
        yield from slices(orjson.dumps(call.to_dict()["arguments"]).decode())


def count_call_words(message: Message, counts: Counter[str]) -> None:
    """Count the words of a message's tool calls (names and arguments) into `counts`."""
    for piece in _call_pieces(message):
        counts.update(_WORD.findall(piece.casefold()))


_WORD_CHAR = re.compile(r"\w")


def count_words(text: str, counts: Counter[str], words: Sequence[str] | None = None) -> str:
    """Count the words of `text` (casefolded) into `counts`, but for a word running on at its
    end: that is returned, to be counted with the text that follows (a word longer than a
    slice is counted as it is, as `slices` cuts it). With `words`, a slice holding none of
    them (as a substring) is skipped: only their counts are then exact."""
    i = n = len(text)
    while i > 0 and n - i <= SLICE and _WORD_CHAR.match(text, i - 1):
        i -= 1
    if n - i > SLICE:
        i = n
    for piece in slices(text[:i] if i < n else text):
        low = piece.lower() if piece.isascii() else piece.casefold()  # the same for ASCII, faster
        if words is None or any(w in low for w in words):
            counts.update(_WORD.findall(low))
    return text[i:]


def message_words(message: Message) -> Counter[str]:
    """How often each word (casefolded) occurs in a message's text and tool calls."""
    counts: Counter[str] = Counter()
    for piece in _pieces(message):
        counts.update(_WORD.findall(piece.casefold()))
    return counts


def _rank_steps(
    records: Sequence[JournalRecord],
    words: Sequence[str],
    limit: int,
    out: list[JournalRecord],
    counted: Mapping[int, Counter[str]],
) -> Iterator[None]:
    """`rank`, yielding whenever it has worked `BITE` seconds; the result goes into `out`."""
    scored: list[tuple[int, int, int, JournalRecord]] = []
    clock = time.perf_counter
    due = clock() + BITE
    for record in records:
        known = counted.get(record.seq)
        counts: Counter[str] = Counter() if known is None else known
        for piece in _pieces(record.message) if known is None else ():
            counts.update(_WORD.findall(piece.casefold()))
            if clock() >= due:
                yield
                due = clock() + BITE
        present = [counts[w] for w in words if counts[w]]
        if present:
            scored.append((-len(present), -sum(present), record.seq, record))
    yield
    scored.sort(key=lambda s: s[:3])
    out.extend(s[3] for s in scored[:limit])


def rank(
    records: Sequence[JournalRecord],
    words: Sequence[str],
    limit: int,
    counted: Mapping[int, Counter[str]] | None = None,
) -> list[JournalRecord]:
    """Records holding any of `words`, best first: most distinct words present, then most
    occurrences, then lowest seq; at most `limit`. `counted`: the word counts of records (by
    seq) already counted while they were read (a huge record, read without building its text)."""
    out: list[JournalRecord] = []
    for _ in _rank_steps(records, words, limit, out, counted or {}):
        pass
    return out


async def rank_in_bites(records: Sequence[JournalRecord], words: Sequence[str], limit: int) -> list[JournalRecord]:
    """`rank` on the trio thread, in bites of at most `BITE` seconds with a checkpoint between
    them: every other task runs between two bites, and a cancel stops it at the next one."""
    out: list[JournalRecord] = []
    for _ in _rank_steps(records, words, limit, out, {}):
        await trio.lowlevel.checkpoint()
    return out
