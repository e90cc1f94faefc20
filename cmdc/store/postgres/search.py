"""The PostgreSQL store's search: the query's terms, the candidates the GIN index gives, and
their ranking by BM25 as the file store ranks (`cmdc.store.search`), all in one snapshot.

The work is bounded whatever the journal's size or the words' frequency: at most
`SEARCH_CANDIDATES` records holding every query word, then as many holding any, are read from
their search vectors alone; each word's rarity comes from `cmdc_terms` (kept by the indexer,
`indexer.py`); a candidate's message is read only while the score its vector allows (`_Bound`)
can still reach the best found. Records past the agent's indexed mark (the indexer's lag) are
matched directly, with the same vector. See `SearchRows.search` and docs/search.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import psycopg

from ..._check import integer
from ...errors import InvalidMessage
from ...message import Message
from ...state import validate_agent_id
from .. import bigjson as _bigjson
from .. import search as _ranking
from ..records import JournalRecord
from ..search import MAX_QUERY_CHARS, MAX_QUERY_WORDS
from .indexer import VECTOR
from .rows import VISIBLE, decode

T = TypeVar("T")

SEARCH_CANDIDATES = 200
"""Records a search ranks at most per stage (see `PostgresStore.search`): each costs a heap page
read and its vector's bound, so this bounds a search's time at a million records (p99 16 ms
against 25 ms at 500, side by side on a loaded machine), and the ranks hardly move (97% of the
top 5 the same as with 500, on two-word queries matching ~2,400 of 1M records)."""
SEARCH_ALL_BELOW = 2_000
"""Journals with at most this many records rank every record that holds a query word (no
candidate cap): a small journal's best match is never left out for being a late match of a
common word, and its results are the file store's."""
_SOME_LOOKUPS = 8  # index lookups at most for the candidates holding some words (one per word, rarest first)
SEARCH_DF_MAX = 100_000
"""Records a search counts at most for a word's rarity (a word in more is common anyway)."""
_AVERAGE_SAMPLE = 256  # latest records whose mean length in words BM25 uses
SEARCH_UNINDEXED_MAX = 50_000
"""A search reads at most this many record numbers past the agent's `indexed_seq` directly (the
indexer's usual lag is the last batch); past that, it indexes them first."""
SEARCH_NARROW_BELOW = 50_000
"""Journals with at most this many records are searched through their agent's index lexeme."""


def _lexeme(word: str) -> str:
    """`word` as one quoted lexeme of a `to_tsquery` text (never an operator)."""
    return "'" + word.replace("'", "''").replace("\\", "\\\\") + "'"


def _ranked_words(raw: bytes) -> tuple[list[str], bool] | None:
    """A row's message as search ranks it (its words as the file store indexes them, whether it
    is a summary), read with one `orjson.loads` (a huge one through the message decoder); None
    for a row that cannot be read (the decoder skips it too)."""
    try:
        if len(raw) > _ranking.TEXT_CHARS:
            message = _bigjson.message_from_json(raw, _ranking.TEXT_CHARS)[0]
            return _ranking.tokens(_ranking.record_text(message)), message.is_summary
        obj = orjson.loads(raw)
        content = obj.get("content", "")
        if not isinstance(content, str):
            message = Message.from_dict(obj)
            return _ranking.tokens(_ranking.record_text(message)), message.is_summary
        parts = [content]
        for call in obj.get("tool_calls", []):
            parts += (call["name"], orjson.dumps(call.get("arguments", {})).decode())
        summary = (obj.get("metadata") or {}).get("cmdc.kind") == "summary"
        return _ranking.tokens("\n".join(parts)), summary
    except (orjson.JSONDecodeError, InvalidMessage, ValueError, TypeError, KeyError, AttributeError):
        return None


