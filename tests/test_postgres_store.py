"""What only the PostgreSQL store has: schema versions, attempts and commits in SQL, one
transaction for a checkpoint and the batches its summaries name, damaged rows, the search
index, and connection loss."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import psycopg
import pytest
import trio

from cmdc import ConfigError, Message, State
from cmdc.errors import CmdcError, JournalLost, StoreUnavailable
from cmdc.offload import JournalRef
from cmdc.postgres import _MIGRATIONS, ATTEMPTS_KEY, SCHEMA_VERSION, PostgresStore, migrate


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
    sql(postgres_url, "ANALYZE cmdc_records")
    with psycopg.connect(postgres_url) as conn:
        plan = "\n".join(
            str(r[0])
            for r in conn.execute(
                "EXPLAIN SELECT seq FROM cmdc_records WHERE agent_id = 'a1' AND words @@ to_tsquery('simple', 'needle')"
            )
        )
    assert "cmdc_records_words" in plan
    assert len(await pg.search("a1", "needle", limit=100)) == 10
    # another agent's many matches are not read: the agent is a lexeme in the index
    await pg.append("b2", [Message.user(f"needle {i}") for i in range(5000)])
    sql(postgres_url, "ANALYZE cmdc_records")
    with psycopg.connect(postgres_url) as conn:
        conn.execute("SET enable_seqscan = off")
        rows = conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF) SELECT seq FROM cmdc_records "
            "WHERE words @@ (to_tsquery('simple', 'needle') && $$'cmdc agent=a1'$$::tsquery)"
        ).fetchall()
    plan = "\n".join(str(r[0]) for r in rows)
    assert "Bitmap Index Scan on cmdc_records_words (actual" in plan and "rows=10 loops=1" in plan, plan
    # a search reads the index's pending list whole: it is kept short
    assert sql(postgres_url, "SELECT reloptions FROM pg_class WHERE relname = 'cmdc_records_words'") == [
        (["gin_pending_list_limit=256"],)
    ]
    hits = await pg.search("a1", "needle", limit=100)
    assert len(hits) == 10 and all(h.message.text.startswith("needle") for h in hits)
    assert len(await pg.search("b2", "needle 7", limit=3)) == 3


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


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kill_writers(url: str, runs: int) -> list[str]:
    """Start a writer process `runs` times and SIGKILL it mid-stream, after more batches each
    time; return the message ids it acknowledged (printed after `append` returned)."""
    acked: list[str] = []
    for run in range(runs):
        proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "pg_writer.py"), url, "crashy"],
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
    (successor, seq, follows), = sql(postgres_url, "SELECT journal, seq, follows FROM cmdc_journals")
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
    with pytest.raises(ConfigError, match="unknown append option"):
        await pg.append("a1", [Message.user("z")], bogus=1)


async def test_schema_1_databases_are_migrated(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        with conn.transaction():
            conn.execute("CREATE TABLE cmdc_meta (key text PRIMARY KEY, value text NOT NULL)")
            for statement in _MIGRATIONS[1]:
                conn.execute(statement)
            conn.execute("INSERT INTO cmdc_meta VALUES ('schema_version', '1')")
            conn.execute("INSERT INTO cmdc_journals (agent_id, journal, seq) VALUES ('old', 'jold', 7)")
        assert migrate(conn) == 1
    async with PostgresStore(postgres_url) as store:
        later = await store.append("old", [Message.user("after the upgrade")], expect=JournalRef("jold", 7))
        assert later.first_seq == 8
        assert (await store.repair("old")).moved == 0


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
