"""Issue 28: the file store's index beside each journal (`cmdc._index`): derived, rebuilt when
missing, stale or damaged, never showing an uncommitted record, never on the trio thread; and
reads that do not scan the journal (issue 26 item 8, issue 24's recall cost)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from cmdc import Message, OffloadStore, _index
from cmdc.cli import main
from cmdc.events import JOURNAL_DAMAGED, JOURNAL_INDEX_REBUILT, Event
from cmdc.offload import new_attempt_id
from cmdc.recall import recall_tool


def batch(n: int, start: int = 0) -> list[Message]:
    return [Message.user(f"record {i} says word{i % 50} and item{i}") for i in range(start, start + n)]


def index_of(store: OffloadStore, agent: str = "a") -> Path:
    return _index.index_path(store.path_for(agent))


async def test_the_index_is_a_0600_file_beside_the_journal_and_follows_appends(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    await store.append("a", batch(20), compaction=1)
    assert [r.seq for r in await store.search("a", "item7", 3)] == [8]
    path = index_of(store)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    extras = [n for n in os.listdir(tmp_path) if n.startswith("a.jsonl.")]  # the words, SQLite's journals
    assert "a.jsonl.words" in extras
    for extra in extras:
        assert stat.S_IMODE(os.stat(tmp_path / extra).st_mode) == 0o600
    await store.append("a", batch(5, 20), compaction=2)
    assert [r.seq for r in await store.search("a", "item22", 3)] == [23]  # read past the mark, exact
    ext = await store.extent("a")
    assert (ext.records, ext.first_seq, ext.last_seq, ext.compactions) == (25, 1, 25, 2)


async def test_the_writer_indexes_in_a_background_thread_after_the_append(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    await store.append("a", batch(30), compaction=1)
    assert await trio.to_thread.run_sync(store._indexer.wait_idle, 60.0)
    conn = _index.connect(store.path_for("a"), [])
    try:
        mark = conn.execute("SELECT v FROM meta WHERE k = 'mark'").fetchone()[0]
    finally:
        conn.close()
    assert mark == store.path_for("a").stat().st_size  # indexed with no reader asking


async def test_sqlite_never_runs_on_the_trio_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trio_thread = threading.current_thread()
    calls: list[bool] = []
    connect = _index.connect

    def watched(journal: Path, events: list[object], known: bool = False) -> object:
        calls.append(threading.current_thread() is trio_thread)
        return connect(journal, events, known)  # type: ignore[arg-type]

    monkeypatch.setattr(_index, "connect", watched)
    store = OffloadStore(tmp_path)
    await store.append("a", batch(10), compaction=1)
    await store.search("a", "word3", 5)
    await store.read_range("a", 2, 4)
    await store.last_records("a", 2)
    await store.extent("a")
    await store.check_index("a")
    assert calls and not any(calls)


async def test_an_uncommitted_record_is_never_seen_through_the_index(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    await store.append("a", batch(5), compaction=1)
    pending = await store.append("a", [Message.user("secret zebra99")], attempt=new_attempt_id(), commit=False)
    assert await store.search("a", "zebra99") == []
    assert [r.seq for r in await store.read_range("a", 1, 100)] == [1, 2, 3, 4, 5]
    assert [r.seq for r in await store.last_records("a", 1)] == [5]
    assert (await store.extent("a")).records == 5
    await store.commit("a", pending.pending)
    assert [r.message.text for r in await store.search("a", "zebra99")] == ["secret zebra99"]
    assert [r.seq for r in await store.last_records("a", 1)] == [6]


async def test_a_missing_stale_or_damaged_index_is_rebuilt_with_an_event(tmp_path: Path) -> None:
    events: list[Event] = []
    store = OffloadStore(tmp_path, on_event=events.append)
    await store.append("a", batch(40), compaction=1)
    expected = [r.seq for r in await store.search("a", "word3", 50)]
    path = index_of(store)

    def rebuilt() -> list[Event]:
        found = [e for e in events if e.kind == JOURNAL_INDEX_REBUILT]
        events.clear()
        return found

    rebuilt()
    path.unlink()  # missing
    assert [r.seq for r in await store.search("a", "word3", 50)] == expected
    assert len(rebuilt()) == 1
    path.write_bytes(b"SQLite format 3\x00" + os.urandom(3000))  # damaged
    assert [r.seq for r in await store.search("a", "word3", 50)] == expected
    (event,) = rebuilt()
    assert "damaged" in event.data["reason"]
    # stale: the journal replaced by another one holding other records (a repair rewrites it)
    journal = store.path_for("a")
    other = OffloadStore(tmp_path / "other")
    await other.append("a", batch(3, 100), compaction=1)
    os.replace(other.path_for("a"), journal)
    assert [r.seq for r in await store.read_range("a", 1, 10)] == [1, 2, 3]
    assert [r.message.text for r in await store.search("a", "item101")] == ["record 101 says word1 and item101"]
    assert any("replaced" in e.data["reason"] for e in rebuilt())


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
@pytest.mark.parametrize("which", ["index", "words"])
async def test_a_link_planted_at_the_index_name_is_never_written_through(tmp_path: Path, kind: str, which: str) -> None:
    events: list[Event] = []
    store = OffloadStore(tmp_path / "s", on_event=events.append)
    await store.append("a", batch(10), compaction=1)
    assert await trio.to_thread.run_sync(store._indexer.wait_idle, 60.0)
    path = index_of(store) if which == "index" else _index.words_path(store.path_for("a"))
    path.unlink()
    target = tmp_path / "victim.db"
    target.write_bytes(b"precious")
    if kind == "symlink":
        path.symlink_to(target)
    else:
        os.link(target, path)
    assert [r.seq for r in await store.search("a", "item4")] == [5]
    assert target.read_bytes() == b"precious"
    assert not path.is_symlink() and path.stat().st_nlink == 1
    assert any(kind.replace("link", " link") in e.data["reason"] or "symlink" in e.data["reason"] for e in events)


async def test_a_damaged_journal_line_is_skipped_and_reported(tmp_path: Path) -> None:
    events: list[Event] = []
    store = OffloadStore(tmp_path, on_event=events.append)
    await store.append("a", batch(5), compaction=1)
    journal = store.path_for("a")
    data = journal.read_bytes().replace(b"record 2 says", b"record 2 SAYS")
    journal.write_bytes(data)
    assert [r.seq for r in await store.read_range("a", 1, 10)] == [1, 2, 4, 5]
    assert any(e.kind == JOURNAL_DAMAGED for e in events)


async def test_a_build_read_ahead_counts_damage_and_shows_what_a_scan_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build decodes the next chunk in a thread while SQLite writes the one before: damaged
    lines (a bad checksum, a line of junk, a record whose number goes back), a NUL, an
    identifier and a summary in chunks read ahead are indexed as a scan reads them, and the
    damaged lines counted once each."""
    monkeypatch.setattr(_index, "_CHUNK", 900)  # a few lines per chunk: many chunks read ahead
    store = OffloadStore(tmp_path, index=False)
    await store.append("a", batch(30), compaction=1)
    await store.append("a", [Message.user("nul\x00here and src/billing/mod_7.py")], compaction=2)
    await store.append("a", batch(30, 30), compaction=3)
    journal = store.path_for("a")
    data = journal.read_bytes()
    data = data.replace(b"record 12 says", b"record 12 SAYS").replace(b"record 44 says", b"record 44 SAYS")
    lines = data.split(b"\n")
    lines.insert(20, b"not json at all")
    journal.write_bytes(b"\n".join(lines))
    scanned = await store.records("a")
    report = await store.verify("a")
    events: list[Event] = []
    indexed = OffloadStore(tmp_path, on_event=events.append)
    assert [r.seq for r in await indexed.read_range("a", 0, 10_000)] == [r.seq for r in scanned]
    damaged = [e.data["damaged"] for e in events if e.kind == JOURNAL_DAMAGED]
    assert damaged and damaged[-1] == len(report.damaged) == 3
    assert [r.message.text for r in await indexed.search("a", "here")] == ["nul\x00here and src/billing/mod_7.py"]
    assert len(await indexed.search("a", "src/billing/mod_7.py", 1)) == 1
    assert {r.seq for r in await indexed.search("a", "word7", 100)} == {
        r.seq for r in scanned if "word7" in r.message.text.split()
    }
    assert (await indexed.check_index("a")).ok


