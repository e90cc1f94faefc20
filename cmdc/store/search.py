"""Word search over journal records, in small pieces.

Scoring grows with the journal and with each record's size. Text is scanned in slices of
`SLICE` characters, so no single call is long (a worker thread holds the GIL for the whole of
any one C call): a 50 MB record is many calls, not one. `rank` orders records by the query
words they hold; `rank_in_bites` runs the same on the trio thread in bites of at most `BITE`
seconds, with a checkpoint between two bites.

Below: the words and the BM25 ranking both stores' indexes share (`tokens`, `query_terms`,
`bm25`): the file store's FTS5 sidecar and the PostgreSQL store rank a query alike, and so does
the file store without its index (`best_matches`, over every record).
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

import orjson
import trio

if TYPE_CHECKING:
    from ..message import Message
    from .records import JournalRecord

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


# -- the words and the ranking of both stores' search indexes (the file store's FTS5 sidecar, the
# PostgreSQL store's tsvectors) -----------------------------------------------------------------

TEXT_CHARS = 256 * 1024
"""Characters of a record's text that are indexed (a longer text is indexed by its head)."""
SUMMARY_WEIGHT = 0.5
"""A summary's score is multiplied by this: it quotes records that are themselves in the journal,
and the record is the source."""
K1, B = 1.2, 0.75
"""BM25's parameters (FTS5's `bm25()` uses these)."""
MAX_QUERY_TERMS = 64
LONGEST_COMPOUND = 256  # characters of an identifier kept whole (a longer one counts by its parts)
COMPOUND = re.compile(r"(?<!\w)\w++(?:[/._-]++\w++)+")  # possessive, from a word's start: linear
_WORD_RE = re.compile(r"\w+")
_JOINT = re.compile(r"[/.-]")  # what a token holds only when it is a whole identifier (words are \w+)


def tokens(text: str) -> list[str]:
    """The words of `text`, casefolded, in order; an identifier holding `/ . _ -` between its
    parts (`src/billing/mod_7.py`, `E-4127`) comes as its parts and then whole."""
    low = text.casefold()
    out: list[str] = []
    pos = 0
    for m in COMPOUND.finditer(low):
        out += _WORD_RE.findall(low, pos, m.start())
        out += _WORD_RE.findall(m[0])
        if len(m[0]) <= LONGEST_COMPOUND:
            out.append(m[0])
        pos = m.end()
    out += _WORD_RE.findall(low, pos)
    return out


def record_text(message: Message) -> str:
    """What is indexed of a message: its text (up to `TEXT_CHARS`), its tool calls' names and
    arguments."""
    parts = [message.text[:TEXT_CHARS]]
    for call in message.tool_calls:
        parts.append(call.name)
        parts.append(orjson.dumps(call.to_dict()["arguments"]).decode()[:TEXT_CHARS])
    return "\n".join(parts)


STOP_WORDS = frozenset(
    {
        "a",
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
    }
)
"""English function words (as PostgreSQL's `english` configuration lists them): a query matches
them as typed, never their other forms (see `query_terms`)."""
_SUFFIXES = ("ations", "ation", "ings", "ing", "ied", "ies", "ers", "ed", "es", "er", "s")
_FORMS = ("", "s", "es", "ed", "ing", "er", "e")
_MIN_STEM = 3
_VOWELS = frozenset("aeiou")


def stem(word: str) -> str:
    """`word` without one common English ending and a final `e` (`changes`, `changed`, `change`
    -> `chang`; `logging` -> `log`), at least `_MIN_STEM` letters kept; a word holding anything
    but lower-case ASCII letters is returned as it is."""
    if not (word.isascii() and word.isalpha() and word.islower()):
        return word
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= _MIN_STEM:
            word = word[: -len(suffix)]
            if len(word) > _MIN_STEM and word[-1] == word[-2] and word[-1] not in _VOWELS | {"l", "s", "z"}:
                word = word[:-1]  # logging -> logg -> log
            break
    if word.endswith("e") and len(word) > _MIN_STEM:
        word = word[:-1]
    return word


def word_forms(word: str) -> list[str]:
    """The forms of an English word a search also matches, the word first: its stem with the
    usual endings (`fail` -> fails, failed, failing...; `logs` -> log, logged, logging), those
    holding the same stem only (`changelog` is not a form of `change`). A number, an identifier
    or a word of other letters has itself only."""
    base = stem(word)
    if base == word and not (word.isascii() and word.isalpha() and len(word) >= _MIN_STEM):
        return [word]
    bases = [base]
    short = len(base) in (3, 4) and base[-2] in _VOWELS and base[-3] not in _VOWELS
    if short and base[-1] not in _VOWELS | {"w", "x", "y"}:
        bases.append(base + base[-1])  # log -> logg(ed)
    forms = dict.fromkeys([word])
    for b in bases:
        for ending in ("ed", "ing", "er") if b != base else _FORMS:
            form = b + ending
            if stem(form) == base:
                forms.setdefault(form)
    return list(forms)


