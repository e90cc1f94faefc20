"""Issue 28: search ranked by rarity (BM25) on both stores, the same top 5 on both, and hostile
queries that stay plain words."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cmdc import Message, OffloadStore, ToolCall
from cmdc.message import KIND_KEY, SUMMARY_KIND
from cmdc.store import Store, open_store
from cmdc.store.file.store import FileStore


def corpus() -> list[Message]:
    """A session's journal: many lines about ports and the billing module, one record holding
    the rare `svc129`, one the error `E4127` in `src/billing/mod_7.py`, and summaries quoting
    them among many other port lines."""
    msgs = [
        Message.user(f"note {i}: the service on port {8000 + i} restarted; port checks passed for the billing module")
        for i in range(60)
    ]
    msgs[17] = Message.user("remember: svc129 must listen on port 8443, the user said so")
    msgs[41] = Message.tool_result("c41", "build failed with error E4127 in src/billing/mod_7.py at line 88")
    msgs[50] = Message.user("the billing module owner asked for a port audit next week")
    quoted = "; ".join(f"port {8000 + i} restarted" for i in range(20))
    msgs.append(
        Message.user(
            f"[Conversation summary #1] svc129 listens on port 8443. {quoted}. Build error E4127 "
            "in src/billing/mod_7.py was seen; svc129 port svc129 port.",
            metadata={KIND_KEY: SUMMARY_KIND},
        )
    )
    msgs.append(
        Message.user(
            "[Conversation summary #2] ports: " + " ".join(f"port {9000 + i}" for i in range(30)),
            metadata={KIND_KEY: SUMMARY_KIND},
        )
    )
    return msgs


QUERIES = [
    "svc129 port",
    "E4127",
    "src/billing/mod_7.py",
    "port restarted",
    "billing module owner",
    "mod_7",
    "port audit",
    "why did the build fail",
    "which ports restart",
]


async def top(store: Store, query: str, n: int = 5) -> list[int]:
    return [r.seq for r in await store.search("a1", query, limit=n)]


@pytest.fixture(params=["file", "file without its index", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Each store, started, and closed after the test; the file store also without its index
    (`index=False`, as in a directory it cannot write): it ranks alike, over a scan."""
    if request.param == "postgres":
        made: Store = open_store(str(request.getfixturevalue("postgres_url")))
    else:
        files = FileStore(tmp_path / "s")
        if request.param != "file":
            files.journal = OffloadStore(files.root, index=False)
        made = files
    await made.start()
    try:
        yield made
    finally:
        await made.aclose()


async def test_the_same_records_in_the_same_order_with_or_without_the_index(tmp_path: Path) -> None:
    """The file store's search without its index (a scan, `best_matches`) gives what its index
    gives: every match, in the same order, for every query of the shared corpus and more."""
    indexed, scanned = OffloadStore(tmp_path), OffloadStore(tmp_path, index=False)
    msgs = corpus()
    msgs[5] = Message.user("the changelog needs a line for the port audit; fails, failed, failing")
    call = ToolCall("c9", "read", {"path": "src/billing/mod_7.py"})
    msgs[9] = Message.assistant("Calling the reader", tool_calls=(call,))
    await indexed.append("a1", msgs, compaction=1)
    queries = [*QUERIES, "SRC/Billing/MOD_7.PY", "failing builds", "restart", "changes", "teh", "the"]
    queries += ["read mod_7.py", "port " * 30, "svc129 \U0001f600 ß naïve", "what is the port of svc129"]
    queries += ['"port audit"', "E4127 OR port"]
    for query in queries:
        for limit in (1, 5, 1000):
            want = [r.seq for r in await indexed.search("a1", query, limit=limit)]
            assert [r.seq for r in await scanned.search("a1", query, limit=limit)] == want, (query, limit)
    clipped = await scanned.search("a1", "svc129", limit=1, max_chars=8)
    assert clipped[0].message.text == "remember" and clipped[0].clipped > 0