def _vector_counts(vector: str, terms: Sequence[str]) -> tuple[int, list[int]]:
    """A search vector's length (its positions: the words the text held) and how often it
    holds each of `terms`, from its text form (`'word':3,17 'other':5 'cmdc agent=a'`). A
    lexeme holding `':` or a comma of its own counts a little long: this bounds a score, it
    does not make one."""
    length = vector.count("':") + vector.count(",")
    counts = []
    for term in terms:
        key = "'" + term.replace("'", "''") + "':"
        at = vector.find(key)
        while at > 0 and vector[at - 1] != " ":
            at = vector.find(key, at + 1)
        if at < 0:
            counts.append(0)
            continue
        end = vector.find(" ", at + len(key))
        counts.append(vector.count(",", at + len(key), len(vector) if end < 0 else end) + 1)
    return length, counts


class _Bound:
    """The most a candidate can score, from its search vector: each word's occurrences and the
    vector's length are those the file store's index counts for plain words (the sum is
    `cmdc.store.search.bm25`'s, term by term in the same order, so a bound equals the score when they
    are); a word the configuration splits counts as if it held it without end, and the phrase (or
    two words in a row) as often as its rarest word. A summary only scores less."""

    def __init__(
        self,
        terms: Sequence[str],
        single: Collection[str],
        phrase: str | None,
        n: int,
        frequency: Callable[[str], int],
        average: float,
    ) -> None:
        queries = [*terms, *([phrase] if phrase is not None else [])]
        weights = []
        for q in queries:
            value = math.log((n - frequency(q) + 0.5) / (frequency(q) + 0.5))
            weights.append(value if value > 0 else 1e-6)
        index = {t: i for i, t in enumerate(terms)}
        # per query: its weight and which counts bound its hits (None: no bound, hits without end)
        self._parts: list[tuple[float, list[int] | None]] = []
        for q, weight in zip(queries, weights, strict=True):
            words = q.split()  # a phrase or words in a row: hits at most its rarest word's
            known = [index[w] for w in words if w in single and w in index]
            self._parts.append((weight, known if len(known) == len(words) else None))
        self._average = max(average, 1e-9)

    def __call__(self, tfs: Sequence[int], length: int) -> float:
        k1, b = _ranking.K1, _ranking.B
        norm = k1 * (1 - b + b * length / self._average)
        score = 0.0
        for weight, known in self._parts:
            if known is None:
                score += weight * (k1 + 1)
                continue
            hits = min(tfs[i] for i in known)
            if hits:
                score += weight * hits * (k1 + 1) / (hits + norm)
        return score


