"""Issue 28: search ranked by rarity (BM25) on both stores, the same top 5 on both, and hostile
queries that stay plain words."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cmdc import Message
from cmdc.message import KIND_KEY, SUMMARY_KIND
from cmdc.store import Store, open_store


@pytest.fixture(params=["file", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "file":
        made: Store = open_store(tmp_path / "store")
    else:
        made = open_store(request.getfixturevalue("postgres_url"))
    await made.start()
    try:
        yield made
    finally:
        await made.aclose()


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
]


async def top(store: Store, query: str, n: int = 5) -> list[int]:
    return [r.seq for r in await store.search("a1", query, limit=n)]


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
    assert [len(r) for r in results["file"]] == [5, 2, 5, 5, 5, 5]  # "E4127" is in two records only


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