def query_terms(query: str, held: Callable[[str], bool] | None = None) -> tuple[list[str], str | None]:
    """The distinct terms of a query (at most `MAX_QUERY_TERMS`) and the phrase of its plain
    words in order (None for fewer than two): plain words, never syntax.

    Stop words are not terms of their own (unless the query holds nothing else: a stop word
    rare in a journal would outweigh the words searched for), but each two words in a row of a
    query of three or more are a phrase term (`"to tests"`, `"sessions timeout"`): a record
    holding the query's words as they were typed ranks above one holding them apart. A word of
    letters that no record holds as typed (`held(word)` false; every word without `held`)
    matches its other forms instead (`word_forms`: `fail` finds fails, failed, failing), each a
    term of its own: a word some record holds is searched as typed, since a form counted as a
    term of its own would outweigh it wherever the form is rarer (`foxes` beside `fox`). Terms
    come in that order, words, pairs, forms (`MAX_QUERY_TERMS` cuts forms first). A number or
    an identifier (`svc129`, `E4127`, `src/billing/mod_7.py`, kept whole and by its parts)
    matches exactly; a term holding a space is a phrase."""
    words = tokens(query)
    plain = [w for w in words if _WORD_RE.fullmatch(w)][:MAX_QUERY_TERMS]
    meant = [w for w in words if w not in STOP_WORDS]
    parts = {p for w in words if not _WORD_RE.fullmatch(w) for p in _WORD_RE.findall(w)}  # of identifiers
    terms = dict.fromkeys(meant or words)
    if len(plain) > 2:  # two words in a row (a pair of stop words says nothing)
        for first, second in itertools.pairwise(plain):
            if first != second and not (first in STOP_WORDS and second in STOP_WORDS):
                terms.setdefault(f"{first} {second}")
    wanted = set(meant)
    for w in list(terms)[:MAX_QUERY_TERMS]:
        if w in wanted and w not in parts and len(forms := word_forms(w)) > 1 and not (held and held(w)):
            terms.update(dict.fromkeys(forms))
    return list(terms)[:MAX_QUERY_TERMS], (" ".join(plain) if len(plain) > 1 else None)


def bm25(
    docs: Sequence[tuple[Sequence[str], bool]],
    terms: Sequence[str],
    phrase: str | None,
    total: int,
    frequency: Callable[[str], int],
    average: float,
) -> list[float]:
    """Each document's BM25 score as FTS5 computes it (higher is better here), a summary's times
    `SUMMARY_WEIGHT`: `docs` are (tokens, is summary); `frequency(term)` the documents holding a
    term (or the phrase), `total` the documents, `average` their mean length in tokens."""
    queries: list[Sequence[str]] = [t.split() for t in terms]
    if phrase is not None:
        queries.append(phrase.split())
    idf = []
    for q in queries:
        n = frequency(" ".join(q))
        value = math.log((total - n + 0.5) / (n + 0.5))
        idf.append(value if value > 0 else 1e-6)
    out = []
    for words, summary in docs:
        length = len(words)
        # a phrase is matched in the text's words (identifiers left out)
        plain = [w for w in words if not _JOINT.search(w)] if phrase is not None else words
        norm = K1 * (1 - B + B * length / max(average, 1e-9))
        score = 0.0
        for q, weight in zip(queries, idf, strict=True):
            hits = occurrences(words if len(q) == 1 else plain, q)
            if hits:
                score += weight * hits * (K1 + 1) / (hits + norm)
        out.append(score * (SUMMARY_WEIGHT if summary else 1.0))
    return out


def holds_phrase(words: Sequence[str], phrase: str) -> bool:
    """Whether the plain words of a document's `words` hold `phrase` (words in a row)."""
    return occurrences([w for w in words if _WORD_RE.fullmatch(w)], phrase.split()) > 0


def occurrences(words: Sequence[str], phrase: Sequence[str]) -> int:
    """How often `phrase` (one word, or words in a row) occurs in `words`."""
    if len(phrase) == 1:
        return words.count(phrase[0])
    n, k = len(words), len(phrase)
    return sum(1 for i in range(n - k + 1) if words[i] == phrase[0] and list(words[i : i + k]) == list(phrase))


def wanted_words(query: str) -> set[str]:
    """Every word a record must hold to match `query`: its words, their forms, the phrase's."""
    terms, phrase = query_terms(query)  # every word's forms: what any record could match
    wanted = {w for t in terms for w in t.split()} | set(phrase.split() if phrase else ())
    return wanted | {f for w in list(wanted) for f in word_forms(w)}


def best_matches(
    records: Sequence[JournalRecord], query: str, limit: int, stats: tuple[int, float] | None = None
) -> list[JournalRecord]:
    """The records best matching `query` by BM25, as the file store's index ranks them (its
    terms, the phrase when some record holds it, rarity over every record, a summary's score
    halved, ties to the lower number): for a journal searched without its index. `records`:
    every visible record, in order; or, with `stats` (the records, their mean length in
    words: estimates), every visible record holding one of `wanted_words(query)`. Only the
    records holding such a word keep their words; of the others, their number of words alone."""
    if limit <= 0 or not records:
        return []
    wanted = wanted_words(query)
    length = 0
    held: list[tuple[JournalRecord, list[str]]] = []
    for record in records:
        words = tokens(record_text(record.message))
        length += len(words)
        if not wanted.isdisjoint(words):
            held.append((record, words))
    total, average = stats if stats is not None else (len(records), length / len(records))
    holding: dict[str, int] = {}

    def frequency(term: str) -> int:
        if term not in holding:
            parts = term.split()
            holding[term] = sum(
                1
                for _, words in held
                if (parts[0] in words if len(parts) == 1 else holds_phrase(words, term))
            )
        return holding[term]

    terms, phrase = query_terms(query, lambda word: frequency(word) > 0)
    if phrase is not None and not frequency(phrase):
        phrase = None
    docs = [(words, record.message.is_summary) for record, words in held]
    scores = bm25(docs, terms, phrase, max(total, len(held)), frequency, average)
    ranked = sorted(
        ((score, record) for score, (record, _) in zip(scores, held, strict=True) if score > 0),
        key=lambda pair: (-pair[0], pair[1].seq),
    )
    return [record for _, record in ranked[:limit]]
