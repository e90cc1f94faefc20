"""Attacks on the PostgreSQL store (issue 24): secrets in the URL, an oversized record, two
runtimes on one name, the driver's own warnings, a lost indexer connection."""

from __future__ import annotations

import base64
import logging
import os
import random
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import cmdc
import cmdc.otel
import cmdc.runtime
from cmdc import Message, open_runtime
from cmdc._redact import journal_label, redact_url
from cmdc.compaction import ExtractiveSummarizer
from cmdc.errors import StoreRefused, StoreUnavailable
from cmdc.postgres import PostgresStore, connection_lost, retryable
from cmdc.providers import ScriptedProvider
from cmdc.recall import recall_tool
from cmdc.store.postgres import indexer
from tests.cli.test_cli import conversation, write_jsonl
from tests.conftest import with_database

ROOT = Path(__file__).resolve().parents[2]
PADDING = "\n" + " ".join(f"line {i} of a long report." for i in range(200))
SECRETS = ("userinfo-PW-1", "query-PW-2", "ssl-PW-3", "passfile-PW-4", "sslkey-PW-5")


def with_secrets(url: str) -> str:
    """`url` (`postgresql://user@/db?host=...`, the test server: trust authentication, which
    ignores every password) with a secret in each place libpq reads one."""
    scheme, rest = url.split("://", 1)
    user, rest = rest.split("@", 1)
    sep = "&" if "?" in rest else "?"
    return (
        f"{scheme}://{user}:{SECRETS[0]}@{rest}{sep}p%61ssword={SECRETS[1]}&sslpassword={SECRETS[2]}"
        f"&passfile=/nonexistent/{SECRETS[3]}&sslkey=/nonexistent/{SECRETS[4]}"
    )


def leaks(text: object) -> list[str]:
    return [s for s in SECRETS if s in str(text)]


def test_redaction_drops_every_secret_and_the_label_is_stable() -> None:
    url = "postgresql://me:pw-userinfo@db.example:6543/app?password=pw-query&sslmode=require&passfile=/p/pw-file"
    assert redact_url(url) == "postgresql://me:***@db.example:6543/app?sslmode=require"
    assert (
        redact_url("postgresql://me@h/app?PASSWORD=pw-x&sslkey=/k/pw-key&sslpassword=pw-ssl") == "postgresql://me@h/app"
    )
    assert redact_url("postgresql://h/app?dbname=postgresql://u:pw-inner@h/x") == "postgresql://h/app"
    assert redact_url("postgres://u:p?w-q@h/db") == "postgres://u:***@h/db"  # a `?` inside the password
    assert redact_url("postgresql://u:p/w@h/db") == "postgresql://u:***@h/db"  # a `/` (libpq fails on it)
    # the same database through other credentials and options: the same label, with no user
    assert journal_label(url) == journal_label("postgresql://other@db.example:6543/app?connect_timeout=3")
    assert journal_label(url) == "postgresql://db.example:6543/app"
    assert journal_label("postgresql://u@/db?host=/run/pg&port=5433") == "postgresql://%2Frun%2Fpg:5433/db"


