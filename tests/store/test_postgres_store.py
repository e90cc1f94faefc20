"""What only the PostgreSQL store has: schema versions, attempts and commits in SQL, one
transaction for a checkpoint and the batches its summaries name, damaged rows, the search
index, and connection loss."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import trio

from cmdc import ConfigError, Message, State
from cmdc.errors import CmdcError, InvalidMessage, JournalLost, StoreUnavailable
from cmdc.offload import JournalRef
from cmdc.postgres import _MIGRATIONS, ATTEMPTS_KEY, SCHEMA_VERSION, PostgresStore, migrate
from cmdc.store.postgres import indexer
from cmdc.store.postgres import search as pg_search


@pytest.fixture
async def pg(postgres_url: str) -> AsyncIterator[PostgresStore]:
    store = await PostgresStore.open(postgres_url, retries=3, timeout=20)
    try:
        yield store
    finally:
        await store.aclose()


def sql(url: str, query: str, *args: object) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, args or None)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


async def test_schema_is_versioned_and_migrations_are_idempotent(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        assert migrate(conn) == 0
        assert migrate(conn) == SCHEMA_VERSION
    store = await PostgresStore.open(postgres_url)  # opening again migrates nothing
    await store.aclose()
    assert sql(postgres_url, "SELECT value FROM cmdc_meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
    sql(postgres_url, "UPDATE cmdc_meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(CmdcError, match="schema version 999"):
        await PostgresStore.open(postgres_url)


async def test_uncommitted_attempts_are_invisible_until_committed(pg: PostgresStore) -> None:
    msgs = [Message.user(f"evicted {i}") for i in range(3)]
    result = await pg.append("a1", msgs, compaction=1, attempt="k1", commit=False)
    assert result.written == 3
    assert await pg.records("a1") == [] and await pg.search("a1", "evicted") == []
    assert (await pg.verify("a1")).uncommitted == 3
    # a retry of the failed compaction, as a new attempt: same records, still one copy each
    retry = await pg.append("a1", msgs, compaction=1, attempt="k2", commit=False)
    assert retry.written == 0 and (retry.first_seq, retry.last_seq) == (1, 3)
    assert await pg.commit("a1", ["k1"])
    assert not await pg.commit("a1", ["k1"])  # already
    assert [r.seq for r in await pg.records("a1")] == [1, 2, 3]


async def test_a_known_id_with_other_content_inside_a_new_batch_is_refused_whole(pg: PostgresStore) -> None:
    """A batch of new messages is written without looking each one up (the unique index on
    message ids catches a known one); a known id with other content still refuses the batch."""
    old = Message.user("original")
    await pg.append("a1", [old])
    forged = Message.from_dict({**old.to_dict(), "content": "forged"})
    with pytest.raises(InvalidMessage, match="other content"):
        await pg.append("a1", [Message.user("new 1"), forged, Message.user("new 2")])
    assert [r.message.text for r in await pg.records("a1")] == ["original"]
    late = await pg.append("a1", [Message.user("new 3")], commit=False, attempt="k9")
    assert late.first_seq == 2 and late.pending == ("k9",)


async def test_a_checkpoint_commits_the_batches_its_summary_names_in_one_transaction(pg: PostgresStore) -> None:
    evicted = [Message.user(f"old {i}") for i in range(4)]
    await pg.append("a1", evicted, compaction=1, attempt="kabc", commit=False)
    summary = Message.user("summary of old", metadata={"cmdc.kind": "summary", ATTEMPTS_KEY: ["kabc"]})
    state = State(agent_id="a1").append(summary)
    assert await pg.records("a1") == []
    await pg.checkpoints.save(state)
    assert [r.message.id for r in await pg.records("a1")] == [m.id for m in evicted]
    assert await pg.checkpoints.load("a1") == state


async def test_damaged_rows_are_skipped_and_reported(pg: PostgresStore, postgres_url: str) -> None:
    await pg.append("a1", [Message.user(f"row {i}") for i in range(5)], compaction=1)
    sql(postgres_url, "UPDATE cmdc_records SET crc = crc + 1 WHERE seq = 2")
    sql(postgres_url, "UPDATE cmdc_records SET message = 'not json' WHERE seq = 4")
    assert [r.seq for r in await pg.records("a1")] == [1, 3, 5]
    report = await pg.verify("a1")
    assert report.damaged == (2, 4) and report.records == 3 and not report.clean
    sql(postgres_url, "UPDATE cmdc_checkpoints SET crc = 0")
    await pg.checkpoints.save(State(agent_id="a1"))
    sql(postgres_url, "UPDATE cmdc_checkpoints SET crc = crc + 1")
    with pytest.raises(CmdcError, match="checksum"):
        await pg.checkpoints.load("a1")


async def test_search_can_use_the_gin_index(pg: PostgresStore, postgres_url: str) -> None:
    await pg.append("a1", [Message.user(f"needle {i}" if i % 500 == 0 else f"hay {i}") for i in range(5000)])
    await pg.index()  # what the background indexer has not done yet
    sql(postgres_url, "ANALYZE cmdc_search")
    with psycopg.connect(postgres_url) as conn:
        plan = "\n".join(
            str(r[0])
            for r in conn.execute(
                "EXPLAIN SELECT seq FROM cmdc_search WHERE agent_id = 'a1' AND words @@ to_tsquery('simple', 'needle')"
            )
        )
    assert "cmdc_search_words" in plan
    assert len(await pg.search("a1", "needle", limit=100)) == 10
    # another agent's many matches are not read: the agent is a lexeme in the index
    await pg.append("b2", [Message.user(f"needle {i}") for i in range(5000)])
    await pg.index("b2")
    sql(postgres_url, "ANALYZE cmdc_search")
    with psycopg.connect(postgres_url) as conn:
        conn.execute("SET enable_seqscan = off")
        rows = conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF) SELECT seq FROM cmdc_search "
            "WHERE words @@ (to_tsquery('simple', 'needle') && $$'cmdc agent=a1'$$::tsquery)"
        ).fetchall()
    plan = "\n".join(str(r[0]) for r in rows)
    assert "Bitmap Index Scan on cmdc_search_words (actual" in plan and "rows=10 loops=1" in plan, plan
    # a search reads the index's pending list whole: it is kept short
    assert sql(postgres_url, "SELECT reloptions FROM pg_class WHERE relname = 'cmdc_search_words'") == [
        (["gin_pending_list_limit=256"],)
    ]
    hits = await pg.search("a1", "needle", limit=100)
    assert len(hits) == 10 and all(h.message.text.startswith("needle") for h in hits)
    assert len(await pg.search("b2", "needle 7", limit=3)) == 3


def marks(url: str) -> dict[str, tuple[int, int]]:
    """Each journal's (highest record number, indexed up to)."""
    return {str(a): (int(s), int(i)) for a, s, i in sql(url, "SELECT agent_id, seq, indexed_seq FROM cmdc_journals")}  # type: ignore[call-overload]