async def test_rare_words_and_identifiers_rank_first(store: Store) -> None:
    msgs = corpus()
    await store.append("a1", msgs, compaction=1)
    svc, error, summary = 18, 42, 61  # record numbers of msgs[17], msgs[41] and the first summary
    # the rare word outweighs the common one; the summary quoting it (more often) comes after
    hits = await top(store, "svc129 port")
    assert hits[0] == svc and summary in hits and hits.index(summary) > 0
    # an exact identifier ranks first, its summary after it
    assert (await top(store, "E4127"))[:2] == [error, summary]
    assert (await top(store, "src/billing/mod_7.py"))[0] == error
    assert (await top(store, "SRC/Billing/MOD_7.PY"))[0] == error  # case does not matter
    # the query's words in a row (a phrase) rank above the same words apart
    assert (await top(store, "port audit"))[0] == 51
    # a record holding the rarest word is first, however often the common ones occur elsewhere
    assert (await top(store, "billing module owner"))[0] == 51


async def test_word_forms_and_stop_words(store: Store) -> None:
    """A word finds its other forms (`fail` finds `failed`, `restart` finds `restarted`), never
    a longer word that merely starts with it; a stop word matches only as typed."""
    msgs = corpus()
    msgs[5] = Message.user("the changelog needs a line for the port audit")
    await store.append("a1", msgs, compaction=1)
    assert (await top(store, "why did the build fail"))[0] == 42  # "build failed with error E4127"
    assert 42 in await top(store, "failing builds")
    assert len(await store.search("a1", "restart", limit=100)) == 57  # the 56 notes "restarted" and summary 1
    assert 6 not in await top(store, "changes", 100)  # "changelog" is no form of "change"
    assert await top(store, "teh") == []  # no fuzzy matching: a misspelling finds nothing


async def test_identifier_parts_match_on_the_file_store(tmp_path: Path) -> None:
    """The file store also finds an identifier by its parts (PostgreSQL's parser keeps a file
    path whole, so there only the whole path or its plain words match)."""
    store = open_store(tmp_path / "s")
    await store.append("a1", corpus(), compaction=1)
    assert (await top(store, "mod_7"))[0] == 42
    assert (await top(store, "mod_7.py"))[0] == 42


async def test_the_same_top_five_on_both_stores(tmp_path: Path, postgres_url: str) -> None:
    """The shared conformance ranking: the same corpus and queries give the same top 5."""
    results: dict[str, list[list[int]]] = {}
    for name, target in (("file", str(tmp_path / "s")), ("postgres", postgres_url)):
        store = open_store(target)
        await store.start()
        try:
            await store.append("a1", corpus(), compaction=1)
            index = getattr(store, "index", None)
            if callable(index):
                await index("a1")
            results[name] = [await top(store, q) for q in QUERIES if q != "mod_7"]
        finally:
            await store.aclose()
    assert results["file"] == results["postgres"]
    assert [len(r) for r in results["file"]] == [5, 2, 5, 5, 5, 5, 2, 5]  # "E4127", "build", "fail": two records each


HOSTILE = [
    '"',
    '""',
    '"svc129',
    "svc129*",
    "*",
    "NEAR(svc129 port)",
    "svc129 AND port",
    "svc129 OR",
    "AND",
    "NOT svc129",
    "-svc129",
    "svc129 - port",
    "body:svc129",
    "rowid:1",
    "^svc129",
    "(svc129",
    "svc129)",
    "((((((",
    "{body} : svc129",
    "svc129'; DROP TABLE recs; --",
    "svc129' | 'port",
    "svc129 <-> port",
    "!svc129 & port",
    "svc129\x00port",
    "\x00" * 100,
    "\ud800svc129",
    "\udfff",
    "svc129 \U0001f600 ß Straße 東京 naïve",
    "svc129 " + "x" * 200_000,
    "the",  # a stop word alone is searched for
    "what is the and or not near",  # stop words and FTS5's keywords, lower case
    "svc129 " + "what is the " * 1_500,  # stop words and their pairs, thousands of them
    "svc129 " + " ".join(f"fail{s}" for s in ("", "s", "ed", "ing", "ure") * 40),  # word forms, repeated
    '"svc129 port" "port svc129"',  # quoted phrases are words

    " ".join(f"w{i}" for i in range(5_000)) + " svc129",
]