class SearchRows:
    """`PostgresStore.search` and the queries it runs."""

    if TYPE_CHECKING:  # given by `PostgresStore` (and `IndexRows`)

        async def _run(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T: ...

        async def index(self, agent_id: str | None = None) -> int: ...

    def _setup_search(self) -> None:
        self._averages: dict[str, tuple[int, float]] = {}  # agent -> (seq, mean record length in words)

    async def search(
        self, agent_id: str, query: str, limit: int = 10, *, max_chars: int | None = None
    ) -> list[JournalRecord]:
        """Visible records holding words of `query` (case-insensitive; its first 64 distinct
        words; an identifier with `/ . _ -` counts whole and by its parts), best first, at most
        `limit`, ranked as the file store ranks them (`cmdc.store.search.bm25`: rare words outweigh
        common ones, an exact identifier or the query's words in a row rank first, a summary's
        score counts half).

        The work is bounded, whatever the journal's size or the words' frequency: the GIN
        index gives the candidates, at most `SEARCH_CANDIDATES` records holding *every* query
        word, then at most `SEARCH_CANDIDATES` more holding *some* of them (shared among the words
        rarest first, so every record of a rare word is a candidate), read from their
        search vectors alone; each word's rarity is read from `cmdc_terms` (a word the search
        configuration splits is counted through the index, up to `SEARCH_DF_MAX` records). The
        candidates are ranked by BM25 over their words as the file store's index reads them,
        their messages read best bound first (`_Bound`: the score a vector allows), a batch at a
        time, until no candidate left can beat the last of the best: most searches read one
        batch. A journal of at most `SEARCH_NARROW_BELOW` records is searched through its
        agent's lexeme in the index, so other agents' matches are never read; a larger one by
        its words alone. Records not in the index yet (the indexer's lag) are matched directly,
        with the same vector; more than `SEARCH_UNINDEXED_MAX` of them are indexed first. When
        more records match than the candidates, the ones ranked are those the index hands out
        first, not necessarily the best of all: a more specific query narrows it."""
        validate_agent_id(agent_id)
        integer(limit, "search limit")
        if max_chars is not None:
            integer(max_chars, "max_chars", minimum=0)
        text = query[:MAX_QUERY_CHARS]
        if not _ranking.query_terms(text)[0] or not limit:
            return []
        args = (agent_id, text, limit, max_chars)
        found: list[JournalRecord] | None = await self._run(self._search_decoded, *args)
        while found is None:  # its writers keep the lag lower: this ends
            await self.index(agent_id)
            found = await self._run(self._search_decoded, *args)
        return found

    _HOLDS_WORD = (
        "SELECT EXISTS (SELECT 1 FROM cmdc_search WHERE agent_id = %(agent)s "
        "AND words @@ {match}) OR EXISTS (SELECT 1 FROM cmdc_records r "
        "WHERE r.agent_id = %(agent)s AND r.seq > (SELECT indexed_seq FROM cmdc_journals WHERE agent_id = %(agent)s) "
        "AND " + VECTOR.format(r="r").replace("{", "{{").replace("}", "}}") + " @@ to_tsquery('simple', %(q)s))"
    )

    def _holds_word(self, conn: psycopg.Connection[Any], agent_id: str, word: str, narrow: bool) -> bool:
        """Whether any record of the agent holds `word` (as the file store's index tells it);
        `narrow`: through the agent's lexeme, as `_search_sync` chooses."""
        args = {"agent": agent_id, "q": _lexeme(word), "mine": f"'cmdc agent={agent_id}'"}
        match = "(to_tsquery('simple', %(q)s) && %(mine)s::tsquery)" if narrow else "to_tsquery('simple', %(q)s)"
        row = conn.execute(self._HOLDS_WORD.format(match=match), args).fetchone()
        return bool(row and row[0])

    def _search_decoded(
        self,
        conn: psycopg.Connection[Any],
        agent_id: str,
        text: str,
        limit: int,
        max_chars: int | None,
    ) -> list[JournalRecord] | None:
        """The search, in one worker thread's turn: the query's terms (a word no record holds
        by its forms), the words' rarity (`cmdc_terms`), the candidates (`_candidates`), and the
        best of them by BM25 over their words as the file store's index reads them. A
        candidate's message is read only while it can still rank among the best: the candidates
        are taken best bound first (`_bound`), a batch at a time, until the next one's bound
        cannot beat the last of the `limit` best found."""
        # one snapshot: the mark, the word counts, the vectors and the records agree (the indexer
        # moves the mark and adds the vectors and their counts in one transaction), asked for in
        # its BEGIN (no round trip of its own); the pooled connection is given back as it was
        conn.isolation_level, conn.read_only = psycopg.IsolationLevel.REPEATABLE_READ, True
        try:
            with conn.transaction():
                return self._search_terms(conn, agent_id, text, limit, max_chars)
        finally:
            conn.isolation_level, conn.read_only = None, None

    def _search_terms(
        self, conn: psycopg.Connection[Any], agent_id: str, text: str, limit: int, max_chars: int | None
    ) -> list[JournalRecord] | None:
        """The query's terms, grouped by their forms, then the search (`_search_snapshot`). The
        journal's mark and the counts of every term the query may have (each word's forms
        too) come in one round trip, and tell which words some record holds (`query_terms`'
        `held`) without asking the index for each."""
        mark = self._mark(conn, agent_id, _ranking.query_terms(text)[0])
        if mark is None:
            return []
        top, indexed, known = mark
        if top - indexed > SEARCH_UNINDEXED_MAX:
            return None  # a backlog (left by a process that died): the caller indexes it first

        def holds(word: str) -> bool:
            n = known.get(word)
            if n is not None and (n > 0 or top == indexed):  # one lexeme, and none past the mark
                return n > 0
            return self._holds_word(conn, agent_id, word, top <= SEARCH_NARROW_BELOW)

        terms, phrase = _ranking.query_terms(text, holds)
        terms = terms[:MAX_QUERY_WORDS]
        missing = [t for t in terms if t not in known]
        if missing:  # a form the first guess left out (past its cut)
            more = self._mark(conn, agent_id, missing)
            known.update(more[2] if more is not None else {})
        # a word's forms are one group (they share its stem): the records holding every word in
        # some form come first, then those holding any; a phrase term only ranks (its words find it)
        groups: dict[str, list[str]] = {}
        for term in terms:
            if " " not in term:
                groups.setdefault(_ranking.stem(term), []).append(term)
        counted = {t: min(n, SEARCH_DF_MAX) for t in terms if (n := known.get(t)) is not None}
        args = (list(groups.values()), terms, phrase, top, indexed, counted, limit, max_chars)
        return self._search_snapshot(conn, agent_id, *args)

    def _mark(
        self, conn: psycopg.Connection[Any], agent_id: str, terms: list[str]
    ) -> tuple[int, int, dict[str, int | None]] | None:
        """The agent's journal mark (its highest record number, its indexed one) and each term's
        count of indexed records holding it (None: not one lexeme, see `_MARK_AND_COUNTS`);
        None when the agent has no journal."""
        args = {"agent": agent_id, "terms": terms, "quoted": [_lexeme(t) for t in terms]}
        row = conn.execute(self._MARK_AND_COUNTS, args).fetchone()
        if row is None:
            return None
        counts = {t: (None if c is None else int(c)) for t, c in zip(terms, row[3], strict=True)}
        return int(row[0]), int(row[1]), counts

    def _search_snapshot(
        self,
        conn: psycopg.Connection[Any],
        agent_id: str,
        groups: list[list[str]],
        terms: list[str],
        phrase: str | None,
        top: int,
        indexed: int,
        counted: dict[str, int],
        limit: int,
        max_chars: int | None,
    ) -> list[JournalRecord]:
        single = set(counted)  # the words the configuration keeps as one lexeme each
        average = self._average_length(conn, agent_id, top)

        def indexed_counts(wanted: list[str]) -> list[int]:
            """The indexed records holding each term (a word or words in a row), through the
            index, all in one round trip."""
            tsqs = [" <-> ".join(_lexeme(w) for w in term.split()) for term in wanted]
            rows = conn.execute(self._FREQUENCY, {"agent": agent_id, "qs": tsqs, "cap": SEARCH_DF_MAX}).fetchall()
            return [int(n) for (n,) in rows]

        uncounted = [t for t in terms if t not in counted]  # words in a row, words the configuration splits
        if uncounted:
            counted.update(zip(uncounted, indexed_counts(uncounted), strict=True))
        late, bounds = self._candidates(conn, agent_id, groups, counted, terms, indexed, top)
        docs = [(row, _ranked_words(bytes(row[3]))) for row in late]  # past the mark: read whole
        kept = [(row, doc) for row, doc in docs if doc is not None]

        def late_count(term: str) -> int:
            """The records past the mark holding `term` (they are all among the candidates)."""
            if " " in term:
                return sum(1 for _, doc in kept if _ranking.holds_phrase(doc[0], term))
            return sum(1 for _, doc in kept if term in doc[0])

        for term in terms:
            counted[term] += late_count(term)
        n = max(top, len(kept) + len(bounds))

        def frequency(term: str) -> int:
            if term not in counted:  # the phrase: counted once some candidate holds it
                counted[term] = indexed_counts([term])[0] + late_count(term)
            return counted[term]

        def scored(pairs: list[tuple[Any, tuple[list[str], bool]]]) -> list[tuple[float, int, Any]]:
            # the phrase adds nothing to a record that does not hold it: left out, the same scores
            held = phrase if phrase is not None and any(_ranking.holds_phrase(d[0], phrase) for _, d in pairs) else None
            values = _ranking.bm25([doc for _, doc in pairs], terms, held, n, frequency, average)
            return [(-value, int(row[0]), row) for (row, _), value in zip(pairs, values, strict=True)]

        best = scored(kept)
        # the phrase's bound, while it is not counted, as if no record held it (its rarest possible)
        bound = _Bound(terms, single, phrase, n, lambda t: counted.get(t, 0), average)
        order = sorted((-bound(tfs, length), seq) for seq, length, tfs in bounds)
        want = limit + 8  # a few spare, should one be damaged
        batch = want  # a bound is the score itself for most records: the first batch is usually all
        while order:
            best.sort(key=lambda s: s[:2])
            if len(best) >= want and order[0] > best[want - 1][:2]:
                break  # no candidate left can rank among the best
            seqs = [seq for _, seq in order[:batch]]
            del order[:batch]
            batch = min(batch * 2, SEARCH_CANDIDATES)
            rows = conn.execute(VISIBLE + " AND r.seq = ANY(%s)", (agent_id, seqs), binary=True).fetchall()
            fetched = [(row, _ranked_words(bytes(row[3]))) for row in rows]
            best += scored([(row, doc) for row, doc in fetched if doc is not None])
        best.sort(key=lambda s: s[:2])
        return decode([row for _, _, row in best[:want]], max_chars)[0][:limit]

    _MARK_AND_COUNTS = (
        # no parallel workers for the rest of the search: starting one costs more than the few
        # hundred rows it would share (set here: no round trip of its own)
        "SELECT j.seq, j.indexed_seq, set_config('max_parallel_workers_per_gather', '0', true), "
        "ARRAY(SELECT CASE WHEN to_tsquery('simple', u.quoted)::text = u.quoted THEN "
        "coalesce((SELECT c.n FROM cmdc_terms c WHERE c.agent_id = %(agent)s AND c.word = u.term), 0) END "
        "FROM unnest(%(terms)s::text[], %(quoted)s::text[]) WITH ORDINALITY AS u(term, quoted, i) ORDER BY u.i) "
        "FROM cmdc_journals j WHERE j.agent_id = %(agent)s"
    )
    """The agent's journal mark, and each query word's count of its indexed records holding it,
    from `cmdc_terms`; NULL for a word the search configuration does not keep as that one lexeme
    (an identifier it splits, a character it drops): that one is counted through the index
    (`_FREQUENCY`)."""

    _FREQUENCY = (
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM cmdc_search WHERE agent_id = %(agent)s "
        "AND words @@ to_tsquery('simple', u.q) LIMIT %(cap)s) f) "
        "FROM unnest(%(qs)s::text[]) WITH ORDINALITY AS u(q, i) ORDER BY u.i"
    )

    def _average_length(self, conn: psycopg.Connection[Any], agent_id: str, seq: int) -> float:
        """The mean length in words of the agent's records, from its latest `_AVERAGE_SAMPLE`
        (learned again when the journal grew by a tenth)."""
        known = self._averages.get(agent_id)
        if known is not None and seq - known[0] <= max(64, known[0] // 10):
            return known[1]
        rows = conn.execute(
            "SELECT seq, 0, 0, message, crc FROM cmdc_records WHERE agent_id = %s ORDER BY seq DESC LIMIT %s",
            (agent_id, _AVERAGE_SAMPLE),
            binary=True,
        ).fetchall()
        sample = decode(rows, _ranking.TEXT_CHARS)[0]
        lengths = [len(_ranking.tokens(_ranking.record_text(r.message))) for r in sample]
        average = sum(lengths) / len(lengths) if lengths else 1.0
        if len(self._averages) > 10_000:
            self._averages.clear()
        self._averages[agent_id] = (seq, average)
        return average

    # The candidates in the index, by their vectors alone (each one's length and occurrences of
    # the query words are read from its text form, `_vector_counts`); the message is read later,
    # if the candidate can rank among the best.
    _INDEXED = (
        "SELECT s.seq, s.words::text, {stage} FROM cmdc_search s WHERE s.agent_id = %(agent)s "
        "AND s.seq <= %(indexed)s AND s.words @@ {match} {extra}LIMIT %(cap)s"
    )
    _NOT_EVERY = "AND NOT s.words @@ to_tsquery('simple', %(every)s) "
    # Those past the mark (not indexed yet: the indexer's lag, a batch or so), matched by the
    # same vector, visible ones only, read whole.
    _LATE = (
        "SELECT r.seq, r.compaction, r.ts, r.message, r.crc FROM cmdc_records r "
        "JOIN cmdc_attempts a ON a.agent_id = r.agent_id AND a.attempt = r.attempt AND a.committed, "
        "LATERAL (SELECT " + VECTOR.format(r="r") + " AS words) v "
        "WHERE r.agent_id = %(agent)s AND r.seq > %(indexed)s AND v.words @@ to_tsquery('simple', %(q)s) "
        "ORDER BY r.seq LIMIT %(cap)s"
    )

    def _candidates(
        self,
        conn: psycopg.Connection[Any],
        agent_id: str,
        groups: list[list[str]],
        counted: dict[str, int],
        terms: list[str],
        indexed: int,
        top: int,
    ) -> tuple[list[Any], list[tuple[int, int, list[int]]]]:
        """The rows past the mark holding any query word (whole, at most `SEARCH_CANDIDATES`),
        and the indexed candidates as (seq, length, occurrences of each word): at most
        `SEARCH_CANDIDATES` holding every word (in some form: `groups`), then as many more
        holding some, shared among the words rarest first (`counted`: the indexed records
        holding each), each word's share at most its count, so a rare word's records are all
        candidates however many records hold a common one. A small journal is searched
        through its agent's lexeme in the index: other agents' matches are never read, and the
        lexeme's own entries are few. A large one by its words alone (its lexeme's entries
        would cost more to read than the other agents' matches the filter drops, which its own
        matches outnumber)."""
        cap = SEARCH_CANDIDATES if top > SEARCH_ALL_BELOW else max(SEARCH_CANDIDATES, top)
        tsqueries = [" | ".join(_lexeme(t) for t in g) for g in groups]
        every = " & ".join(q if len(g) == 1 else f"({q})" for q, g in zip(tsqueries, groups, strict=True))
        late: list[Any] = []
        if top > indexed:
            past = {"agent": agent_id, "indexed": indexed, "q": " | ".join(tsqueries), "cap": cap}
            late = conn.execute(self._LATE, past, binary=True).fetchall()
        narrow = top <= SEARCH_NARROW_BELOW
        match = "to_tsquery('simple', %({q})s)"
        if narrow:  # (a query the configuration keeps no lexeme of stays empty: `'' && mine` would be every record)
            match = f"(CASE WHEN numnode({match}) = 0 THEN {match} ELSE {match} && %(mine)s::tsquery END)"
        args: dict[str, Any] = {
            "every": every,
            "agent": agent_id,
            "indexed": indexed,
            "mine": f"'cmdc agent={agent_id}'",  # agent ids hold no quote or backslash
            "cap": cap,
        }
        parts = ["(" + self._INDEXED.format(match=match.format(q="every"), extra="", stage=0) + ")"]
        if len(groups) > 1:  # then those holding some words, rarest first (one statement: one round trip)
            rarity = sorted(
                (sum(counted.get(t, 0) for t in g), tsqueries[i])
                for i, g in enumerate(groups)
                if any(counted.get(t) for t in g)
            )
            if len(rarity) > _SOME_LOOKUPS:  # the commonest words share one lookup (a long query)
                rest = rarity[_SOME_LOOKUPS - 1 :]
                rarity[_SOME_LOOKUPS - 1 :] = [(sum(h for h, _ in rest), " | ".join(q for _, q in rest))]
            left = cap
            for k, (held, tsq) in enumerate(rarity):
                share = min(held, left // (len(rarity) - k))
                left -= share
                if share:
                    args[f"q{k}"], args[f"cap{k}"] = tsq, share
                    some = self._INDEXED.format(match=match.format(q=f"q{k}"), extra=self._NOT_EVERY, stage=1)
                    parts.append("(" + some.replace("%(cap)s", f"%(cap{k})s") + ")")
        found: dict[int, str] = {}
        for seq, words, _ in conn.execute(" UNION ALL ".join(parts), args).fetchall():
            found.setdefault(int(seq), str(words))
        return late, [(seq, *_vector_counts(words, terms)) for seq, words in found.items()]


__all__ = [
    "SEARCH_ALL_BELOW",
    "SEARCH_CANDIDATES",
    "SEARCH_DF_MAX",
    "SEARCH_NARROW_BELOW",
    "SEARCH_UNINDEXED_MAX",
    "SearchRows",
]