async def test_a_search_finds_committed_records_the_indexer_has_not_reached(postgres_url: str) -> None:
    """A journal batch commits without search vectors; until the indexer has put them in the
    index, a search reads those records directly: the same hits, in the same order."""
    async with PostgresStore(postgres_url, background_index=False) as store:
        texts = [f"alpha {'beta ' * (i % 3)}gamma {i}" for i in range(30)]
        await store.append("a1", [Message.user(t) for t in texts[:10]])
        await store.index()
        await store.append("a1", [Message.user(t) for t in texts[10:]])  # records 11-30: not indexed
        assert marks(postgres_url) == {"a1": (30, 10)}
        assert sql(postgres_url, "SELECT count(*) FROM cmdc_search") == [(10,)]
        queries = ["beta", "gamma 17", "alpha beta", "25", "gamma nothing", "nothing"]
        before = {q: [(r.seq, r.message.text) for r in await store.search("a1", q, limit=8)] for q in queries}
        assert [seq for seq, _ in before["beta"]] == [3, 6, 9, 12, 15, 18, 21, 24]  # twice, then once
        # BM25: the rare word first, then the common one in the shortest records (no "beta")
        assert [seq for seq, _ in before["gamma 17"]] == [18, 1, 4, 7, 10, 13, 16, 19]
        assert before["25"] == [(26, "alpha beta gamma 25")]
        assert len(before["gamma nothing"]) == 8 and before["nothing"] == []
        # uncommitted records stay invisible on both sides of the mark
        await store.append("a1", [Message.user("hidden gamma")], attempt="kx", commit=False)
        assert await store.search("a1", "hidden") == []
        assert await store.index() == 21
        assert marks(postgres_url) == {"a1": (31, 31)}
        after = {q: [(r.seq, r.message.text) for r in await store.search("a1", q, limit=8)] for q in queries}
        assert after == before, {q: (before[q], after[q]) for q in queries if before[q] != after[q]}
        assert await store.search("a1", "hidden") == []
        await store.commit("a1", ["kx"])
        assert [r.message.text for r in await store.search("a1", "hidden")] == ["hidden gamma"]
        assert await store.index() == 0  # nothing left; the vector is not written twice
        assert sql(postgres_url, "SELECT count(*), count(DISTINCT seq) FROM cmdc_search") == [(31, 31)]