@pytest.mark.parametrize("query", HOSTILE, ids=range(len(HOSTILE)))
async def test_hostile_queries_are_plain_words(store: Store, query: str) -> None:
    await store.append("a1", corpus(), compaction=1)
    hits = await store.search("a1", query, limit=5)
    assert isinstance(hits, list)
    holds_word = "svc129" in query[:4000] and query.count("\x00") < 50
    if holds_word and "w1 " not in query:
        assert 18 in [r.seq for r in hits]  # the plain word in it is found, the rest is words too
    assert [r.seq for r in await store.read_range("a1", 1, 200)] == list(range(1, 63))  # nothing dropped


@pytest.fixture
async def capped_postgres(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Store]:
    """A PostgreSQL store searching as it does a large journal: by the words alone, at most 5
    candidates; started, and closed after the test."""
    from cmdc.store.postgres import search as pg_search

    monkeypatch.setattr(pg_search, "SEARCH_CANDIDATES", 5)
    monkeypatch.setattr(pg_search, "SEARCH_NARROW_BELOW", 0)
    monkeypatch.setattr(pg_search, "SEARCH_ALL_BELOW", 0)
    store = open_store(postgres_url)
    await store.start()
    try:
        yield store
    finally:
        await store.aclose()


async def test_postgres_candidates_hold_every_word_in_some_form(capped_postgres: Store) -> None:
    """PostgreSQL takes its bounded candidates first among the records holding every word of
    the query in some form (a word's forms are one group): with more records holding one word
    than candidates, the one holding both is still found."""
    store = capped_postgres
    msgs = [Message.user(f"build {i} finished fine") for i in range(40)]
    msgs[33] = Message.user("the build failed at step 3")
    await store.append("a1", msgs, compaction=1)
    await store.index("a1")  # type: ignore[attr-defined]
    assert (await top(store, "build fails"))[0] == 34  # "build" is held: as typed; "fails" is not: its forms
    hits = await store.search("a1", "builds", limit=5)  # "builds" is not held: "build" is searched
    assert len(hits) == 5 and all("build " in r.message.text for r in hits)


async def test_postgres_candidates_keep_every_record_of_a_rare_word(capped_postgres: Store) -> None:
    """PostgreSQL's candidates holding some of the words are shared among the words rarest
    first: with far more records holding a common word than candidates, the one record holding
    the rare word (written last, after every common one) is still ranked, and first."""
    store = capped_postgres
    msgs = [Message.user(f"port {8000 + i} is open") for i in range(60)]
    msgs += [Message.user("svc129 listens there"), Message.user("gamma svc7 delta kappa lambda mu")]
    await store.append("a1", msgs, compaction=1)
    await store.index("a1")  # type: ignore[attr-defined]
    assert (await top(store, "svc129 port"))[0] == 61
    assert (await top(store, "port svc7 svc129"))[:2] in ([61, 62], [62, 61])  # both rare words' records
    # ten words: the commonest share one index lookup; the rare ones' records still rank first
    assert (await top(store, "port open gamma delta svc7 svc129 listens kappa lambda mu"))[:2] == [62, 61]
    hits = await store.search("a1", "svc129 port", limit=5)
    assert len(hits) == 5 and sum("port" in r.message.text for r in hits) == 4


async def test_a_word_some_record_holds_is_searched_as_typed(store: Store) -> None:
    """Word forms are the fallback for a word no record holds: a rarer form never outweighs the
    word as typed (`foxes` beside `fox`), on both stores."""
    msgs = [Message.user("the fox"), Message.user("a fox and a fox"), Message.user("foxes everywhere, fox")]
    msgs += [Message.user("a dog"), Message.user("dogs")]
    await store.append("a1", msgs, compaction=1)
    index = getattr(store, "index", None)
    if callable(index):
        await index("a1")
    assert sorted(await top(store, "fox")) == [1, 2, 3] and (await top(store, "fox"))[-1] == 3  # longest last
    assert await top(store, "foxes") == [3]
    assert sorted(await top(store, "puppy dog")) == [4]  # "dog" is held: "dogs" is not searched for
    assert sorted(await top(store, "cats and dogged")) == [4, 5]  # "dogged": not held, its forms dog, dogs