async def test_reads_of_a_few_records_do_not_grow_with_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24: recall of 3 records, the last 3 records and a search cost the same (bytes read,
    records decoded) whatever the journal's size; the whole file is never read."""
    store = OffloadStore(tmp_path)
    recall = recall_tool(store, "a")

    def whole_read(path: Path) -> bytes:
        raise AssertionError("the whole journal was read")

    costs = []
    for size in (500, 5_000, 20_000):
        have = (await store.extent("a")).records
        await store.append("a", batch(size - have, have), compaction=size)
        await store.extent("a")  # the index catches up with the append (the writer's thread may have)
        monkeypatch.setattr(OffloadStore, "_read_sync", staticmethod(whole_read))
        _index.READS.update(bytes=0, records=0)
        out = await recall.run({"first": 100, "last": 102})
        assert "record 99 says" in out and "record 101 says" in out
        await store.last_records("a", 3)
        await store.search("a", "item77", 3)
        costs.append(dict(_index.READS))
        monkeypatch.undo()
    assert costs[0]["records"] == costs[-1]["records"] <= 10
    assert costs[-1]["bytes"] <= costs[0]["bytes"] + 200  # a few bytes more: longer numbers in the text
    assert costs[-1]["bytes"] < 4_000


def test_history_limit_and_range_read_only_what_they_print(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = OffloadStore(tmp_path)
    trio.run(functools.partial(store.append, "a", batch(5_000), compaction=1))  # one compaction's batch
    assert main(["history", str(tmp_path), "a", "--limit", "1"]) == 0  # builds the index
    capsys.readouterr()
    _index.READS.update(bytes=0, records=0)
    assert main(["history", str(tmp_path), "a", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "item4999" in out and "item4996" not in out and "5000 records from 1 compaction(s)" in out
    assert main(["history", str(tmp_path), "a", "--range", "2500", "2501"]) == 0
    assert "item2499" in capsys.readouterr().out
    assert _index.READS["records"] == 5 and _index.READS["bytes"] < 2_000


@pytest.mark.parametrize("why", ["--no-index", "read-only directory"])
def test_history_writes_no_index_unless_asked_and_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    """`cmdc history` reads the journal; the one file it may write beside it is the journal's
    index (a documented cache), and only where the directory is writable: with --no-index, or
    in a directory it cannot write in, it writes nothing there and prints the same."""
    import cmdc.cli

    store = OffloadStore(tmp_path, index=False)
    trio.run(functools.partial(store.append, "a", batch(40), compaction=1))
    listing = sorted(os.listdir(tmp_path))
    views = [["--limit", "3"], ["--range", "2", "4"], ["--search", "item7", "word9"], []]
    flag = ["--no-index"] if why == "--no-index" else []
    if why != "--no-index":
        if os.geteuid() == 0:  # root writes anywhere: the check the command makes is what is tested
            monkeypatch.setattr(cmdc.cli, "_writable", lambda directory: False)
        else:
            os.chmod(tmp_path, 0o555)
    try:
        printed = []
        for view in views:
            assert main(["history", str(tmp_path), "a", *flag, *view]) == 0
            printed.append(capsys.readouterr().out)
        assert sorted(os.listdir(tmp_path)) == listing  # no AGENT.jsonl.index (nor its -journal)
    finally:
        os.chmod(tmp_path, 0o700)
        monkeypatch.undo()
    for view, out in zip(views, printed, strict=True):  # with the index, where it may be written
        assert main(["history", str(tmp_path), "a", *view]) == 0
        assert capsys.readouterr().out == out
    assert stat.S_IMODE(os.stat(index_of(store)).st_mode) == 0o600


def test_history_verify_checks_the_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = OffloadStore(tmp_path)
    trio.run(store.append, "a", batch(50))
    assert main(["history", str(tmp_path), "a", "--verify"]) == 0
    assert "ok (50 records)" in capsys.readouterr().out
    conn = _index.connect(store.path_for("a"), [])
    conn.execute("UPDATE recs SET vis = 0 WHERE seq = 7")  # the index now hides a record
    conn.close()
    assert main(["history", str(tmp_path), "a", "--verify"]) == 1
    out = capsys.readouterr().out
    assert "the index counts 49 records" in out, out
    assert "rebuilt from the journal (50 records)" in out
    assert main(["history", str(tmp_path), "a", "--verify"]) == 0
    assert "ok (50 records)" in capsys.readouterr().out


async def test_a_huge_records_rest_is_tokenized_in_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The indexer's thread holds the GIL for each regex call: a huge text's rest is tokenized a
    # slice at a time (one call over a 256 KB piece stalled the trio thread), and its words
    # and identifiers are all found, also one that runs across where a slice would end.
    seen: list[int] = []
    real = _index.tokens

    def counting(text: str) -> list[str]:
        seen.append(len(text))
        return real(text)

    monkeypatch.setattr(_index, "tokens", counting)
    filler = " ".join(f"w{i % 997}" for i in range(_index.TEXT_CHARS // 2))
    tail = "".join(f" part{i} src/mod_{i}/x.py" for i in range(40_000))
    store = OffloadStore(tmp_path)
    await store.append("a", [Message.user("x"), Message.tool_result("t", filler + tail)], compaction=1)
    for query in ("part39999", "src/mod_20000/x.py", "src/mod_0/x.py"):
        assert [r.seq for r in await store.search("a", query, 1, max_chars=100)] == [2], query
    assert seen and max(seen) <= 2 * _index.TOKEN_SLICE
async def test_search_through_candidates_ranks_as_the_exact_query(tmp_path: Path) -> None:
    """A search first ranks FTS5's best candidates alone; with many ties (equal scores), many
    summaries (weighted down) and records an uncommitted attempt hides, its answer is the exact
    query's, best first, ties to the lower number."""
    from cmdc.message import KIND_KEY, SUMMARY_KIND

    store = OffloadStore(tmp_path)
    msgs = [
        Message.user(
            f"alpha beta {'gamma' if i % 3 else 'delta'} row{i}",
            metadata={KIND_KEY: SUMMARY_KIND} if i % 4 == 0 else {},
        )
        for i in range(600)
    ]
    await store.append("a", msgs, compaction=1)
    await store.append(
        "a", [Message.user(f"alpha alpha beta hidden{i}") for i in range(300)], attempt=new_attempt_id(), commit=False
    )
    exact = (
        "SELECT r.seq, r.off, r.len FROM fts JOIN recs r ON r.seq = fts.rowid WHERE fts MATCH ? AND r.vis = 1 "
        f"ORDER BY bm25(fts) * (CASE r.summary WHEN 1 THEN {_index.SUMMARY_WEIGHT} ELSE 1.0 END), r.seq LIMIT ?"
    )
    assert await store.search("a", "alpha", limit=1)  # brings the index up to date
    conn = _index.connect(store.path_for("a"), [])
    try:
        for query in ("alpha", "alpha beta", "gamma row7", "delta beta alpha", "beta gamma"):
            for limit in (1, 5, 10, 50):
                terms, phrase = _index.query_terms(query)
                want = conn.execute(exact, (_index.match_expression(terms, phrase), limit)).fetchall()
                assert _index.search(conn, query, limit) == want, (query, limit)
                assert len(want) == limit
    finally:
        conn.close()


async def test_a_search_does_not_wait_for_a_writer_of_an_index_already_current(tmp_path: Path) -> None:
    """A search of a journal its index already covers reads the index without a write
    transaction: another connection holding the index's write lock (the background indexer in
    the middle of a chunk, another process catching up) does not hold it up."""
    import sqlite3

    store = OffloadStore(tmp_path)
    await store.append("a", batch(20), compaction=1)
    assert [r.seq for r in await store.search("a", "item7", 3)] == [8]  # the index is current
    other = sqlite3.connect(index_of(store), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the write lock, held
    try:
        _index.READS.update(bytes=0, records=0)
        with trio.fail_after(15):  # a wait for the lock would last its 30 s busy timeout
            assert [r.seq for r in await store.search("a", "item12", 3)] == [13]
        assert _index.READS["records"] == 1  # answered from the index, not by scanning the journal
    finally:
        other.execute("ROLLBACK")
        other.close()
async def test_an_index_built_in_small_chunks_shows_what_the_journal_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build decides a chunk's records' visibility before it inserts them: batches whose
    commit line lands chunks later, an attempt never committed, a message written again by a
    later attempt (its first committed record is the one shown) all read as a scan reads them."""
    monkeypatch.setattr(_index, "_CHUNK", 700)  # a few lines per transaction
    store = OffloadStore(tmp_path, index=False)
    await store.append("a", batch(7), compaction=1)
    late = await store.append("a", batch(6, 100), attempt=new_attempt_id(), commit=False, compaction=2)
    await store.append("a", batch(3, 200), attempt=new_attempt_id(), commit=False, compaction=2)  # never committed
    again = [Message.user("record again says word7"), *batch(2, 300)]
    first = await store.append("a", again, attempt=new_attempt_id(), commit=False, compaction=3)
    await store.append("a", batch(5, 400), compaction=3)
    await store.commit("a", late.pending)
    await store.append("a", again[:1], compaction=4)  # the same message, committed first here
    await store.commit("a", first.pending)
    scanned = [(r.seq, r.message.id) for r in await store.records("a")]
    indexed = OffloadStore(tmp_path)
    assert [(r.seq, r.message.id) for r in await indexed.read_range("a", 0, 10_000)] == scanned
    assert [(r.seq, r.message.id) for r in await indexed.last_records("a", 4)] == scanned[-4:]
    ext = await indexed.extent("a")
    assert (ext.records, ext.compactions) == (len(scanned), (await store.verify("a")).compactions)
    assert {r.seq for r in await indexed.search("a", "word7", 100)} == {
        r.seq for r in await store.records("a") if "word7" in r.message.text.split()
    }
    assert (await indexed.check_index("a")).ok


def _die_mid_build(journal: str) -> None:
    """In a child process: build the journal's index and die (no cleanup, as a crash) inside
    the transaction of its third chunk, after its rows are written."""
    index = __import__("cmdc._index", fromlist=["_index"])
    seen = [0]
    show = index._show

    def dying(*args: object) -> object:
        seen[0] += 1
        if seen[0] == 3:
            os._exit(9)
        return show(*args)

    index._show = dying
    index._CHUNK = 2_000
    trio.run(OffloadStore(Path(journal).parent).extent, Path(journal).stem)


def _die_between_commits(journal: str) -> None:
    """In a child process: build the journal's index and die (no cleanup, as a crash) after
    its third chunk's words are committed, before its records are."""
    index = __import__("cmdc._index", fromlist=["_index"])
    chunks = [0]
    execute, write_words = index.IndexConnection.execute, index._write_words

    def counted(*args: Any) -> None:
        chunks[0] += 1
        write_words(*args)

    def dying(self: Any, sql: str, *args: Any) -> Any:
        if sql == "COMMIT" and chunks[0] == 3:  # (the records' commit: the words' one is on another connection)
            os._exit(9)
        return execute(self, sql, *args)

    index._write_words = counted
    index.IndexConnection.execute = dying
    index._CHUNK = 2_000
    trio.run(OffloadStore(Path(journal).parent).extent, Path(journal).stem)


async def _killed_while_indexing(tmp_path: Path, target: Callable[[str], None]) -> OffloadStore:
    """A journal of 120 records in `tmp_path`, and a process (spawned) that indexes it with
    `target(journal)` and exits with code 9 on its way; the store (without an index)."""
    import multiprocessing

    store = OffloadStore(tmp_path, index=False)
    await store.append("a", batch(120), compaction=1)
    child = multiprocessing.get_context("spawn").Process(target=target, args=(str(store.path_for("a")),))
    child.start()
    await trio.to_thread.run_sync(child.join, 120)
    assert child.exitcode == 9
    return store


async def test_a_build_killed_between_its_two_commits_is_rebuilt_by_the_next_reader(tmp_path: Path) -> None:
    """A process killed after a chunk's words are committed and before its records are (a
    real kill, not a file put back): the next reader finds the words past the records' mark,
    rebuilds both with one event, and shows what the journal holds."""
    store = await _killed_while_indexing(tmp_path, _die_between_commits)
    conn = _index.connect(store.path_for("a"), [])
    try:
        marks = [conn.execute(f"SELECT v FROM {t} WHERE k = 'mark'").fetchone()[0] for t in ("meta", "w.wmeta")]
    finally:
        conn.close()
    assert 0 < marks[0] < marks[1] < store.path_for("a").stat().st_size  # the words a chunk ahead
    events: list[Event] = []
    reader = OffloadStore(tmp_path, on_event=events.append)
    assert [r.seq for r in await reader.read_range("a", 0, 1_000)] == list(range(1, 121))
    assert [r.message.text for r in await reader.search("a", "item119")] == ["record 119 says word19 and item119"]
    assert [r.seq for r in await reader.search("a", "item30")] == [31]
    reasons = [e.data["reason"] for e in events if e.kind == JOURNAL_INDEX_REBUILT]
    assert len(reasons) == 1 and "words end at byte" in reasons[0], reasons
    report = await reader.check_index("a")
    assert report.ok and not report.rebuilt, report


async def test_a_build_that_dies_midway_is_finished_by_the_next_reader(tmp_path: Path) -> None:
    """A process that dies inside a build's transaction leaves a valid index of what it had
    committed (SQLite's journal rolls the rest back): the next reader goes on from there, and
    what it shows is the journal's."""
    store = await _killed_while_indexing(tmp_path, _die_mid_build)
    conn = _index.connect(store.path_for("a"), [])
    try:
        committed = int(conn.execute("SELECT v FROM meta WHERE k = 'mark'").fetchone()[0])
    finally:
        conn.close()
    assert 0 < committed < store.path_for("a").stat().st_size  # two chunks in, not all
    reader = OffloadStore(tmp_path)
    assert [r.seq for r in await reader.read_range("a", 0, 1_000)] == list(range(1, 121))
    assert [r.message.text for r in await reader.search("a", "item119")] == ["record 119 says word19 and item119"]
    report = await reader.check_index("a")
    assert report.ok and not report.rebuilt, report


def _index_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "cmdc-index"]


async def test_closing_a_store_ends_its_index_thread_and_a_later_write_starts_one(tmp_path: Path) -> None:
    """The background indexer waits for the store to be quiet; a store closed meanwhile ends
    its thread (no thread per store left behind), and the index is still caught up by the next
    reader. A store used after `aclose` indexes again."""
    before = set(_index_threads())
    store = OffloadStore(tmp_path)
    await store.append("a", batch(10), compaction=1)
    thread = store._indexer._thread
    assert thread is not None and thread.is_alive()  # waiting for the store to be quiet
    await store.aclose()
    await trio.to_thread.run_sync(thread.join, 10.0)
    assert not thread.is_alive()
    assert set(_index_threads()) <= before
    assert [r.seq for r in await store.search("a", "item7", 3)] == [8]  # the reader caught up
    await store.append("a", batch(5, 10), compaction=2)
    assert await trio.to_thread.run_sync(store._indexer.wait_idle, 60.0)
    assert [r.seq for r in await OffloadStore(tmp_path).search("a", "item12", 3)] == [13]
    await store.aclose()


async def test_an_idle_index_thread_waits_for_the_next_poke_then_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its work done, the thread waits `_LINGER` seconds: a later write (the next compaction's
    commit) finds it and starts none; idle that long, it ends, and the next write starts one.
    (No timing: the linger is long while the thread must be found, then none, the thread woken.)"""
    monkeypatch.setattr(_index, "_QUIET", 0.0)
    monkeypatch.setattr(_index, "_LINGER", 600.0)
    store = OffloadStore(tmp_path)
    await store.append("a", batch(10), compaction=1)
    thread = store._indexer._thread
    assert thread is not None
    assert await trio.to_thread.run_sync(store._indexer.wait_idle, 60.0)
    assert thread.is_alive() and store._indexer._thread is thread  # lingering
    await store.append("a", batch(5, 10), compaction=2)
    assert store._indexer._thread is thread  # no new thread
    assert await trio.to_thread.run_sync(store._indexer.wait_idle, 60.0)
    assert [r.seq for r in await OffloadStore(tmp_path).search("a", "item12", 3)] == [13]
    monkeypatch.setattr(_index, "_LINGER", 0.0)
    with store._indexer._lock:
        store._indexer._wake.notify_all()  # (as a spurious wake-up: it looks at the time again)
    await trio.to_thread.run_sync(thread.join, 30.0)  # idle for `_LINGER`: it ends
    assert not thread.is_alive() and store._indexer._thread is None
    await store.append("a", batch(3, 20), compaction=3)
    later = store._indexer._thread
    assert later is not None and later is not thread
    await store.aclose()
    await trio.to_thread.run_sync(later.join, 10.0)
    assert not later.is_alive()


def test_a_closed_threads_last_work_does_not_make_the_next_thread_look_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread closed in the middle of a journal, and the thread a poke started since: the
    first one's work ending is not the second one's (`wait_idle` waits for the second)."""
    monkeypatch.setattr(_index, "_QUIET", 0.0)
    monkeypatch.setattr(_index, "_LINGER", 600.0)
    started = {p: threading.Event() for p in ("one", "two")}
    release = {p: threading.Event() for p in ("one", "two")}

    def work(path: Path, stopped: Callable[[], bool]) -> None:
        started[path.name].set()
        release[path.name].wait(30)

    indexer = _index.Indexer(work)
    indexer.poke(Path("one"))
    assert started["one"].wait(30)
    first = indexer.close()  # while it works on "one"
    indexer.poke(Path("two"))
    assert started["two"].wait(30)
    second = indexer._thread
    assert first is not None and second is not None and second is not first
    release["one"].set()
    first.join(30)
    assert not first.is_alive()
    assert not indexer.wait_idle(0.3)  # "two" is still in hand
    release["two"].set()
    assert indexer.wait_idle(30)
    indexer.close()
    second.join(30)
    assert not second.is_alive()


async def test_a_store_dropped_unclosed_ends_its_index_thread(tmp_path: Path) -> None:
    """The thread holds its store weakly: a store nobody refers to is collected and its thread
    ends, without waiting for the quiet period."""
    import gc

    store = OffloadStore(tmp_path)
    await store.append("a", batch(10), compaction=1)
    thread = store._indexer._thread
    assert thread is not None and thread.is_alive()
    del store
    gc.collect()
    await trio.to_thread.run_sync(thread.join, 10.0)
    assert not thread.is_alive()


async def test_closing_stops_a_build_between_two_transactions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A close during a long build ends the thread after the chunk in progress; what it
    committed is kept, and the next reader finishes the index."""
    monkeypatch.setattr(_index, "_QUIET", 0.0)
    monkeypatch.setattr(_index, "_CHUNK", 600)
    store = OffloadStore(tmp_path)
    chunks: list[int] = []
    real = _index._index_chunk

    def one_chunk(*args: object, **kwargs: object) -> object:
        chunks.append(1)
        if len(chunks) == 2:
            store._indexer.close()  # as `aclose` does, from another thread, mid-build
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_index, "_index_chunk", one_chunk)
    await store.append("a", batch(200), compaction=1)
    thread = store._indexer._thread
    if thread is not None:
        await trio.to_thread.run_sync(thread.join, 30.0)
        assert not thread.is_alive()
    assert len(chunks) == 2  # stopped after the chunk in progress
    reader = OffloadStore(tmp_path)
    assert [r.seq for r in await reader.read_range("a", 0, 1_000)] == list(range(1, 201))
    assert (await reader.check_index("a")).ok


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_compactions_counted_as_the_journal_grows_are_the_journals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """The index counts compactions from where its last count ended while nothing before it
    changed; a late commit, a summary committing an earlier attempt, or a message written
    again by a later attempt makes it count again. After every step: what a whole read says."""
    import random

    from cmdc.message import KIND_KEY, SUMMARY_KIND
    from cmdc.store.records import ATTEMPTS_KEY

    monkeypatch.setattr(_index, "_CHUNK", 1_500)  # a step's records over several chunks
    rnd = random.Random(seed)
    writer = OffloadStore(tmp_path, index=False)
    reader = OffloadStore(tmp_path)
    pending: list[str] = []
    number, n = 0, 0
    for _ in range(40):
        step = rnd.random()
        if step < 0.15 and pending:  # a late commit of earlier batches
            await writer.commit("a", pending)
            pending = []
        elif step < 0.3 and pending:  # a summary that commits the batches it names
            meta = {KIND_KEY: SUMMARY_KIND, ATTEMPTS_KEY: pending}
            await writer.append("a", [Message.user(f"summary of {n}", metadata=meta)], compaction=number)
            pending = []
        elif step < 0.45:  # written, not committed yet
            number += rnd.choice([0, 1])
            some = batch(rnd.randrange(1, 6), n)
            got = await writer.append("a", some, attempt=new_attempt_id(), commit=False, compaction=number)
            pending += got.pending
            n += 6
        elif step < 0.55 and n:  # a message written again by a later batch
            again = batch(1, rnd.randrange(n))
            await writer.append("a", again, compaction=number)
        else:
            number += rnd.choice([0, 1, 1])
            await writer.append("a", batch(rnd.randrange(1, 8), n), compaction=number)
            n += 8
        ext = await reader.extent("a")
        report = await writer.verify("a")
        assert (ext.records, ext.compactions) == (report.records, report.compactions)
    assert (await reader.check_index("a")).ok
    _index.remove(writer.path_for("a"))  # a rebuild, chunk by chunk, counts them alike
    rebuilt = await OffloadStore(tmp_path).extent("a")
    assert (rebuilt.records, rebuilt.compactions) == (report.records, report.compactions)


async def test_a_rebuild_counts_the_compactions_beside_its_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compactions are counted chunk by chunk as a rebuild goes (up to the first hidden
    record): `extent` afterwards counts only what came after, not the whole journal again."""
    import sqlite3

    monkeypatch.setattr(_index, "_CHUNK", 2_000)
    writer = OffloadStore(tmp_path, index=False)
    for k in range(1, 6):
        await writer.append("a", batch(20, 20 * k), compaction=k)
    pending = await writer.append("a", batch(5, 500), attempt=new_attempt_id(), commit=False, compaction=6)
    journal = writer.path_for("a")
    await OffloadStore(tmp_path).search("a", "word3", 1)  # builds the index, no extent
    with contextlib.closing(sqlite3.connect(f"{journal}{_index.SUFFIX}")) as conn:
        meta = dict(conn.execute("SELECT k, v FROM meta").fetchall())
    assert int(meta["groups_seq"]) == 100 and int(meta["groups"]) == 5  # the hidden batch (101-105) not yet
    assert "groups_mark" not in meta
    await writer.commit("a", list(pending.pending))
    ext = await OffloadStore(tmp_path).extent("a")
    assert (ext.records, ext.compactions) == (105, 6)


@pytest.mark.parametrize("plain_run", [64, 10**9])
async def test_runs_of_plain_records_and_rows_index_the_same_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plain_run: int
) -> None:
    """The build sends a run of consecutive records without identifiers as one array of texts
    and the rest as rows: runs cut by an identifier, by a batch's commit line, by a NUL (JSON
    cannot carry it) and by a chunk's end index every word of every record, in order, as rows
    alone do (`plain_run` 10**9: no run is long enough)."""
    monkeypatch.setattr(_index, "_PLAIN_RUN", plain_run)
    monkeypatch.setattr(_index, "_CHUNK", 20_000)
    store = OffloadStore(tmp_path, index=False)
    await store.append("a", batch(150), compaction=1)
    await store.append("a", [Message.user("see src/billing/mod_7.py now")], compaction=2)
    texts = [f"plain {i} zz{i % 7}" for i in range(120)]
    texts[60] = "nul\x00inside zz3"
    await store.append("a", [Message.user(t) for t in texts], compaction=3)
    await store.append("a", batch(100, 150), compaction=4)
    scanned = await store.records("a")
    indexed = OffloadStore(tmp_path)
    for word in ("zz3", "word7", "item149", "item150", "inside", "now"):
        want = {r.seq for r in scanned if word in r.message.text.replace("\x00", " ").split()}
        assert want, word
        assert {r.seq for r in await indexed.search("a", word, 1_000)} == want, word
    assert [r.seq for r in await indexed.search("a", "src/billing/mod_7.py", 1)] == [151]
    assert (await indexed.check_index("a")).ok
    assert (await indexed.extent("a")).records == len(scanned) == 371


@pytest.mark.parametrize("chunk", [300, 1 << 20])
async def test_batches_committed_by_a_summary_then_by_a_commit_line_read_as_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """A batch committed first by a committed summary naming it, later by its own commit line
    (its records change batch, some already shown), a message written by two batches (the
    first committed record shown) and a batch never committed: the index shows the records, the
    search and the compactions a scan shows, built in small chunks or in one."""
    from cmdc.offload import ATTEMPTS_KEY

    monkeypatch.setattr(_index, "_CHUNK", chunk)
    store = OffloadStore(tmp_path, index=False)
    await store.append("a", batch(4), compaction=1)
    early = await store.append("a", batch(5, 100), attempt=new_attempt_id(), commit=False, compaction=2)
    twice = Message.user("twice says word7")
    hidden = await store.append("a", [twice, *batch(2, 200)], attempt=new_attempt_id(), commit=False, compaction=2)
    await store.append("a", batch(3, 300), attempt=new_attempt_id(), commit=False, compaction=2)  # never committed
    summary = Message.user(
        "summary of the early batch", metadata={"cmdc.kind": "summary", ATTEMPTS_KEY: list(early.pending)}
    )
    await store.append("a", [summary, twice], compaction=3)  # commits `early` through the summary
    await store.commit("a", early.pending)  # and then its own line names it
    await store.commit("a", hidden.pending)  # `twice` was committed by the batch before: shown there
    await store.append("a", batch(3, 400), compaction=4)
    scanned = await store.records("a")
    indexed = OffloadStore(tmp_path)
    assert [(r.seq, r.message.id) for r in await indexed.read_range("a", 0, 10_000)] == [
        (r.seq, r.message.id) for r in scanned
    ]
    ext = await indexed.extent("a")
    assert (ext.records, ext.compactions) == (len(scanned), (await store.verify("a")).compactions)
    for word in ("word7", "item103", "item201", "item301", "early"):
        assert {r.seq for r in await indexed.search("a", word, 100)} == {
            r.seq for r in scanned if word in r.message.text.split()
        }, word
    assert (await indexed.check_index("a")).ok


async def test_a_batch_committed_by_a_summary_and_later_its_line_is_moved_through_an_index(
    tmp_path: Path,
) -> None:
    """The index brought up to date between each summary naming a batch and the batch's own
    commit line (a reader or the background indexer may): every such batch is moved to its
    line's group, by an update that reads an index, not the whole records table; the records
    and the compactions are those a scan gives."""
    from cmdc.offload import ATTEMPTS_KEY

    store = OffloadStore(tmp_path, index=False)
    ends = []
    for i in range(40):
        records = [Message.user(f"rec {i} {j}") for j in range(5)]
        pending = await store.append("a", records, attempt=new_attempt_id(), commit=False, compaction=i + 1)
        summary = Message.user(f"summary {i}", metadata={"cmdc.kind": "summary", ATTEMPTS_KEY: list(pending.pending)})
        await store.append("a", [summary], compaction=i + 1)
        ends.append(store.path_for("a").stat().st_size)
        await store.commit("a", pending.pending)
    path = store.path_for("a")
    ends.append(path.stat().st_size)
    conn = _index.connect(path, [])
    fd = os.open(path, os.O_RDONLY)
    moved: list[str] = []
    plans: list[str] = []
    regroup = "UPDATE recs SET grp = ? WHERE attempt = ?"

    def trace(sql: str) -> None:  # (the statement as run: its parameters may be filled in)
        if sql.startswith("UPDATE recs SET grp = ") and sql.endswith(" AND grp = attempt"):
            moved.append(sql)

    try:
        conn.set_trace_callback(trace)
        for end in ends:
            _index.catch_up(conn, fd, path, end, [])
        conn.set_trace_callback(None)
        plans = [str(r) for r in conn.execute(f"EXPLAIN QUERY PLAN {regroup} AND grp = attempt", ("c1", "k1"))]
    finally:
        os.close(fd)
        conn.close()
    assert len(moved) == 40
    assert plans and all("SCAN recs" not in p for p in plans), plans
    scanned = await store.records("a")
    indexed = OffloadStore(tmp_path)
    assert [r.seq for r in await indexed.read_range("a", 0, 10_000)] == [r.seq for r in scanned]
    assert (await indexed.extent("a")).compactions == (await store.verify("a")).compactions


def test_a_run_of_texts_never_takes_a_record_with_identifiers(monkeypatch: pytest.MonkeyPatch) -> None:
    """However short a run may be, a record with identifiers goes as a row (its identifiers
    with it), and the inserts hold every record once, in order."""
    monkeypatch.setattr(_index, "_PLAIN_RUN", 1)
    words = [(1, "see src/a.py", "src\ue000a\ue001py"), (2, "plain", ""), (3, "more", ""), (5, "gap", "")]
    inserts = _index._word_inserts(words)
    assert [row for i in inserts for row in i.rows] == words
    for insert in inserts:
        if insert.sql == _index._TEXTS_SQL:
            assert all(not row[2] for row in insert.rows)


def test_an_insert_falls_back_to_rows_when_sqlite_cannot_take_json(tmp_path: Path) -> None:
    """A prepared insert whose JSON SQLite cannot read (built without its JSON functions: no
    such function or table `json_...`) or JSON could not carry (a NUL: no blob) inserts its rows
    one by one; any other SQLite error is raised, and nothing is inserted twice."""
    import sqlite3

    journal = tmp_path / "a.jsonl"
    journal.write_bytes(b"")
    conn = _index.connect(journal, [])
    try:
        rows = [(1, "alpha one", ""), (2, "beta two", "")]
        no_json = "INSERT INTO fts (rowid, body, ids) SELECT json_not_built_in(value), '', '' FROM json_each(?)"
        _index._Insert(no_json, (), "[1]", _index._WORDS_SQL, rows).run(conn)
        nul = [(3, "gamma\x00three", "")]
        assert _index._as_json([r[1] for r in nul]) is None
        _index._Insert(_index._TEXTS_SQL, (3,), None, _index._WORDS_SQL, nul).run(conn)
        count = "SELECT count(*) FROM fts WHERE fts MATCH ?"
        assert [conn.execute(count, (w,)).fetchone()[0] for w in ("alpha", "beta", "gamma")] == [1, 1, 1]
        missing = "INSERT INTO no_such_table SELECT 1 FROM json_each(?)"
        broken = _index._Insert(missing, (), "[1]", _index._WORDS_SQL, rows)
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            broken.run(conn)
    finally:
        conn.close()


def test_a_lookup_over_many_values_is_one_statement_or_falls_back_to_parts(tmp_path: Path) -> None:
    """`_among` runs its statement over a JSON array of the values; values JSON cannot carry
    (a NUL) or a SQLite without JSON functions go 500 at a time: the same rows. Any other
    error is raised."""
    import sqlite3

    class NoJSON(sqlite3.Connection):  # a SQLite built without its JSON functions
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if "json_each" in sql:
                raise sqlite3.OperationalError("no such table: json_each")
            return super().execute(sql, *args)

    for conn in (sqlite3.connect(":memory:"), sqlite3.connect(":memory:", factory=NoJSON)):
        conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER)")
        keys = [f"m{i}" for i in range(1_200)] + ["nul\x00key"]
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(k, i) for i, k in enumerate(keys)])
        select = "SELECT k, n FROM t WHERE k IN"
        assert sorted(_index._among(conn, select, keys[::3])) == sorted((k, keys.index(k)) for k in keys[::3])
        wanted = [*keys[1::7], "absent", "nul\x00key"]
        assert _index._as_json(wanted) is None
        assert sorted(_index._among(conn, select, wanted)) == sorted((k, keys.index(k)) for k in wanted if k in keys)
        _index._among(conn, "UPDATE t SET n = -1 WHERE n IN", list(range(0, 1_201, 2)))
        assert conn.execute("SELECT count(*) FROM t WHERE n = -1").fetchone()[0] == 601
        assert _index._among(conn, select, []) == []
        with pytest.raises(sqlite3.OperationalError, match="no such table: missing"):
            _index._among(conn, "SELECT k FROM missing WHERE k IN", ["m1"])
        conn.close()


async def test_words_ahead_of_the_records_are_rebuilt_with_an_event(tmp_path: Path) -> None:
    """A process killed between the two commits of a chunk (the words are committed first)
    leaves words past the records' mark: the next reader rebuilds both, with an event, and
    finds what a scan finds. Made here by putting back the records' file of an earlier mark."""
    events: list[Event] = []
    store = OffloadStore(tmp_path, on_event=events.append)
    await store.append("a", batch(20), compaction=1)
    assert [r.seq for r in await store.search("a", "item7", 3)] == [8]
    path = index_of(store)
    earlier = path.read_bytes()
    await store.append("a", batch(20, 20), compaction=2)
    assert [r.seq for r in await store.search("a", "item27", 3)] == [28]
    assert await trio.to_thread.run_sync(store._indexer.wait_idle, 60.0)
    store._index_conns.close_all()
    path.write_bytes(earlier)  # the records at the first mark, the words at the second
    events.clear()
    assert [r.seq for r in await store.search("a", "item27", 3)] == [28]
    assert [r.seq for r in await store.search("a", "item7", 3)] == [8]
    reasons = [e.data["reason"] for e in events if e.kind == JOURNAL_INDEX_REBUILT]
    assert len(reasons) == 1 and "words end at byte" in reasons[0]
    scanned = OffloadStore(tmp_path, index=False)
    assert [r.seq for r in await store.read_range("a", 0, 100)] == [r.seq for r in await scanned.records("a")]
    assert (await store.check_index("a")).ok


@pytest.mark.parametrize("damage", ["missing", "junk", "another index's"])
async def test_a_missing_damaged_or_foreign_words_file_is_rebuilt(tmp_path: Path, damage: str) -> None:
    """The words' file removed, overwritten, or taken from another journal's index: the next
    reader rebuilds the index with one event, and search finds what it found before."""
    events: list[Event] = []
    store = OffloadStore(tmp_path, on_event=events.append)
    await store.append("a", batch(30), compaction=1)
    await store.append("b", batch(30, 100), compaction=1)
    expected = [r.seq for r in await store.search("a", "word3", 50)]
    assert expected and [r.seq for r in await store.search("b", "word3", 50)]
    assert await trio.to_thread.run_sync(store._indexer.wait_idle, 60.0)
    store._index_conns.close_all()
    words = _index.words_path(store.path_for("a"))
    if damage == "missing":
        words.unlink()
    elif damage == "junk":
        words.write_bytes(b"SQLite format 3\x00" + os.urandom(3000))
    else:
        os.replace(_index.words_path(store.path_for("b")), words)
    events.clear()
    assert [r.seq for r in await store.search("a", "word3", 50)] == expected
    assert [r.message.text for r in await store.search("a", "item105")] == []  # b's words are gone
    reasons = [e.data["reason"] for e in events if e.kind == JOURNAL_INDEX_REBUILT]
    assert len(reasons) == 1, reasons
    assert (await store.check_index("a")).ok
    assert stat.S_IMODE(os.stat(words).st_mode) == 0o600


async def test_an_index_of_the_version_before_is_rebuilt_in_two_files(tmp_path: Path) -> None:
    """An index written by version 5 (its words in the same file) is rebuilt once, with an
    event; its words then live in their own file."""
    import sqlite3

    events: list[Event] = []
    store = OffloadStore(tmp_path, on_event=events.append)
    await store.append("a", batch(20), compaction=1)
    expected = [r.seq for r in await store.search("a", "word3", 50)]
    assert await trio.to_thread.run_sync(store._indexer.wait_idle, 60.0)
    store._index_conns.close_all()
    _index.words_path(store.path_for("a")).unlink()
    old = sqlite3.connect(index_of(store), isolation_level=None)
    old.execute("CREATE VIRTUAL TABLE fts USING fts5(body, ids, content='')")  # as version 5 had it
    old.execute("UPDATE meta SET v = 5 WHERE k = 'version'")
    old.close()
    events.clear()
    assert [r.seq for r in await store.search("a", "word3", 50)] == expected
    reasons = [e.data["reason"] for e in events if e.kind == JOURNAL_INDEX_REBUILT]
    assert len(reasons) == 1 and "version 5" in reasons[0]
    tables = sqlite3.connect(index_of(store)).execute("SELECT name FROM sqlite_master").fetchall()
    assert ("fts",) not in tables
    assert _index.words_path(store.path_for("a")).exists()


def _line(obj: dict[str, Any] | None = None, raw: bytes | None = None) -> bytes:
    """A journal message line with a right checksum, from `obj` (or the JSON `raw`)."""
    import zlib

    import orjson

    body = raw if raw is not None else orjson.dumps(obj)
    core = body[:-1]
    return core + b',"crc":"%08x"}' % zlib.crc32(core[len(b'{"message":') :])


_GOOD = {
    "message": {"id": "m1", "role": "user", "content": "hello src/a_b/mod-7.py"},
    "compaction": 1,
    "ts": 1.5,
    "seq": 3,
    "attempt": "kd02e7dbf0940bc1f",
    "journal": "j508d01c508107743",
}


@pytest.mark.parametrize(
    ("change", "where", "value"),
    [
        (None, None, None),
        ("message", "tool_calls", None),
        ("message", "metadata", None),
        ("message", "tool_calls", []),
        ("message", "tool_calls", [1]),
        ("message", "tool_calls", [{"name": "read", "arguments": {"path": "src/x.py"}}]),
        ("message", "tool_calls", [{"name": 7}]),
        ("message", "tool_calls", [{"name": "read", "arguments": {"path": "src/x.py"}}, {"id": "c1", "name": "x"}]),
        ("message", "tool_calls", [{"id": "c1", "name": "read", "arguments": "not a mapping"}]),
        ("message", "tool_calls", [{"id": "c1", "name": "a"}, {"id": "c1", "name": "b"}]),
        ("message", "role", "bogus"),
        ("message", "role", "tool"),
        ("message", "tool_call_id", "c1"),
        ("message", "is_error", "yes"),
        ("message", "usage", {"input_tokens": -1}),
        ("message", "usage", {"input_tokens": 3, "output_tokens": 4}),
        ("message", "id", ""),
        ("message", "extra", 1),
        ("message", "content", ["x"]),
        ("message", "content", None),
        ("message", "id", 5),
        ("message", "metadata", {"cmdc.kind": "summary", "cmdc.attempts": ["kd02e7dbf0940bc1f", "bad", 3]}),
        ("message", "metadata", {"cmdc.kind": "summary", "cmdc.attempts": None}),
        ("message", "metadata", []),
        ("record", "seq", True),
        ("record", "seq", 3.0),
        ("record", "seq", 0),
        ("record", "ts", "1"),
        ("record", "ts", True),
        ("record", "compaction", -1),
        ("record", "compaction", None),
        ("record", "attempt", 5),
        ("record", "attempt", ["k"]),
        ("record", "attempt", None),
        ("record", "journal", "not-an-id"),
        ("record", "extra", 1),
        ("record", "message", ["x"]),
        ("record", "message", None),
        ("tool", "tool_call_id", "c1"),
        ("tool", "tool_call_id", ""),
        ("tool", "tool_call_id", None),
        ("tool", "is_error", True),
        ("tool", "is_error", None),
        ("tool", "is_error", 1),
        ("message", "is_error", False),
        ("message", "role", "system"),
        ("message", "content", "x" * 70_000),
        ("message", "content", "\u0000 and \ud7ff"),
        ("record", "seq", 2**63),
        ("record", "seq", 2**62 + 1),  # past the highest record number (`MAX_SEQ`)
        ("record", "seq", "past u64"),
        ("record", "compaction", 2**63),
        ("record", "ts", 7),
        ("record", "ts", -0.0),
    ],
)
def test_the_fast_line_decoder_accepts_only_what_the_journals_decoder_reads_alike(
    change: str | None, where: str | None, value: Any
) -> None:
    """`_fast_record` (every line of a rebuild) may pass a line on to the journal's own
    decoder (None), but what it accepts, the decoder reads too, with the same fields: odd JSON
    types, nulls, unknown keys and bad ids never get into the index through the fast path."""
    import copy

    from cmdc.errors import OffloadCorrupted
    from cmdc.store.file.scan import _decode_at, _summary_attempts
    from cmdc.store.search import TEXT_CHARS, record_text

    obj = copy.deepcopy(_GOOD)
    if change == "tool":  # a tool's result, then the change
        obj["message"] |= {"role": "tool", "tool_call_id": "c9", where: value}
    if change == "message":
        obj["message"][where] = value
    elif change == "record":
        obj[where] = value
    lines = [_line(obj)]
    if value == "past u64":  # a number orjson reads as a float (the journal's decoder refuses it)
        obj["seq"] = 1
        lines = [_line(raw=orjson.dumps(obj).replace(b'"seq":1', b'"seq":99999999999999999999999'))]
    if change is None:  # a key twice (JSON keeps the last) and a legacy line (no attempt)
        first = b'{"message":{"id":"m1","role":"user","content":"a"},"message":5,'
        twice = first + _line(obj)[len(b'{"message":') + 1 :]
        legacy = {k: v for k, v in obj.items() if k not in ("attempt", "journal")}
        lines += [_line(raw=twice[: twice.rindex(b',"crc"')] + b"}"), _line(legacy)]
    for data, read in itertools.product(lines, (_index._fast_record, _index._typed_record)):
        fast = read(data, memoryview(data), 0, len(data), {})
        try:
            decoded, _ = _decode_at(data, 0, len(data), "here", TEXT_CHARS)
        except OffloadCorrupted:
            decoded = None
        if fast is None:
            continue
        assert decoded is not None and decoded.kind == "message" and decoded.record is not None, data
        r = decoded.record
        assert fast[:5] == (decoded.seq, r.message.id, r.attempt, r.compaction, r.message.is_summary)
        assert fast[5] == record_text(r.message)
        assert fast[7] == tuple(_summary_attempts(r.message))
    if change is None or (change == "tool" and (value is True or value == "c1")):  # both read the common shapes
        for read in (_index._fast_record, _index._typed_record):
            assert read(lines[0], memoryview(lines[0]), 0, len(lines[0]), {}) is not None


@pytest.mark.parametrize(
    "hostile",
    [
        (',"metadata":null', '"ATTEMPT"', '"JOURNAL"'),  # the journal's decoder: metadata must be an object
        (',"tool_calls":null', '"ATTEMPT"', '"JOURNAL"'),  # tool_calls must be a list
        (',"metadata":{"cmdc.kind":"summary"},"metadata":null', '"ATTEMPT"', '"JOURNAL"'),  # the last one counts
        ("", '"ATTEMPT"', '["JOURNAL"]'),  # a journal id that is not a text (nor hashable)
        ("", '"ATTEMPT"', '{"j": 1}'),
        ("", '["ATTEMPT"]', '"JOURNAL"'),
    ],
)
async def test_a_hand_made_line_with_a_valid_checksum_is_indexed_as_the_journal_reads_it(
    tmp_path: Path, hostile: tuple[str, str, str]
) -> None:
    """A line whose checksum is right but whose fields the journal's decoder refuses (a damaged
    line to a whole read) is skipped by the build as by a scan: not indexed as a record, and no
    error out of the read that builds the index."""
    import zlib

    extra, attempt, journal = hostile
    store = OffloadStore(tmp_path, index=False)
    first = await store.append("a", batch(3), compaction=1)
    assert first.journal is not None and first.attempt is not None
    attempt = attempt.replace("ATTEMPT", first.attempt)
    journal = journal.replace("JOURNAL", first.journal)
    body = (
        '{"id":"mhostile","role":"user","content":"hostile zebra"' + extra + "},"
        f'"compaction":1,"ts":1.5,"seq":{first.last_seq + 1},"attempt":{attempt},"journal":{journal}'
    ).encode()
    path = store.path_for("a")
    path.write_bytes(path.read_bytes() + b'{"message":' + body + b',"crc":"%08x"}\n' % zlib.crc32(body))
    scanned = await store.records("a")
    assert [r.seq for r in scanned] == [1, 2, 3]  # (the hand-made line is damaged to a whole read)
    indexed = OffloadStore(tmp_path)
    assert [r.seq for r in await indexed.read_range("a", 0, 100)] == [1, 2, 3]
    assert (await indexed.extent("a")).records == 3
    assert await indexed.search("a", "zebra") == []
    assert (await indexed.check_index("a")).ok


async def test_a_words_file_sqlite_makes_in_a_race_with_a_remover_is_made_0600(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The words' file removed (by another process's `remove`, say) between the moment it is
    made 0600 and the moment it is attached: SQLite's ATTACH makes an empty one with the
    umask's mode. The next reader that writes its tables makes it 0600 first, its journal
    too: the words of the records are never readable by another user."""
    store = OffloadStore(tmp_path, index=False)
    await store.append("a", batch(10), compaction=1)
    opened = _index._opened
    raced: list[Path] = []

    def racing(path: Path, *args: Any, **kwargs: Any) -> Any:
        conn = opened(path, *args, **kwargs)
        if path.name.endswith(_index.WORDS_SUFFIX) and not raced:
            raced.append(path)
            os.unlink(path)  # removed right after it was made, before it is attached
        return conn

    monkeypatch.setattr(_index, "_opened", racing)
    old = os.umask(0o022)
    try:
        indexed = OffloadStore(tmp_path)
        for _ in range(2):
            assert [r.seq for r in await indexed.search("a", "item7", 3)] == [8]
    finally:
        os.umask(old)
    assert raced
    extras = [n for n in os.listdir(tmp_path) if n.startswith("a.jsonl.")]
    assert "a.jsonl.words" in extras
    for extra in extras:
        assert stat.S_IMODE(os.stat(tmp_path / extra).st_mode) == 0o600, extra
    assert (await indexed.check_index("a")).ok


async def test_an_index_ahead_of_an_older_end_of_the_journal_is_not_rebuilt(tmp_path: Path) -> None:
    """The background indexer takes the journal's end without its lock; meanwhile the journal
    grows and a reader (this process's or another's) indexes past that end. The indexer's
    catch-up then finds the mark past its end: the index is ahead, not stale (the journal is
    not shorter), and is left as it is, with no event."""
    store = OffloadStore(tmp_path, index=False)
    await store.append("a", batch(10), compaction=1)
    path = store.path_for("a")
    older = path.stat().st_size  # the end the indexer took
    await store.append("a", batch(10, 10), compaction=2)
    reader = OffloadStore(tmp_path)
    assert [r.seq for r in await reader.search("a", "item15")] == [16]  # indexed to the new end
    events: list[tuple[str, dict[str, Any]]] = []
    conn = _index.connect(path, events)
    fd = os.open(path, os.O_RDONLY)
    try:
        _index.catch_up(conn, fd, path, older, events)
        mark = conn.execute("SELECT v FROM meta WHERE k = 'mark'").fetchone()[0]
    finally:
        os.close(fd)
        conn.close()
    assert events == []
    assert mark == path.stat().st_size


async def test_an_index_removed_right_after_it_was_opened_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process removes the index between its opening and the look at its file: the
    search reads the journal this time (no error, no connection left open), and the next one
    builds the index again."""
    store = OffloadStore(tmp_path)
    await store.append("a", batch(20), compaction=1)
    assert await trio.to_thread.run_sync(store._indexer.wait_idle, 60.0)
    store._index_conns.close_all()
    real = _index.connect
    opened: list[Any] = []

    def connect_then_removed(journal: Path, *args: Any) -> Any:
        conn = real(journal, *args)
        opened.append(conn)
        if len(opened) == 1:
            _index.remove(journal)
        return conn

    monkeypatch.setattr(_index, "connect", connect_then_removed)
    assert [r.seq for r in await store.search("a", "item7", 3)] == [8]
    import sqlite3

    with pytest.raises(sqlite3.ProgrammingError):  # closed, not leaked
        opened[0].execute("SELECT 1")
    assert [r.seq for r in await store.search("a", "item9", 3)] == [10]
    assert index_of(store).exists() and (await store.check_index("a")).ok


async def test_check_index_is_not_fooled_by_an_append_during_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append between `check_index`'s read of the journal and its look at the index makes
    the counts differ: the journal is read again and the index is found right (not removed and
    rebuilt). A journal that keeps growing past the last read is still compared then."""
    events: list[Event] = []
    store = OffloadStore(tmp_path, on_event=events.append)
    await store.append("a", batch(20), compaction=1)
    real = store.verify
    appended: list[int] = []

    async def verify_then_append(agent_id: str) -> Any:
        report = await real(agent_id)
        if len(appended) < 2:  # after the first two reads: one more batch each time
            appended.append(1)
            await store.append(agent_id, batch(3, 100 + 10 * len(appended)), compaction=1 + len(appended))
        return report

    monkeypatch.setattr(store, "verify", verify_then_append)
    events.clear()
    report = await store.check_index("a")
    assert report.ok and not report.rebuilt and report.records == 26, report
    assert not [e for e in events if e.kind == JOURNAL_INDEX_REBUILT]
    appended.clear()
    from cmdc.store.file import journal

    monkeypatch.setattr(journal, "_CHECK_TRIES", 1)  # one read, as before: the append after it is blamed on the index
    report = await store.check_index("a")
    assert not report.ok and "the index counts" in report.problems[0] and report.rebuilt


async def test_an_index_built_without_json_reads_as_a_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every statement the build sends over JSON (words, records, lookups by id, visibility)
    falls back to rows when JSON cannot carry its values: the index built that way, with
    summaries, commits across chunks and re-appended messages, reads as a scan does."""
    monkeypatch.setattr(_index, "_as_json", lambda values: None)
    monkeypatch.setattr(_index, "_CHUNK", 700)  # many chunks: batches committed in a later one
    store = OffloadStore(tmp_path, index=False)
    first = batch(30)
    await store.append("a", first, compaction=1)
    pending = await store.append("a", batch(20, 30), attempt=new_attempt_id(), commit=False, compaction=2)
    await store.append("a", [*first[:5], *batch(10, 60)], compaction=3)  # five re-appended
    await store.commit("a", pending.pending)
    scanned = [(r.seq, r.message.id) for r in await store.records("a")]
    indexed = OffloadStore(tmp_path)
    assert [(r.seq, r.message.id) for r in await indexed.read_range("a", 0, 10_000)] == scanned
    assert [r.seq for r in await indexed.search("a", "item65", 3)] == [
        r.seq for r in await store.search("a", "item65", 3)
    ]
    assert (await indexed.extent("a")).compactions == (await store.extent("a")).compactions
    assert (await indexed.check_index("a")).ok


_ODD = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2**63, 2**64 - 1, 1.5, -0.0, 7.0]),
    st.sampled_from(["", "c1", "user", "tool", "assistant", "system", "x\u0000y", "kd02e7dbf0940bc1f"]),
    st.lists(st.integers(0, 1), max_size=1), st.dictionaries(st.sampled_from(["a"]), st.integers(0, 1), max_size=1),
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["id", "role", "content", "tool_call_id", "is_error", "extra"]), _ODD, max_size=6),
    st.dictionaries(st.sampled_from(["compaction", "ts", "seq", "attempt", "journal"]), _ODD, max_size=3),
)
def test_the_typed_line_decoder_reads_only_what_the_journals_decoder_reads_alike(
    message: dict[str, Any], record: dict[str, Any]
) -> None:
    """`_typed_record` (msgspec) on a good line changed by any odd values: what it accepts, the
    journal's decoder reads with the same fields (or it returns None, and the slower paths
    decide)."""
    from cmdc.store.file.scan import _decode_at
    from cmdc.store.search import TEXT_CHARS, record_text

    obj: dict[str, Any] = {**_GOOD, "message": {**_GOOD["message"], **message}, **record}
    data = _line(obj)
    typed = _index._typed_record(data, memoryview(data), 0, len(data), {})
    if typed is None:
        return
    decoded, _ = _decode_at(data, 0, len(data), "here", TEXT_CHARS)
    assert decoded.kind == "message" and decoded.record is not None, data
    r = decoded.record
    assert typed[:6] == (decoded.seq, r.message.id, r.attempt, r.compaction, False, record_text(r.message))
    assert _index._fast_record(data, memoryview(data), 0, len(data), {}) == typed