async def test_a_words_forms_are_searched_as_the_records_tell_indexed_or_not(postgres_url: str) -> None:
    """Whether some record holds a word as typed (then its forms are not searched) is read from
    the words' counts for indexed records and from the records themselves past the mark: the
    same answers before and after indexing."""
    async with PostgresStore(postgres_url, background_index=False) as store:
        await store.append("a1", [Message.user("the build failed"), Message.user("it fails often")])
        for _ in range(2):  # past the mark, then indexed
            assert [r.seq for r in await store.search("a1", "fails")] == [2]  # held: as typed
            assert sorted(r.seq for r in await store.search("a1", "fail")) == [1, 2]  # not held: its forms
            assert sorted(r.seq for r in await store.search("a1", "builds failing")) == [1, 2]
            assert await store.search("a1", "nowhere") == []
            await store.index("a1")
        assert marks(postgres_url) == {"a1": (2, 2)}


async def test_a_search_indexes_a_large_backlog_first(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_search, "SEARCH_UNINDEXED_MAX", 10)
    async with PostgresStore(postgres_url, background_index=False) as store:
        await store.append("a1", [Message.user(f"word {i}") for i in range(10)])
        assert [r.seq for r in await store.search("a1", "word 3")][:1] == [4]
        assert marks(postgres_url) == {"a1": (10, 0)}  # ten read directly
        await store.append("a1", [Message.user("word 10")])
        assert [r.seq for r in await store.search("a1", "word 10")][:1] == [11]
        assert marks(postgres_url) == {"a1": (11, 11)}  # eleven: indexed first