async def test_a_password_in_the_url_is_never_shown(
    postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A compaction through a runtime whose store URL carries secrets: the summary (sent to the
    model, journaled, checkpointed), the report, events and logs, the spans, reprs and errors
    name the store without them."""
    caplog.set_level(logging.DEBUG)
    url = with_secrets(postgres_url)
    exporter = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = cmdc.otel.Tracing(tracer_provider=tracer, include_content=True)
    async with open_runtime(store=url, tracing=tracing, log_events=True) as rt:
        agent = await rt.spawn(
            "a1",
            ScriptedProvider(["one" + PADDING, "two" + PADDING, "three"]),
            config={"compact_keep": ("messages", 2), "compact_trigger": ("tokens", 100_000)},
            summarizer=ExtractiveSummarizer(),
        )
        await agent.prompt("first")
        await agent.prompt("second")
        done = await agent.compact()
        assert isinstance(done, cmdc.Compacted)
        state = await agent.state()
        store = rt.store
        assert isinstance(store, PostgresStore)
        shown = [repr(store), repr(store.checkpoints), store.location("a1"), repr(rt)]
    summary = next(m for m in done.state.messages if m.is_summary)
    assert done.report.offload_path == f"{journal_label(postgres_url)}#journal/a1"
    assert done.report.offload_path in summary.text
    assert not leaks(summary.text) and not leaks(summary.metadata) and not leaks(done.report)
    assert not leaks(state.to_json().decode())
    with psycopg.connect(postgres_url) as conn:  # what was checkpointed and journaled
        rows = conn.execute("SELECT convert_from(state, 'UTF8') FROM cmdc_checkpoints").fetchall()
        rows += conn.execute("SELECT convert_from(message, 'UTF8') FROM cmdc_records").fetchall()
    assert rows and not leaks(rows)
    spans = exporter.get_finished_spans()
    (compact,) = [s for s in spans if s.name == "compact a1"]
    assert dict(compact.attributes or {})["cmdc.compaction.journal.path"] == done.report.offload_path
    assert not leaks([(s.attributes, [e.attributes for e in s.events], s.status.description) for s in spans])
    assert "compaction_end" in caplog.text and not leaks(caplog.text)
    assert not leaks(shown)


async def test_an_unreachable_store_with_a_password_says_so_without_it(tmp_path: Path) -> None:
    url = with_secrets(f"postgresql://nobody@/db?host={tmp_path}")
    store = PostgresStore(url, retries=0, timeout=5)
    assert not leaks(repr(store))
    with pytest.raises(StoreUnavailable) as caught:
        await store.start()
    assert "cannot open" in str(caught.value) and not leaks(caught.value)
    with pytest.raises(cmdc.ConfigError) as bad:  # a mistyped scheme: refused without the secret
        cmdc.store.open_store(url.replace("postgresql://", "postgre://"))
    assert not leaks(bad.value)


def test_cli_output_carries_no_password(postgres_url: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "chat.jsonl", conversation())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    url = with_secrets(postgres_url)
    for argv in (
        ["compact", str(path), "--offload-dir", url, "--keep", "4"],
        ["history", url, "chat"],
        ["history", url, "chat", "--verify"],
        ["history", with_secrets(f"postgresql://nobody@/db?host={tmp_path}"), "chat"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "cmdc", *argv], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.stdout or done.stderr
        assert not leaks(done.stdout + done.stderr), argv
    assert (
        "#journal/chat"
        in subprocess.run(
            [sys.executable, "-m", "cmdc", "history", url, "chat", "--verify"], capture_output=True, text=True, env=env
        ).stdout
    )
    written = [p for p in tmp_path.iterdir() if p.is_file() and p != path]  # the compacted chat file
    assert written and all(not leaks(p.read_text()) for p in written)
    assert any(f"{journal_label(postgres_url)}#journal/chat" in p.read_text() for p in written)


# -- item 3: one oversized record ----------------------------------------------------------------


def oversized() -> list[Message]:
    """Over PostgreSQL's 1 MB limit for a search vector, each: 2 MB of distinct tokens, and a
    1 MiB image pasted as a base64 data URL."""
    words = " ".join(f"tok{i:07d}" for i in range(200_000))
    image = base64.b64encode(random.Random(7).randbytes(1024 * 1024)).decode()
    return [
        Message.user("before the flood: apple"),
        Message.user(f"{words} tailword"),
        Message.user(f"look at this data:image/png;base64,{image} pasted by cherry"),
        Message.user("after the flood: banana"),
    ]


async def test_an_oversized_record_does_not_poison_search(postgres_url: str, tmp_path: Path) -> None:
    """Search, recall, `index()` and `cmdc history --search` keep working for the agent; the
    oversized record is found by the words of its indexed prefix."""
    async with PostgresStore(postgres_url, retries=3, timeout=60, background_index=False) as store:
        await store.append("a1", oversized())
        # the records past the index mark are searched directly: the same bounded vector
        for word, seq in (("apple", 1), ("tok0000001", 2), ("cherry", 3), ("banana", 4)):
            assert [r.seq for r in await store.search("a1", word)] == [seq], word
        assert await store.index("a1") == 4
        for word, seq in (("apple", 1), ("tok0000001", 2), ("cherry", 3), ("banana", 4)):
            assert [r.seq for r in await store.search("a1", word)] == [seq], word
        assert await store.search("a1", "tailword") == []  # past the indexed prefix
        found = await recall_tool(store, "a1").run({"query": "banana"})
        assert "after the flood" in found
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = await trio.run_process(
        [sys.executable, "-m", "cmdc", "history", postgres_url, "a1", "--search", "banana"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
    )
    assert done.returncode == 0 and b"after the flood" in done.stdout, done.stderr


async def test_the_background_indexer_gets_past_an_oversized_record(postgres_url: str) -> None:
    async with PostgresStore(postgres_url, retries=3, timeout=60) as store:
        await store.append("a1", oversized())
        with trio.fail_after(60):
            while True:
                if store_row(postgres_url, "a1") == (4, 4):
                    break
                await trio.sleep(0.05)
        assert [r.seq for r in await store.search("a1", "banana")] == [4]


def store_row(url: str, agent: str) -> tuple[int, int] | None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT indexed_seq, seq FROM cmdc_journals WHERE agent_id = %s", (agent,)).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


async def test_a_record_journaled_whole_by_an_older_version_is_searched_by_its_prefix(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows written before the body was bounded hold the whole text: the vector's own bound
    (the SQL side) keeps them searchable too."""
    monkeypatch.setattr(indexer, "_searchable", lambda text: text)
    async with PostgresStore(postgres_url, retries=3, timeout=60, background_index=False) as store:
        await store.append("a1", oversized())
        monkeypatch.undo()
        assert [r.seq for r in await store.search("a1", "banana")] == [4]
        assert await store.index("a1") == 4
        assert [r.seq for r in await store.search("a1", "tok0000002")] == [2]


async def test_deterministic_sql_errors_are_not_retried_as_a_lost_connection(postgres_url: str) -> None:
    calls: list[str] = []

    def limit(conn: Any) -> None:
        calls.append("limit")
        conn.execute("SELECT to_tsvector('simple', string_agg(md5(i::text), ' ')) FROM generate_series(1, 60000) i")

    def lost(conn: Any) -> None:
        calls.append("lost")
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    async with PostgresStore(postgres_url, retries=3, timeout=60, background_index=False) as store:
        with pytest.raises(StoreRefused, match=r"ProgramLimitExceeded \(SQLSTATE 54000\): string is too long"):
            await store._run(limit)
        assert calls == ["limit"]  # once: the same statement fails the same way
        with pytest.raises(StoreUnavailable, match="after 4 attempts"):
            await store._run(lost)
        assert calls == ["limit"] + ["lost"] * 4
        assert connection_lost(psycopg.errors.AdminShutdown()) and not connection_lost(psycopg.errors.DivisionByZero())
        assert retryable(psycopg.errors.DeadlockDetected()) and not retryable(psycopg.errors.ProgramLimitExceeded())


# -- also found: the driver's own warnings -------------------------------------------------------

NOISY = """
import logging, sys
import psycopg, trio
from cmdc import Message
from cmdc.postgres import PostgresStore

base, url, name = sys.argv[1], sys.argv[2], sys.argv[3]
if sys.argv[4] == "logging":
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")

async def main() -> None:
    store = PostgresStore(url, retries=1, timeout=3, pool_size=2)
    await store.start()
    await store.append("a", [Message.user("x")])
    with psycopg.connect(base, autocommit=True) as c:  # every connection of the store ends
        c.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    try:
        await store.records("a")
    except Exception as exc:
        print("raised", type(exc).__name__)
    await trio.sleep(1.5)  # the pool tries to reconnect in the background meanwhile
    await store.aclose()

trio.run(main)
"""


@pytest.mark.parametrize("configured", [False, True], ids=["no-logging", "logging"])
def test_the_driver_prints_nothing_without_logging(postgres_url: str, tmp_path: Path, configured: bool) -> None:
    """psycopg_pool warns through the stdlib `psycopg.pool` logger; without any logging set up
    Python would print those warnings to stderr. They go to cmdc's logger instead: silent
    unless the application configured logging, then under `cmdc.postgres.driver`."""
    script = tmp_path / "noisy.py"
    script.write_text(NOISY)
    base = with_database(postgres_url, "postgres")
    name = urllib.parse.urlsplit(postgres_url).path.strip("/")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(script), base, with_secrets(postgres_url), name, "logging" if configured else "-"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "raised StoreUnavailable", done.stderr
    if not configured:
        assert done.stderr == ""
    else:
        lines = done.stderr.splitlines()
        assert any(ln.startswith("cmdc.postgres.driver psycopg.pool: ") for ln in lines), done.stderr
        assert not any(ln.startswith("psycopg") for ln in lines) and not leaks(done.stderr)


# -- issue 26, item 10: the indexer retries on its own -------------------------------------------


async def test_the_indexer_retries_after_losing_its_connection(postgres_url: str) -> None:
    """The indexer's connection is killed while it waits for the agent's index lock: it tries
    again on a new connection after a backoff, with an `index_retry` event, and the index
    catches up without another commit or a call to `index()`."""
    events: list[cmdc.Event] = []
    async with PostgresStore(postgres_url, retries=3, timeout=30, on_event=events.append) as store:
        await store.append("a1", [Message.user("warm up")])
        with trio.fail_after(30):
            while True:
                if store_row(postgres_url, "a1") == (1, 1):
                    break
                await trio.sleep(0.02)
        with psycopg.connect(postgres_url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s, hashtext('a1'))", (indexer._INDEX_LOCK_CLASS,))
            await store.append("a1", [Message.user(f"late {i}") for i in range(3)])
            waiting = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            with trio.fail_after(30):  # the indexer waits for the lock the test holds
                while True:
                    pids = [int(p) for (p,) in holder.execute(waiting).fetchall()]
                    if pids:
                        break
                    await trio.sleep(0.02)
            for pid in pids:
                holder.execute("SELECT pg_terminate_backend(%s)", (pid,))
            with trio.fail_after(30):
                while True:
                    if any(e.kind == "index_retry" for e in events):
                        break
                    await trio.sleep(0.02)
            holder.execute("SELECT pg_advisory_unlock(%s, hashtext('a1'))", (indexer._INDEX_LOCK_CLASS,))
        with trio.fail_after(30):  # no commit, no index() call: the indexer catches up alone
            while True:
                if store_row(postgres_url, "a1") == (4, 4):
                    break
                await trio.sleep(0.05)
    retry = next(e for e in events if e.kind == "index_retry")
    assert retry.agent_id == "a1" and retry.data["attempt"] == 1 and retry.data["error"] == "AdminShutdown"
    assert not any(e.kind == "index_failed" for e in events)


async def test_the_indexer_gives_up_after_its_bound(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(indexer, "INDEX_RETRIES", 2)
    monkeypatch.setattr(indexer, "INDEX_RETRY_DELAY", 0.01)
    events: list[cmdc.Event] = []
    async with PostgresStore(postgres_url, retries=3, timeout=30, on_event=events.append) as store:

        def lost(*_: Any) -> tuple[int, bool]:
            raise psycopg.OperationalError("server closed the connection unexpectedly")

        monkeypatch.setattr(store, "_index_sync", lost)
        await store.append("a1", [Message.user("x")])
        with trio.fail_after(30):
            while True:
                if any(e.kind == "index_failed" for e in events):
                    break
                await trio.sleep(0.02)
    assert [e.data["attempt"] for e in events if e.kind == "index_retry"] == [1, 2]
    assert [e.data["attempts"] for e in events if e.kind == "index_failed"] == [3]


# -- item 6: two runtimes, one database, one name, defaults ----------------------------------------


def echo(request: Any) -> str:
    return f"ack {sum(1 for m in request.messages if m.role == 'user')}"


async def test_two_runtimes_on_one_database_never_run_one_name_at_once_by_default(postgres_url: str) -> None:
    """No lease option given: the second runtime's activation of the name is refused with
    `NameLeased` while the first holds it, and every acknowledged turn is in the store; once the
    first runtime is gone, the second goes on from its last commit."""
    acked: list[str] = []
    async with (
        open_runtime(store=postgres_url, log_events=False) as ra,
        open_runtime(store=postgres_url, log_events=False) as rb,
    ):
        xa = await ra.spawn("x", ScriptedProvider([echo], cycle=True))
        for i in range(5):
            assert (await xa.prompt(f"a{i}")).text == f"ack {i + 1}"
            acked.append(f"a{i}")
        with pytest.raises(cmdc.NameLeased):
            await rb.spawn("x", ScriptedProvider([echo], cycle=True), resume=True)
        assert rb.whereis("x") is None
        for i in range(5, 10):  # the first runtime goes on undisturbed
            assert (await xa.prompt(f"a{i}")).text == f"ack {i + 1}"
            acked.append(f"a{i}")
        assert ra.lease_ttl == rb.lease_ttl == 30.0
    async with open_runtime(store=postgres_url, log_events=False) as rc:
        xc = await rc.spawn("x", ScriptedProvider([echo], cycle=True), resume=True)
        assert (await xc.prompt("c0")).text == "ack 11"
        users = [m.text for m in (await xc.state()).messages if m.role == "user"]
    assert users == [*acked, "c0"]


async def test_a_directory_store_keeps_its_default(tmp_path: Path) -> None:
    async with open_runtime(store=str(tmp_path / "s"), log_events=False) as rt:
        assert rt.lease_ttl is None


def test_an_unreachable_server_prints_nothing(tmp_path: Path) -> None:
    """No server behind the URL from the start, no logging configured: the typed error is the
    only outcome, nothing on stderr (neither the driver's nor the pool's warnings)."""
    code = (
        "import sys, trio\n"
        "from cmdc.postgres import PostgresStore\n"
        "async def main():\n"
        "    store = PostgresStore(sys.argv[1], retries=1, timeout=3)\n"
        "    for op in (store.start, lambda: store.records('a')):\n"
        "        try:\n"
        "            await op()\n"
        "        except Exception as exc:\n"
        "            print(type(exc).__name__)\n"
        "    await store.aclose()\n"
        "trio.run(main)\n"
    )
    url = with_secrets(f"postgresql://nobody@/db?host={tmp_path}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["StoreUnavailable", "StoreUnavailable"] and done.stderr == "", done.stderr


def test_the_indexed_prefix_always_fits_a_search_vector(postgres_url: str) -> None:
    """The worst texts for a vector's size per character (distinct one-character words of 4-byte
    characters, hyphenated compounds, short distinct tokens...), far past the prefix: the
    vector of what is indexed stays well under PostgreSQL's 1 MB."""
    n = indexer.SEARCH_PREFIX_CHARS * 3
    alnum = "abcdefghijklmnopqrstuvwxyz0123456789"
    texts = {
        "4-byte words": " ".join(chr(0x20000 + i) for i in range(n)),
        "3-byte words": " ".join(chr(0x4E00 + i % 20_000) for i in range(n)),
        "compounds": "-".join(chr(0x4E00 + i % 20_000) for i in range(n)),
        "2-letter words": " ".join(a + b for a in alnum for b in alnum) * 60,
        "hosts and paths": " ".join(f"h{i}.io/p{i}" for i in range(n)),
    }
    with psycopg.connect(postgres_url) as conn:
        for name, text in texts.items():
            body = indexer._searchable(text)
            assert len(body) <= indexer.SEARCH_PREFIX_CHARS
            row = conn.execute("SELECT pg_column_size(to_tsvector('simple', %s))", (body,)).fetchone()
            assert row is not None and row[0] < 1_048_575 // 2, (name, row[0])