async def test_a_small_journal_ranks_every_record_holding_a_word(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below `SEARCH_ALL_BELOW` records PostgreSQL ranks every record holding a query word, not
    `SEARCH_CANDIDATES` of them: none of a small journal's matches is left out unranked."""
    from cmdc.store.postgres import search as pg_search

    monkeypatch.setattr(pg_search, "SEARCH_CANDIDATES", 5)
    store = open_store(postgres_url)
    await store.start()
    try:
        msgs = [Message.user(f"port {8000 + i} is open") for i in range(40)]
        msgs[37] = Message.user("port 8037 is open, port 8037 is the gateway's port")
        await store.append("a1", msgs, compaction=1)
        await store.index("a1")  # type: ignore[attr-defined]
        assert len(await store.search("a1", "port gateway", limit=30)) == 30
        assert (await top(store, "port gateway"))[0] == 38
        monkeypatch.setattr(pg_search, "SEARCH_ALL_BELOW", 0)  # capped: at most 5 + 5 ranked
        assert len(await store.search("a1", "port", limit=30)) <= 10
    finally:
        await store.aclose()


async def test_a_query_of_characters_the_search_drops_matches_nothing(store: Store) -> None:
    """`___`, `½` or a 3,000-character word hold no word either store indexes as such: no record
    is a match (PostgreSQL's empty query once matched every record of the agent)."""
    msgs = [Message.user(t) for t in ("hello world", "other words", "snake_case_name here", "__init__ file")]
    await store.append("a1", msgs, compaction=1)
    index = getattr(store, "index", None)
    if callable(index):
        await index("a1")
    for query in ("___", "½", "x" * 3000):
        assert await store.search("a1", query) == [], query


async def test_a_large_journal_without_its_index_is_searched_by_the_lines_that_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `SCAN_RANKED_BYTES` the scan reads only the lines holding a word the query can match,
    and estimates the records' number and mean length from the message lines and a sample of
    them: over a journal the sample covers, the estimates are exact and the ranking the index's."""
    from cmdc.store.file import journal

    indexed = OffloadStore(tmp_path)
    await indexed.append("a1", corpus(), compaction=1)
    monkeypatch.setattr(journal, "SCAN_RANKED_BYTES", 0)
    scanned = OffloadStore(tmp_path, index=False)
    assert [r.seq for r in await scanned.search("a1", "svc129", limit=5)] == [18, 61]  # the record, then its summary
    for query in [*QUERIES, "failing builds", "restart", "the"]:
        want = [r.seq for r in await indexed.search("a1", query, limit=1000)]
        assert [r.seq for r in await scanned.search("a1", query, limit=1000)] == want, query
    from cmdc.store.search import record_text, tokens

    lengths = [len(tokens(record_text(m))) for m in corpus()]
    assert journal._estimates((tmp_path / "a1.jsonl").read_bytes()) == (62, sum(lengths) / len(lengths))


async def test_a_damaged_line_is_skipped_alike_by_both_scans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line damaged in place (its checksum no longer matches) is left out by the whole scan and
    by the matching-lines one, and by the sample `_estimates` reads, so both rank alike."""
    from cmdc.store.file import journal

    store = OffloadStore(tmp_path, index=False)
    await store.append("a1", corpus(), compaction=1)
    path = tmp_path / "a1.jsonl"
    data = path.read_bytes()
    at = data.index(b"svc129 must listen")
    path.write_bytes(data[:at] + b"svc129 mus7" + data[at + len(b"svc129 must") :])  # record 18, damaged
    whole = [[r.seq for r in await store.search("a1", q, limit=1000)] for q in QUERIES]
    monkeypatch.setattr(journal, "SCAN_RANKED_BYTES", 0)
    assert [[r.seq for r in await store.search("a1", q, limit=1000)] for q in QUERIES] == whole
    assert 18 not in whole[0] and whole[0][0] == 61  # the summary is all that holds svc129 now