async def test_a_writer_that_outruns_the_indexer_indexes_its_share(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(indexer, "INDEX_LAG_MAX", 10)
    monkeypatch.setattr(indexer, "INDEX_BATCH", 4)
    async with PostgresStore(postgres_url, background_index=False) as store:
        await store.append("a1", [Message.user(f"a {i}") for i in range(8)])
        assert marks(postgres_url) == {"a1": (8, 0)}
        await store.append("a1", [Message.user(f"b {i}") for i in range(8)])  # lag 16: it indexes 6
        assert marks(postgres_url) == {"a1": (16, 6)}
        await store.append("a1", [Message.user(f"c {i}") for i in range(3)])  # lag 13: it indexes 3
        assert marks(postgres_url) == {"a1": (19, 9)}
        await store.append("a1", [Message.user(f"d {i}") for i in range(30)])  # lag 40: 30 (as it wrote)
        assert marks(postgres_url) == {"a1": (49, 39)}
        assert sql(postgres_url, "SELECT count(*) FROM cmdc_search") == [(39,)]
        assert [r.message.text for r in await store.search("a1", "d 29")][:1] == ["d 29"]


async def wait_indexed(url: str, bound: float = 30.0) -> dict[str, tuple[int, int]]:
    with trio.fail_after(bound):
        while True:
            now = marks(url)
            if all(i == s for s, i in now.values()):
                return now
            await trio.sleep(0.02)


async def test_the_background_indexer_catches_up_and_a_backlog_is_indexed_at_open(postgres_url: str) -> None:
    async with PostgresStore(postgres_url, background_index=False) as quiet:
        await quiet.append("a1", [Message.user(f"old {i}") for i in range(7)])
        await quiet.append("b2", [Message.user(f"older {i}") for i in range(3)])
    assert marks(postgres_url) == {"a1": (7, 0), "b2": (3, 0)}  # as a process that died would leave it
    async with PostgresStore(postgres_url) as store:  # finds the backlog when it opens
        assert await wait_indexed(postgres_url) == {"a1": (7, 7), "b2": (3, 3)}
        for batch in range(5):  # and indexes each batch after it commits
            await store.append("a1", [Message.user(f"new {batch} {i}") for i in range(200)])
        assert await wait_indexed(postgres_url) == {"a1": (1007, 1007), "b2": (3, 3)}
        assert sql(postgres_url, "SELECT count(*) FROM cmdc_search") == [(1010,)]
        assert (await store.search("a1", "new 4 199"))[0].message.text == "new 4 199"
        # a compaction's batch (an attempt committed later) is indexed once committed, by
        # `commit` or by the checkpoint whose summary names it
        await store.append("a1", [Message.user(f"evicted {i}") for i in range(5)], attempt="k1", commit=False)
        await store.append("b2", [Message.user(f"evicted {i}") for i in range(5)], attempt="k2", commit=False)
        await trio.sleep(0.2)
        assert marks(postgres_url) == {"a1": (1012, 1007), "b2": (8, 3)}  # not while the compaction runs
        await store.commit("a1", ["k1"])
        summary = Message.user("summary", metadata={"cmdc.kind": "summary", ATTEMPTS_KEY: ["k2"]})
        await store.checkpoints.save(State(agent_id="b2").append(summary))
        assert await wait_indexed(postgres_url) == {"a1": (1012, 1012), "b2": (8, 8)}


def analyses(url: str) -> dict[str, int]:
    """ANALYZE runs per table, autovacuum's not counted."""
    rows = sql(
        url, "SELECT relname, analyze_count FROM pg_stat_user_tables WHERE relname IN ('cmdc_search', 'cmdc_records')"
    )
    return {str(t): int(n) for t, n in rows}  # type: ignore[call-overload]


def has_statistics(url: str) -> bool:
    """Whether the planner has statistics on the search vectors (what picks the GIN index)."""
    return sql(url, "SELECT count(*) FROM pg_stats WHERE tablename = 'cmdc_search' AND attname = 'words'") == [(1,)]


async def test_indexing_many_records_gives_the_planner_statistics(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A freshly filled search table has no statistics until autovacuum gets to it (a minute
    or more later), and the planner then reads a large journal's rows by primary key instead of
    the GIN index: the store analyzes the tables itself past `ANALYZE_MIN` records, then each
    time the table has doubled since."""
    monkeypatch.setattr(indexer, "ANALYZE_MIN", 300)
    async with PostgresStore(postgres_url, background_index=False) as store:
        await store.append("a1", [Message.user(f"first {i}") for i in range(250)])
        assert await store.index() == 250
        assert analyses(postgres_url) == {"cmdc_search": 0, "cmdc_records": 0}  # fewer than 300
        await store.append("b2", [Message.user(f"second {i}") for i in range(100)])
        assert await store.index() == 100
        assert analyses(postgres_url) == {"cmdc_search": 1, "cmdc_records": 1}
        assert has_statistics(postgres_url)
        await store.append("a1", [Message.user(f"third {i}") for i in range(300)])
        assert await store.index() == 300  # 300 since: not yet double the 350 analyzed
        assert analyses(postgres_url) == {"cmdc_search": 1, "cmdc_records": 1}
        await store.append("a1", [Message.user(f"fourth {i}") for i in range(60)])
        assert await store.index() == 60  # 360 since
        assert analyses(postgres_url) == {"cmdc_search": 2, "cmdc_records": 2}
        assert [r.message.text for r in await store.search("a1", "fourth 59")][:1] == ["fourth 59"]


async def test_the_background_indexer_analyzes_and_a_store_opened_later_finishes_the_count(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(indexer, "ANALYZE_MIN", 300)
    async with PostgresStore(postgres_url) as store:  # the indexer thread analyzes, unasked
        await store.append("a1", [Message.user(f"word {i}") for i in range(400)])
        with trio.fail_after(30):
            while True:
                if analyses(postgres_url) == {"cmdc_search": 1, "cmdc_records": 1}:
                    break
                await trio.sleep(0.02)
        assert has_statistics(postgres_url)
    # a process that indexed many records and ended before analyzing: the next store to open
    # counts them (the server's count of rows changed since the last analysis) and analyzes
    monkeypatch.setattr(indexer, "ANALYZE_MIN", 10**9)
    async with PostgresStore(postgres_url, background_index=False) as quiet:
        await quiet.append("b2", [Message.user(f"later {i}") for i in range(500)])
        assert await quiet.index() == 500
    changed = "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'cmdc_search'"
    with trio.fail_after(30):  # the server counts the changes once the writer's session reports them
        while True:
            if int(sql(postgres_url, changed)[0][0]) >= 500:  # type: ignore[call-overload]
                break
            await trio.sleep(0.05)
    monkeypatch.setattr(indexer, "ANALYZE_MIN", 300)
    async with PostgresStore(postgres_url, background_index=False) as store:
        assert await store.index() == 0
        assert analyses(postgres_url) == {"cmdc_search": 2, "cmdc_records": 2}


async def test_an_analysis_that_cannot_get_its_lock_is_skipped_and_retried(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another session analyzing (or holding) the tables does not fail indexing: the store's
    analysis gives up after its lock timeout and the next indexing tries again."""
    monkeypatch.setattr(indexer, "ANALYZE_MIN", 100)
    async with PostgresStore(postgres_url, background_index=False) as store:
        await store.append("a1", [Message.user(f"word {i}") for i in range(150)])
        with psycopg.connect(postgres_url) as other:  # holds the lock ANALYZE needs
            other.execute("LOCK TABLE cmdc_search IN SHARE UPDATE EXCLUSIVE MODE")
            assert await store.index() == 150
            assert analyses(postgres_url) == {"cmdc_search": 0, "cmdc_records": 0}
            other.rollback()
        assert await store.index() == 0  # nothing to index, but the count is still owed
        assert analyses(postgres_url) == {"cmdc_search": 1, "cmdc_records": 1}


async def test_an_indexer_that_loses_its_connection_reports_it_and_searches_stay_right(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The indexer thread's connection dies mid-batch (the server ends its session): the batch
    rolls back, the thread reports it (an `index_retry` event, logged) and tries again on a new
    connection after a backoff; every search finds every committed record meanwhile (those past
    the mark are read directly), and the index catches up without another batch."""
    real = PostgresStore._index_sync
    killed: list[int] = []

    def dying(self: PostgresStore, conn: psycopg.Connection[Any], agent_id: str, batch: int) -> tuple[int, bool]:
        if threading.current_thread().name == "cmdc-postgres-indexer" and not killed:
            killed.append(1)
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")  # as a server restart would
        return real(self, conn, agent_id, batch)

    monkeypatch.setattr(PostgresStore, "_index_sync", dying)
    texts = [f"note {i} about {'apples' if i % 2 else 'pears'}" for i in range(40)]
    seen: list[Any] = []  # the store's own sink (the log's output depends on how logging is set up)
    async with PostgresStore(postgres_url, on_event=seen.append) as store:
        await store.append("a1", [Message.user(t) for t in texts])
        hits = await store.search("a1", "apples", limit=100)
        assert sorted(r.message.text for r in hits) == sorted(t for t in texts if "apples" in t)
        assert await wait_indexed(postgres_url) == {"a1": (40, 40)}  # retried on its own
        assert killed and any(e.kind == "index_retry" and e.agent_id == "a1" for e in seen)
        again = await store.search("a1", "apples", limit=100)
        assert sorted(r.seq for r in again) == sorted(r.seq for r in hits)


async def test_two_indexers_at_once_write_each_vector_once(postgres_url: str) -> None:
    async with (
        PostgresStore(postgres_url, background_index=False) as one,
        PostgresStore(postgres_url, background_index=False) as two,
    ):
        await one.append("a1", [Message.user(f"word {i}") for i in range(12_000)])
        counts: list[int] = []

        async def run(store: PostgresStore) -> None:
            counts.append(await store.index("a1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, one)
            nursery.start_soon(run, two)
        assert sum(counts) >= 12_000
        assert sql(postgres_url, "SELECT count(*), count(DISTINCT seq) FROM cmdc_search") == [(12_000, 12_000)]
        assert marks(postgres_url) == {"a1": (12_000, 12_000)}
        assert len(await one.search("a1", "word", limit=20_000)) == pg_search.SEARCH_CANDIDATES


async def test_a_hostile_gap_in_record_numbers_does_not_stall_the_indexer(postgres_url: str) -> None:
    """A state naming a record far past the journal's end makes the successor journal number on
    from there: the indexer skips the empty range in one step instead of walking it."""
    async with PostgresStore(postgres_url, background_index=False) as store:
        first = await store.append("a1", [Message.user("one")])
        with pytest.raises(JournalLost):
            await store.append("a1", [Message.user("two")], expect=JournalRef(first.journal, 10**15))
        later = await store.append("a1", [Message.user("three")], expect=JournalRef(first.journal, 10**15))
        assert later.first_seq == 10**15 + 1
        with trio.fail_after(10):  # the writer indexed one (the lag counts numbers), this the other
            assert await store.index() == 1
        assert sql(postgres_url, "SELECT count(*) FROM cmdc_search") == [(2,)]
        assert marks(postgres_url) == {"a1": (10**15 + 1, 10**15 + 1)}
        assert [r.message.text for r in await store.search("a1", "one three")] == ["one", "three"]
        with pytest.raises(ConfigError):
            await store.index("not a valid id\n")


async def test_repair_drops_the_vectors_of_the_rows_it_moves(pg: PostgresStore, postgres_url: str) -> None:
    await pg.append("a1", [Message.user(f"row {i}") for i in range(5)])
    await pg.index()
    sql(postgres_url, "UPDATE cmdc_records SET crc = crc + 1 WHERE seq = 2")
    assert (await pg.repair("a1")).moved == 1
    assert sql(postgres_url, "SELECT seq FROM cmdc_search ORDER BY seq") == [(1,), (3,), (4,), (5,)]
    assert sorted(r.seq for r in await pg.search("a1", "row", limit=10)) == [1, 3, 4, 5]
    assert recounted(postgres_url) == stored_counts(postgres_url)  # row 1's words no longer counted
    assert ("a1", "1", 0) in sql(postgres_url, "SELECT agent_id, word, n FROM cmdc_terms")


RECOUNT = "SELECT s.agent_id, u.lexeme, count(*) FROM cmdc_search s, unnest(s.words) u GROUP BY 1, 2"


def recounted(url: str) -> set[tuple[object, ...]]:
    """Each agent's words and how many of its indexed records hold each, counted from the vectors."""
    return set(sql(url, RECOUNT))


def stored_counts(url: str) -> set[tuple[object, ...]]:
    return set(sql(url, "SELECT agent_id, word, n FROM cmdc_terms WHERE n > 0"))


async def test_word_counts_follow_the_indexer_and_the_pending_list_is_left_empty(
    pg: PostgresStore, postgres_url: str
) -> None:
    """`cmdc_terms` holds, per agent, how many indexed records hold each word (what a search
    reads a word's rarity from), kept in the indexer's transaction; each batch leaves the GIN
    index's pending list empty (every lookup reads all of it)."""
    await pg.append("a1", [Message.user(f"alpha beta{i % 3} svc{i}") for i in range(40)])
    await pg.append("b2", [Message.user("alpha gamma"), Message.user("alpha alpha")])
    pending = await pg.append("a1", [Message.user("alpha later")], commit=False)
    await pg.index()
    assert recounted(postgres_url) == stored_counts(postgres_url)
    assert ("a1", "alpha", 41) in stored_counts(postgres_url) and ("b2", "alpha", 2) in stored_counts(postgres_url)
    assert sql(postgres_url, "SELECT gin_clean_pending_list('cmdc_search_words'::regclass)") == [(0,)]
    await pg.commit("a1", pending.pending)
    await pg.append("a1", [Message.user("alpha beta1 svc7")])  # a word again, in a new record
    await pg.index()
    assert recounted(postgres_url) == stored_counts(postgres_url)
    assert [r.seq for r in await pg.search("a1", "svc7 beta1", limit=3)][:2] == [8, 42]
    # a word the search configuration splits (mod_7: 'mod' <-> '7') is counted through the index
    await pg.append("b2", [Message.user("built mod_7 'x' \\ done")])
    assert [r.message.text for r in await pg.search("b2", "mod_7 'x' \\")] == ["built mod_7 'x' \\ done"]


async def test_schema_7_databases_count_their_words(postgres_url: str) -> None:
    """Schema 8 adds `cmdc_terms`, counted from the vectors already indexed (none recomputed);
    a search of the migrated database ranks as one built new."""
    with psycopg.connect(postgres_url) as conn:
        with conn.transaction():
            schema_at(conn, 7)
        assert migrate(conn) == 7
    # an old database with indexed records: built at 7, its counts dropped as 7 had none
    async with PostgresStore(postgres_url) as store:
        await store.append("old", [Message.user(f"ancient needle{i % 2} hay") for i in range(6)])
        await store.index()
        before = [r.seq for r in await store.search("old", "needle1 hay", limit=6)]
    sql(postgres_url, "DROP TABLE cmdc_terms")
    sql(postgres_url, "UPDATE cmdc_meta SET value = '7' WHERE key = 'schema_version'")
    with psycopg.connect(postgres_url) as conn:
        assert migrate(conn) == 7
    assert stored_counts(postgres_url) == recounted(postgres_url)
    assert ("old", "hay", 6) in stored_counts(postgres_url)
    async with PostgresStore(postgres_url) as store:
        assert [r.seq for r in await store.search("old", "needle1 hay", limit=6)] == before
        assert before[:3] == [2, 4, 6]  # the rarer word first


async def test_a_lost_connection_is_retried_without_loss_or_duplicates(pg: PostgresStore, postgres_url: str) -> None:
    await pg.append("a1", [Message.user("before")], compaction=1)
    # every pooled connection dies (as with a server restart or a network cut)
    sql(
        postgres_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
        "AND datname = current_database()",
    )
    msgs = [Message.user(f"after {i}") for i in range(3)]
    result = await pg.append("a1", msgs, compaction=2)
    assert result.written == 3
    assert [r.message.text for r in await pg.records("a1")] == ["before", "after 0", "after 1", "after 2"]


async def test_an_unreachable_server_gives_a_typed_error_after_bounded_retries(tmp_path: object) -> None:
    store = PostgresStore(f"postgresql://nobody@/db?host={tmp_path}&connect_timeout=1", retries=1, timeout=3)
    with pytest.raises(StoreUnavailable):
        await store.start()
    with pytest.raises(StoreUnavailable):  # opened on first use: fails the same way, typed
        await store.records("a1")


@pytest.mark.skipif(not os.environ.get("CMDC_TEST_POSTGRES_DATA"), reason="needs the pg_test.sh cluster")
async def test_an_immediate_restart_loses_nothing_acknowledged(pg: PostgresStore) -> None:
    data, bin_dir = os.environ["CMDC_TEST_POSTGRES_DATA"], os.environ["CMDC_TEST_POSTGRES_BIN"]
    acked: list[str] = []

    async def writer() -> None:
        for i in range(40):
            m = Message.user(f"record {i}")
            try:
                await pg.append("a1", [m], compaction=i)
            except StoreUnavailable:
                continue  # not acknowledged: may or may not be there, never twice
            acked.append(m.id)

    def restart() -> None:
        log = os.path.join(os.path.dirname(data), "server.log")
        cmd = [f"{bin_dir}/pg_ctl", "-D", data, "-l", log, "-m", "immediate", "-w", "restart"]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # no pipes: the restarted server would hold them open
        subprocess.run(
            cmd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.sleep(0.05)
        await trio.to_thread.run_sync(restart)
    ids = [r.message.id for r in await pg.records("a1")]
    assert len(ids) == len(set(ids))  # nothing twice
    assert set(acked) <= set(ids)  # nothing acknowledged lost
    assert [r.seq for r in await pg.records("a1")] == sorted(r.seq for r in await pg.records("a1"))


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kill_writers(url: str, runs: int) -> list[str]:
    """Start a writer process `runs` times and SIGKILL it mid-stream, after more batches each
    time; return the message ids it acknowledged (printed after `append` returned)."""
    acked: list[str] = []
    for run in range(runs):
        proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "_support", "pg_writer.py"), url, "crashy"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        assert proc.stdout is not None
        for lines, line in enumerate(proc.stdout, 1):
            acked += line.split()
            if lines >= 5 + 7 * run:
                break
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
        for line in rest.splitlines():  # printed before the kill: acknowledged too
            if len(line.split()) == 3:
                acked += line.split()
    return acked


async def test_a_writer_killed_by_sigkill_loses_nothing_acknowledged(pg: PostgresStore, postgres_url: str) -> None:
    """SIGKILL of a writer process at arbitrary moments (5 runs): every batch it acknowledged
    is there whole, once; nothing is there twice; record numbers only grow."""
    acked = await trio.to_thread.run_sync(kill_writers, postgres_url, 5)
    records = await pg.records("crashy")
    ids = [r.message.id for r in records]
    assert len(ids) == len(set(ids))
    assert set(acked) <= set(ids)
    assert [r.seq for r in records] == sorted({r.seq for r in records})
    assert (await pg.verify("crashy")).clean


async def test_a_lost_journal_is_recorded_in_the_database_for_every_writer(
    pg: PostgresStore, postgres_url: str
) -> None:
    first = await pg.append("a1", [Message.user("one"), Message.user("two")], compaction=1)
    assert first.journal is not None
    foreign = JournalRef("jdeadbeefdeadbeef", 2)
    with pytest.raises(JournalLost, match="replaced by journal"):
        await pg.append("a1", [Message.user("x")], compaction=3, expect=foreign)
    # the successor is in the database: another writer (another process) takes the retry
    ((successor, seq, follows),) = sql(postgres_url, "SELECT journal, seq, follows FROM cmdc_journals")
    assert follows == "jdeadbeefdeadbeef" and seq == 2 and successor != first.journal
    other = await PostgresStore.open(postgres_url)
    try:
        retry = await other.append("a1", [Message.user("x")], compaction=3, expect=foreign)
    finally:
        await other.aclose()
    assert retry.journal == successor and retry.first_seq == 3
    assert [r.message.text for r in await pg.records("a1")] == ["one", "two", "x"]
    for bad in (JournalRef("j1", -1), JournalRef(3, 1)):  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            await pg.append("a1", [Message.user("z")], expect=bad)
    with pytest.raises(TypeError, match="bogus"):  # the protocol's signature, typed: no **options
        await pg.append("a1", [Message.user("z")], bogus=1)  # type: ignore[call-arg]


def schema_at(conn: psycopg.Connection[Any], version: int) -> None:
    """Create the tables of schema `version` (its migrations, in order) and record that version,
    as an older cmdc left them; call inside a transaction."""
    conn.execute("CREATE TABLE cmdc_meta (key text PRIMARY KEY, value text NOT NULL)")
    for step in range(1, version + 1):
        for statement in _MIGRATIONS[step]:
            conn.execute(statement)
    conn.execute("INSERT INTO cmdc_meta VALUES ('schema_version', %s)", (str(version),))


async def test_schema_1_databases_are_migrated(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        with conn.transaction():
            schema_at(conn, 1)
            conn.execute("INSERT INTO cmdc_journals (agent_id, journal, seq) VALUES ('old', 'jold', 7)")
        assert migrate(conn) == 1
    async with PostgresStore(postgres_url) as store:
        later = await store.append("old", [Message.user("after the upgrade")], expect=JournalRef("jold", 7))
        assert later.first_seq == 8
        assert (await store.repair("old")).moved == 0


async def test_schema_5_databases_are_migrated_with_their_search_vectors(postgres_url: str) -> None:
    """Schema 5 kept each record's vector in `cmdc_records.words`; schema 6 moves the vectors
    to `cmdc_search` (none recomputed) and marks them indexed."""
    with psycopg.connect(postgres_url) as conn:
        with conn.transaction():
            schema_at(conn, 5)
            conn.execute("INSERT INTO cmdc_journals (agent_id, journal, seq) VALUES ('old', 'jold', 2)")
            conn.execute("INSERT INTO cmdc_attempts VALUES ('old', 'k1', true)")
            for seq, text in ((1, "ancient needle"), (2, "ancient hay")):
                m = Message.user(text)
                conn.execute(
                    "INSERT INTO cmdc_records (agent_id, seq, journal, attempt, compaction, ts, message_id, crc, "
                    "message, body) VALUES ('old', %s, 'jold', 'k1', 1, 0, %s, %s, %s, %s)",
                    (seq, m.id, m.json_crc(), m.to_json(), text),
                )
        assert migrate(conn) == 5
    assert marks(postgres_url) == {"old": (2, 2)}
    assert sql(postgres_url, "SELECT seq FROM cmdc_search WHERE words @@ 'needle'::tsquery") == [(2 - 1,)]
    async with PostgresStore(postgres_url) as store:
        assert [r.message.text for r in await store.search("old", "needle")] == ["ancient needle"]
        later = await store.append("old", [Message.user("modern needle")], expect=JournalRef("jold", 2))
        assert later.first_seq == 3
        assert [r.seq for r in await store.search("old", "needle")] == [1, 3]
        assert await wait_indexed(postgres_url) == {"old": (3, 3)}


async def test_hostile_journal_links_end_the_walk(pg: PostgresStore, postgres_url: str) -> None:
    """A cycle among the recorded losses (rows no store writes) ends the walk up the chain: a
    journal on it is an ancestor, one off it is lost, and neither check loops."""
    first = await pg.append("a1", [Message.user("one")])
    sql(
        postgres_url,
        "INSERT INTO cmdc_journal_links (agent_id, journal, follows) VALUES ('a1', %s, 'jaaaa'), "
        "('a1', 'jaaaa', 'jbbbb'), ('a1', 'jbbbb', 'jaaaa'), ('b2', 'jbbbb', 'jcccc')",
        first.journal,
    )
    with trio.fail_after(20):
        ok = await pg.append("a1", [Message.user("two")], expect=JournalRef("jbbbb", 1))
        assert ok.journal == first.journal and ok.seqs == (2,)
        with pytest.raises(JournalLost, match="replaced"):  # another agent's link is not followed
            await pg.append("a1", [Message.user("three")], expect=JournalRef("jcccc", 1))
    assert [r.seq for r in await pg.records("a1")] == [1, 2]


async def test_schema_6_databases_keep_their_recorded_loss(postgres_url: str) -> None:
    """Schema 6 kept only the last loss (`cmdc_journals.follows`); schema 7 starts its chain of
    links with it."""
    with psycopg.connect(postgres_url) as conn:
        with conn.transaction():
            schema_at(conn, 6)
            conn.execute(
                "INSERT INTO cmdc_journals (agent_id, journal, seq, follows) VALUES ('old', 'jnew', 5, 'jold')"
            )
        assert migrate(conn) == 6
    async with PostgresStore(postgres_url) as store:
        later = await store.append("old", [Message.user("later")], expect=JournalRef("jold", 5))
        assert later.journal == "jnew" and later.seqs == (6,)
        with pytest.raises(JournalLost):
            await store.append("old", [Message.user("later")], expect=JournalRef("jnew", 9))
        again = await store.append("old", [Message.user("later 2")], expect=JournalRef("jold", 5))
        assert again.seqs == (10,)  # two losses back: followed


def test_passwords_never_show_in_reprs_or_locations() -> None:
    store = PostgresStore("postgresql://me:s3cret@db.example:5432/cmdc")
    assert "s3cret" not in repr(store) and "s3cret" not in store.location("a1")
    assert "s3cret" not in repr(store.checkpoints)
    for bad in ("mysql://x", "", "/some/dir"):
        with pytest.raises(ConfigError):
            PostgresStore(bad)
    for kw in ({"pool_size": 0}, {"retries": -1}, {"timeout": 0}, {"timeout": float("inf")}, {"retries": True}):
        with pytest.raises(ConfigError):
            PostgresStore("postgresql://x@/db", **kw)  # type: ignore[arg-type]


async def test_candidates_read_best_bound_first_rank_as_all_read(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search reads a candidate's message only while its bound (from its search vector) can
    still beat the last of the best found: the answers are those of ranking every candidate
    (ties by number, summaries, identifiers, words repeated, records of every length)."""
    import random

    from tests.store.test_search_rank import QUERIES, corpus

    rnd = random.Random(4)
    words = ["port", "alpha", "beta", "gamma", "svc129", "delta"]
    extra = [
        Message.user(" ".join(rnd.choice(words) for _ in range(rnd.randrange(1, 40))), metadata=meta)
        for meta in [{}] * 280 + [{"cmdc.kind": "summary"}] * 20
    ]
    await pg.append("a1", corpus() + extra, compaction=1)
    await pg.index("a1")
    queries = [*QUERIES, "alpha", "alpha beta", "gamma port alpha", "delta svc129", "beta beta gamma"]
    found = {(q, n): [r.seq for r in await pg.search("a1", q, limit=n)] for q in queries for n in (1, 3, 10, 40)}
    monkeypatch.setattr(pg_search._Bound, "__call__", lambda self, tfs, length: float("inf"))  # every one read
    for (q, n), seqs in found.items():
        assert [r.seq for r in await pg.search("a1", q, limit=n)] == seqs, (q, n)
    assert all(found[(q, 40)] for q in queries if q != "mod_7")
